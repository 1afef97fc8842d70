"""The ONE codec of CrossAudit errors at every gRPC edge: the service and its clients
(``crossaudit/api/errors.py``, ``crossaudit/sdk/client.py``), the model servers and their
pool (``crossaudit/modelserver/``). It imports grpc and ``crossaudit.kernel.errors`` but nothing
of the service, so a model server (whose image carries only ``kernel``, ``v1`` and
``modelserver``) and a bare client can use it.

A :class:`~crossaudit.kernel.errors.CrossAuditError` travels as

* the gRPC status of its ``code`` (:data:`STATUS_CODE`) with its message as the status details
  (lone surrogates replaced, clipped to :data:`MAX_MESSAGE_BYTES`: gRPC sends it as a header);
* trailing metadata :data:`ERROR_DOC_KEY`: the authoritative JSON document
  ``{"type": class name, "retryable": bool, "data": error.wire_data()}`` (at most
  :data:`MAX_DOCUMENT_BYTES`), plus :data:`ERROR_TYPE_KEY` / :data:`RETRYABLE_KEY` in plain text
  and, for a ``PolicyValidationError``, ``google.rpc.BadRequest`` field violations in
  ``grpc-status-details-bin`` for clients in other languages;
* inside a stream item (``ItemError``): the same code name, message and document.

Decoding rebuilds the class of the document's type name (``crossaudit.kernel.errors`` declares
every subclass, so importing this module is enough to know them all), with its retryable flag and
wire fields (``issues``, ``limit``, ``field``). An
unknown name, or a status without a document (the transport's own, a proxy's), becomes the
:class:`Fallback` class of the status code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NoReturn

import grpc

from crossaudit.kernel import errors as E
from crossaudit.kernel.errors import CrossAuditError, ErrorCode, PolicyIssue, PolicyValidationError

ERROR_DOC_KEY = "crossaudit-error-bin"  # JSON document ("-bin": binary metadata)
ERROR_TYPE_KEY = "crossaudit-error-type"  # class name, plain text
RETRYABLE_KEY = "crossaudit-retryable"  # "0" | "1"
STATUS_DETAILS_KEY = "grpc-status-details-bin"
INTERNAL_MESSAGE = "internal error (see the server log)"
# gRPC's default cap on received metadata is 8 KiB: message + document + BadRequest stay below.
MAX_MESSAGE_BYTES = 1024  # status message (UTF-8; percent-encoded on the wire)
MAX_DOCUMENT_BYTES = 1536  # the JSON document; policy issues beyond it are summarised
MAX_DOCUMENT_READ_BYTES = 64 * 1024  # a received document larger than this is ignored

STATUS_CODE: dict[ErrorCode, grpc.StatusCode] = {
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
ERROR_CODE: dict[grpc.StatusCode, ErrorCode] = {v: k for k, v in STATUS_CODE.items()}


@dataclass(frozen=True)
class Fallback:
    """What an edge makes of a status that names no known error class."""

    peer: str = "server"  # named in messages about the transport ("server unavailable: ...")
    classes: Mapping[grpc.StatusCode, type[CrossAuditError]] = field(
        default_factory=lambda: {
            grpc.StatusCode.INVALID_ARGUMENT: E.InvalidInputError,
            grpc.StatusCode.NOT_FOUND: E.NotFoundError,
            grpc.StatusCode.ALREADY_EXISTS: E.AlreadyExistsError,
            grpc.StatusCode.PERMISSION_DENIED: E.PermissionDeniedError,
            grpc.StatusCode.UNAUTHENTICATED: E.UnauthenticatedError,
            grpc.StatusCode.RESOURCE_EXHAUSTED: E.RateLimitedError,
            grpc.StatusCode.DEADLINE_EXCEEDED: E.DeadlineExceededError,
            grpc.StatusCode.FAILED_PRECONDITION: E.ConfigurationError,
            grpc.StatusCode.UNAVAILABLE: E.EvaluatorUnavailableError,
            grpc.StatusCode.INTERNAL: CrossAuditError,
        }
    )
    other: type[CrossAuditError] = E.EvaluatorUnavailableError  # UNKNOWN, UNIMPLEMENTED, ...
    # A peer that never answered (UNAVAILABLE or CANCELLED from the transport, no document):
    # None means the class of the status above.
    unreachable: type[CrossAuditError] | None = None


# The CrossAudit server, seen from its clients: no answer at all is a ServerUnavailableError
# (the SDK rewords it with the address and what to check).
SERVICE = Fallback(unreachable=E.ServerUnavailableError)


# --- text ------------------------------------------------------------------------------


def clean_text(text: Any, max_bytes: int | None = None) -> str:
    """``text`` as a string gRPC can carry: lone surrogates (which JSON can decode) become
    U+FFFD, and it is clipped to ``max_bytes`` UTF-8 bytes."""
    s = text if isinstance(text, str) else str(text)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if max_bytes is not None and len(s.encode("utf-8")) > max_bytes:
        s = s.encode("utf-8")[: max_bytes - 3].decode("utf-8", "ignore") + "..."
    return s


def _clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {clean_text(k): _clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_json(v) for v in value]
    return value


# --- encoding --------------------------------------------------------------------------


def _fit_issues(issues: list[PolicyIssue]) -> list[PolicyIssue]:
    """The first issues whose document fits the budget (the first one clipped when it alone does
    not fit, so a long message such as a model-resolution report is cut, never dropped), then
    one issue counting the rest."""
    budget = MAX_DOCUMENT_BYTES - 200  # type, flags and the summary issue
    kept: list[PolicyIssue] = []
    used = 0
    for issue in issues:
        clean = PolicyIssue(
            clean_text(issue.message), clean_text(issue.path), clean_text(issue.file), issue.line, issue.column
        )
        size = len(json.dumps(asdict(clean))) + 1
        message = clean.message
        while size > budget and message and not kept:
            message = message[: min(len(message) - 16, len(message) * (budget - 64) // size)]
            clean = replace(clean, message=message + " [...]")
            size = len(json.dumps(asdict(clean))) + 1
        if used + size > budget:
            break
        kept.append(clean)
        used += size
    if len(kept) < len(issues):
        kept.append(PolicyIssue(f"... and {len(issues) - len(kept)} more issue(s) (ValidatePolicy lists them all)"))
    return kept


def _wire_error(exc: BaseException) -> CrossAuditError:
    """The error as it is sent: untyped ones are INTERNAL with a generic message (no details leak)."""
    if not isinstance(exc, CrossAuditError):
        return CrossAuditError(INTERNAL_MESSAGE)
    if isinstance(exc, PolicyValidationError):
        fitted = PolicyValidationError.from_wire("", {"issues": [asdict(i) for i in _fit_issues(exc.issues)]})
        fitted.retryable = exc.retryable
        # one readable paragraph; the issues are the machine-readable form
        fitted.message = f"policy is invalid ({len(exc.issues)} issue(s)): " + "; ".join(str(i) for i in exc.issues)
        return fitted
    return exc


def document(exc: BaseException) -> dict[str, Any]:
    """The JSON document of an error (what :data:`ERROR_DOC_KEY` and ``ItemError.detail`` carry)."""
    err = _wire_error(exc)
    doc = {"type": type(err).__name__, "retryable": bool(err.retryable), "data": _clean_json(err.wire_data())}
    if len(_dumps(doc)) > MAX_DOCUMENT_BYTES:
        doc["data"] = {}  # the type and the flag matter most
    return doc


def _dumps(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True, allow_nan=False, default=str).encode()


def status_code(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, CrossAuditError):
        return STATUS_CODE.get(exc.code, grpc.StatusCode.INTERNAL)
    return grpc.StatusCode.INTERNAL


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[tuple[str, Any], ...]) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = trailing_metadata


def encode(exc: BaseException) -> grpc.Status:
    """The ``grpc.Status`` (code, message, trailing metadata) of any exception."""
    err = _wire_error(exc)
    code = status_code(err)
    message = clean_text(err.message, MAX_MESSAGE_BYTES)
    doc = document(err)
    metadata: list[tuple[str, Any]] = [
        (ERROR_DOC_KEY, _dumps(doc)),
        (ERROR_TYPE_KEY, doc["type"]),
        (RETRYABLE_KEY, "1" if doc["retryable"] else "0"),
    ]
    if isinstance(err, PolicyValidationError):
        rich = _bad_request(code, message, err.issues)
        if rich is not None:
            metadata.append((STATUS_DETAILS_KEY, rich))
    return _Status(code, message, tuple(metadata))


def _bad_request(code: grpc.StatusCode, message: str, issues: list[PolicyIssue]) -> bytes | None:
    """``google.rpc.Status`` with ``BadRequest`` field violations (one per issue), for clients in
    other languages; skipped where googleapis-common-protos is not installed (model servers)."""
    try:
        from google.protobuf import any_pb2
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:  # pragma: no cover - the service always has it
        return None
    bad = error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=i.path or "policy", description=str(i)) for i in issues
        ]
    )
    detail = any_pb2.Any()
    detail.Pack(bad)
    return status_pb2.Status(code=code.value[0], message=message, details=[detail]).SerializeToString()


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """End the RPC with ``exc`` encoded (raises, as ``context.abort`` does)."""
    await context.abort_with_status(encode(exc))
    raise AssertionError("unreachable")  # pragma: no cover - abort raises


def item_fields(exc: BaseException) -> dict[str, Any]:
    """Keyword arguments of a stream item's ``ItemError`` (code, message, retryable, error_type, detail)."""
    err = _wire_error(exc)
    doc = document(err)
    return {
        "code": status_code(err).name,
        "message": clean_text(err.message, MAX_MESSAGE_BYTES),
        "retryable": doc["retryable"],
        "error_type": doc["type"],
        "detail": _dumps(doc).decode(),
    }


