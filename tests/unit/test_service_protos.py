"""The committed gRPC stubs are fresh, and importable as ``crossaudit.v1``."""

from __future__ import annotations

import importlib

from tools import generate_protos as generate


def test_committed_stubs_are_fresh() -> None:
    assert generate.stale_files() == [], "run `make proto` and commit the regenerated stubs"


def test_the_proto_sources_are_in_protos_only() -> None:
    sources = generate.proto_files()
    assert sources and all(generate.PROTO_ROOT in p.parents for p in sources)
    assert not list((generate.REPO_ROOT / "crossaudit").rglob("*.proto"))  # one copy


def test_every_proto_has_importable_stubs() -> None:
    for proto in generate.proto_files():
        for suffix in ("_pb2", "_pb2_grpc"):
            importlib.import_module(f"crossaudit.v1.{proto.stem}{suffix}")


def test_public_services_are_in_package_crossaudit_v1() -> None:
    from crossaudit.v1 import audit_pb2, evaluation_pb2, evaluator_pb2, policy_pb2, review_pb2

    names = {
        s.full_name
        for mod in (audit_pb2, evaluation_pb2, evaluator_pb2, policy_pb2, review_pb2)
        for s in mod.DESCRIPTOR.services_by_name.values()
    }
    assert names == {
        "crossaudit.v1.AuditService",
        "crossaudit.v1.EvaluationService",
        "crossaudit.v1.EvaluatorService",
        "crossaudit.v1.PolicyService",
        "crossaudit.v1.ReviewService",
    }
