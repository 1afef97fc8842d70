"""The one error map: every ErrorCode has a status; typed errors survive the round trip."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from crossaudit.api.errors import GRPC_CODE, INTERNAL_MESSAGE, from_rpc_error, to_status
from crossaudit.kernel import errors as E
from crossaudit.kernel.errors import ErrorCode, PolicyIssue, PolicyValidationError


class FakeRpcError(grpc.RpcError):
    def __init__(self, status: grpc.Status) -> None:
        self._s = status

    def code(self) -> grpc.StatusCode:
        return self._s.code

    def details(self) -> str:
        return self._s.details

    def trailing_metadata(self) -> tuple:
        return self._s.trailing_metadata


def test_every_error_code_is_mapped_once() -> None:
    assert set(GRPC_CODE) == set(ErrorCode)
    assert len(set(GRPC_CODE.values())) == len(ErrorCode)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (E.NotFoundError("x"), grpc.StatusCode.NOT_FOUND),
        (E.PermissionDeniedError("x"), grpc.StatusCode.PERMISSION_DENIED),
        (E.RateLimitedError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (E.PoolExhaustedError("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (E.DeadlineExceededError("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (E.UnauthenticatedError("x"), grpc.StatusCode.UNAUTHENTICATED),
        (E.DependencyRejectedError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (E.EvaluatorCodeError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (E.ConfigurationError("x"), grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_typed_errors_map_to_their_status(exc: E.CrossAuditError, code: grpc.StatusCode) -> None:
    st = to_status(exc)
    assert st.code == code and st.details == "x"
    back = from_rpc_error(FakeRpcError(st))
    assert back.code is exc.code and back.retryable == exc.retryable


def test_untyped_errors_become_internal_without_details() -> None:
    st = to_status(KeyError("/secret/path"))
    assert st.code == grpc.StatusCode.INTERNAL and st.details == INTERNAL_MESSAGE


def test_invalid_policy_carries_bad_request_field_violations() -> None:
    issues = [
        PolicyIssue(
            "threshold must be between 0.0 and 1.0", path="rules[0].threshold", file="p.yaml", line=7, column=16
        ),
        PolicyIssue("a policy needs a name", file="p.yaml", line=1, column=1),
    ]
    st = to_status(PolicyValidationError(issues))
    assert st.code == grpc.StatusCode.INVALID_ARGUMENT
    raw = dict(st.trailing_metadata)["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("rules[0].threshold", "p.yaml:7:16: rules[0].threshold: threshold must be between 0.0 and 1.0"),
        ("policy", "p.yaml:1:1: a policy needs a name"),
    ]
    back = from_rpc_error(FakeRpcError(st))
    assert isinstance(back, PolicyValidationError) and back.issues == issues


def test_unavailable_and_unknown_codes_are_typed_for_the_client() -> None:
    err = from_rpc_error(FakeRpcError(to_status(E.EvaluatorUnavailableError("down"))))
    assert err.code is ErrorCode.UNAVAILABLE and err.retryable