# --- decoding --------------------------------------------------------------------------


def _metadata_value(metadata: Iterable[Any] | None, key: str) -> str | bytes | None:
    for item in metadata or ():
        k, v = (item.key, item.value) if hasattr(item, "key") else item
        if k == key:
            return v
    return None


def _parse_document(raw: str | bytes | None) -> dict[str, Any] | None:
    if not raw or len(raw) > MAX_DOCUMENT_READ_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value in ("1", b"1"):
        return True
    if value in ("0", b"0"):
        return False
    return None


def decode(
    code: grpc.StatusCode,
    details: str | None,
    metadata: Iterable[Any] | None = None,
    *,
    fallback: Fallback = SERVICE,
) -> CrossAuditError:
    """The typed error a peer encoded with :func:`encode` (or the fallback for ``code``)."""
    message = details or code.name
    doc = _parse_document(_metadata_value(metadata, ERROR_DOC_KEY))
    if doc is None:  # a peer that sent only the plain-text keys
        name = _metadata_value(metadata, ERROR_TYPE_KEY)
        flag = _metadata_value(metadata, RETRYABLE_KEY)
        if name is not None or flag is not None:
            doc = {"type": name.decode() if isinstance(name, bytes) else name, "retryable": _flag(flag)}
    if doc is not None:
        cls = E.error_class(doc["type"]) if isinstance(doc.get("type"), str) else None
        raw = doc.get("data")
        data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        retryable = _flag(doc.get("retryable"))
        if cls is None:
            cls = fallback.classes.get(code, fallback.other)
        return cls.from_wire(message, data, retryable)
    return _transport_error(code, message, fallback)


