"""A client that knows no CrossAudit code: it discovers the API through gRPC server
reflection and builds messages from the served descriptors (descriptor_pool +
message_factory). Run as a script; reads a JSON job on stdin, prints a JSON report."""

from __future__ import annotations

import json
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

TIMEOUT_S = 30.0


class ReflectionClient:
    def __init__(self, address: str, api_key: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.db = ProtoReflectionDescriptorDatabase(self.channel)
        self.pool = descriptor_pool.DescriptorPool(self.db)
        self.metadata = (("authorization", f"Bearer {api_key}"),)

    def services(self) -> list[str]:
        return sorted(self.db.get_services())

    def _method(self, service: str, method: str):
        m = self.pool.FindServiceByName(service).FindMethodByName(method)
        req_cls = message_factory.GetMessageClass(m.input_type)
        resp_cls = message_factory.GetMessageClass(m.output_type)
        return m, req_cls, resp_cls

    def call(self, service: str, method: str, body: dict | list[dict]) -> dict | list[dict]:
        m, req_cls, resp_cls = self._method(service, method)
        path = f"/{service}/{method}"
        ser, de = req_cls.SerializeToString, resp_cls.FromString

        def to_msg(d: dict):
            return json_format.ParseDict(d, req_cls())

        def to_dict(msg) -> dict:
            return json_format.MessageToDict(
                msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            )

        kw = {"timeout": TIMEOUT_S, "metadata": self.metadata}
        if m.client_streaming and m.server_streaming:
            reqs = iter([to_msg(b) for b in body])  # type: ignore[union-attr]
            return [to_dict(r) for r in self.channel.stream_stream(path, ser, de)(reqs, **kw)]
        if m.server_streaming:
            return [to_dict(r) for r in self.channel.unary_stream(path, ser, de)(to_msg(body), **kw)]  # type: ignore[arg-type]
        return to_dict(self.channel.unary_unary(path, ser, de)(to_msg(body), **kw))  # type: ignore[arg-type]

    def call_error(self, service: str, method: str, body: dict) -> dict:
        try:
            self.call(service, method, body)
        except grpc.RpcError as e:
            return {"code": e.code().name, "details": e.details()}
        return {"code": "OK"}


def main() -> int:
    job = json.load(sys.stdin)
    c = ReflectionClient(job["address"], job["api_key"])
    report: dict = {"services": c.services()}
    ps, es, vs, rs = (
        f"crossaudit.v1.{n}" for n in ("PolicyService", "EvaluationService", "EvaluatorService", "ReviewService")
    )
    report["deploy"] = c.call(ps, "DeployPolicy", {"content": job["policy"], "environment": "production"})
    report["evaluate"] = c.call(
        es,
        "Evaluate",
        {
            "policy": job["policy_name"],
            "prompt": "hi",
            "response": "a bad answer",
            "context": {"user": {"role": "guest"}, "n": 3},
        },
    )
    report["stream"] = c.call(
        es,
        "EvaluateStream",
        [{"policy": job["policy_name"], "response": r, "request_id": r} for r in ("fine", "bad", "worse")],
    )
    report["upload"] = c.call(vs, "UploadEvaluator", {"name": "reflected", "code": job["code"]})
    report["reviews"] = c.call(rs, "ListReviews", {"state": "REVIEW_STATE_OPEN"})
    report["invalid"] = c.call_error(ps, "DeployPolicy", {"content": job["invalid_policy"]})
    report["unauthenticated"] = ReflectionClient(job["address"], "wrong-key-0123456789").call_error(
        ps, "ListPolicies", {}
    )
    ours = sorted(m for m in sys.modules if m.split(".")[0] in {"protos", "crossaudit", "orchestrator", "sandbox"})
    report["imported_project_modules"] = ours
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
