"""The ONE map from CrossAudit errors to gRPC status codes (server) and back (client).

Invalid policies carry ``google.rpc.BadRequest`` field violations (one per issue, with the
``file:line:col`` message) in the status details, through grpcio-status.
"""

from __future__ import annotations

import re
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from orchestrator import errors as E
from orchestrator.errors import CrossAuditError, ErrorCode, PolicyIssue, PolicyValidationError

GRPC_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}
ERROR_CODE: dict[grpc.StatusCode, ErrorCode] = {v: k for k, v in GRPC_CODE.items()}

# The client rebuilds these typed errors from a status code.
_CLIENT_ERROR: dict[ErrorCode, type[CrossAuditError]] = {
    ErrorCode.INVALID_ARGUMENT: E.InvalidInputError,
    ErrorCode.NOT_FOUND: E.NotFoundError,
    ErrorCode.ALREADY_EXISTS: E.AlreadyExistsError,
    ErrorCode.PERMISSION_DENIED: E.PermissionDeniedError,
    ErrorCode.UNAUTHENTICATED: E.UnauthenticatedError,
    ErrorCode.RESOURCE_EXHAUSTED: E.RateLimitedError,
    ErrorCode.DEADLINE_EXCEEDED: E.DeadlineExceededError,
    ErrorCode.FAILED_PRECONDITION: E.ConfigurationError,
    ErrorCode.UNAVAILABLE: E.EvaluatorUnavailableError,
    ErrorCode.INTERNAL: CrossAuditError,
}
RETRYABLE_KEY = "crossaudit-retryable"
ERROR_TYPE_KEY = "crossaudit-error-type"
INTERNAL_MESSAGE = "internal error (see the server log)"


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, CrossAuditError):
        return GRPC_CODE.get(exc.code, grpc.StatusCode.INTERNAL)
    return grpc.StatusCode.INTERNAL


def to_status(exc: BaseException) -> grpc.Status:
    """A ``grpc.Status`` (with rich details) for any exception; untyped ones become INTERNAL
    with a generic message so that no traceback or internal detail reaches a user."""
    code = grpc_code(exc)
    message = exc.message if isinstance(exc, CrossAuditError) else INTERNAL_MESSAGE
    st = status_pb2.Status(code=code.value[0], message=message)
    if isinstance(exc, PolicyValidationError):
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=i.path or "policy", description=str(i))
                for i in exc.issues
            ]
        )
        detail = any_pb2.Any()
        detail.Pack(bad)
        st.details.append(detail)
        # the message stays one readable paragraph; details are the machine-readable form
        st.message = f"policy is invalid ({len(exc.issues)} issue(s)): " + "; ".join(str(i) for i in exc.issues)
    status = rpc_status.to_status(st)
    retryable = bool(getattr(exc, "retryable", False))
    extra: tuple[tuple[str, str], ...] = ((RETRYABLE_KEY, "1" if retryable else "0"),)
    if isinstance(exc, CrossAuditError):
        extra += ((ERROR_TYPE_KEY, type(exc).__name__),)
    return _Status(status.code, status.details, tuple(status.trailing_metadata) + extra)


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    await context.abort_with_status(to_status(exc))
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


# --- client side ------------------------------------------------------------------------


def _metadata_value(md: object, key: str) -> str | bytes | None:
    for item in md or ():  # type: ignore[attr-defined]
        k, v = (item.key, item.value) if hasattr(item, "key") else item
        if k == key:
            return v
    return None


def from_rpc_error(err: grpc.RpcError) -> CrossAuditError:
    """Rebuild the typed error a server raised (PolicyValidationError with its issues)."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else ""
    trailing = err.trailing_metadata() if callable(getattr(err, "trailing_metadata", None)) else ()
    error_code = ERROR_CODE.get(code)
    raw = _metadata_value(trailing, "grpc-status-details-bin")
    if raw and error_code is ErrorCode.INVALID_ARGUMENT:
        st = status_pb2.Status.FromString(raw)
        for detail in st.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                return PolicyValidationError([_issue(v.field, v.description) for v in bad.field_violations])
    if error_code is None:
        if code is grpc.StatusCode.CANCELLED:
            return E.CrossAuditError("the call was cancelled")
        return E.EvaluatorUnavailableError(f"server unavailable or failed ({code.name}): {details or 'no details'}")
    if error_code is ErrorCode.UNAVAILABLE:
        return E.EvaluatorUnavailableError(f"server unavailable: {details or 'no details'}")
    retryable = _metadata_value(trailing, RETRYABLE_KEY)
    if retryable is None and code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (details or ""):
        # the transport's message size cap, not a rate limit: retrying cannot help
        return E.InvalidInputError(f"message too large: {details}")
    exc = _CLIENT_ERROR[error_code](details or code.name)
    if retryable is not None:
        exc.retryable = retryable in ("1", b"1")
    return exc


_LOCATED = re.compile(r"^(?P<file>[^\n]*?):(?P<line>\d+)(?::(?P<col>\d+))?: (?P<rest>.*)$", re.S)


def _issue(field: str, description: str) -> PolicyIssue:
    """Parse a field violation back into the issue the server formatted with ``str(issue)``."""
    path = "" if field == "policy" else field
    m = _LOCATED.match(description)
    if m:
        file, line, col, rest = m["file"], int(m["line"]), m["col"], m["rest"]
    else:
        loc, _, rest = description.partition(": ")
        file, line, col = loc, None, None
        if not rest:
            file, rest = "", description
    rest = rest.lstrip()
    if path and rest.startswith(f"{path}: "):
        rest = rest[len(path) + 2 :]
    return PolicyIssue(
        message=rest,
        path=path,
        file="" if file == "<policy>" else file,
        line=line,
        column=int(col) if col else None,
    )


assert grpc.StatusCode.INVALID_ARGUMENT.value[0] == code_pb2.INVALID_ARGUMENT