def _transport_error(code: grpc.StatusCode, message: str, fallback: Fallback) -> CrossAuditError:
    """A status no CrossAudit peer encoded: the transport's (deadline, size cap, connection) or a proxy's."""
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in message:
        return E.InvalidInputError(f"message too large: {message}")  # the size cap: retrying cannot help
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        cls = fallback.unreachable or fallback.classes.get(code)
        if cls is None:
            return CrossAuditError(f"the call to the {fallback.peer} was cancelled")
        return cls.from_wire(f"{fallback.peer} unavailable: {message}", {})
    cls = fallback.classes.get(code)
    if cls is None:
        return fallback.other.from_wire(f"{fallback.peer} unavailable or failed ({code.name}): {message}", {})
    return cls.from_wire(message, {})


def from_rpc_error(err: grpc.RpcError, *, fallback: Fallback = SERVICE) -> CrossAuditError:
    """The typed error behind a ``grpc.RpcError`` (blocking or aio)."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else ""
    trailing = err.trailing_metadata() if callable(getattr(err, "trailing_metadata", None)) else ()
    return decode(code or grpc.StatusCode.UNKNOWN, details, trailing, fallback=fallback)


def from_item(code: str, message: str, retryable: bool, error_type: str = "", detail: str = "") -> CrossAuditError:
    """The typed error of a stream item's ``ItemError``."""
    status = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
    if not isinstance(status, grpc.StatusCode):
        status = grpc.StatusCode.UNKNOWN
    metadata: list[tuple[str, str]] = [(RETRYABLE_KEY, "1" if retryable else "0")]
    if error_type:
        metadata.append((ERROR_TYPE_KEY, error_type))
    if detail:
        metadata.append((ERROR_DOC_KEY, detail))
    return decode(status, message, metadata)
