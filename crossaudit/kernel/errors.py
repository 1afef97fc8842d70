"""The one error hierarchy of CrossAudit.

Every failure a user can see is a :class:`CrossAuditError` subclass with a stable
``code`` and a ``retryable`` flag. Every subclass is declared HERE, and the drawn tree below
names each one: the codec (``crossaudit/kernel/errcodec.py``: the service, its clients, the
model servers) rebuilds an error that crossed a process boundary by its class name
(:func:`error_class`), and a peer that imports only the codec must know every name a server
can send, whatever modules raise it. A subclass declared in another module would decode as
its parent's status fallback in such a peer, so :func:`error_class` knows only this module's
classes and ``tests/unit/test_error_tree.py`` fails on any other. Extra constructor state
travels through ``wire_fields`` / :meth:`CrossAuditError.from_wire`. The CLI prints
``str(error)``. Nothing else should raise bare exceptions across a layer boundary. This
module stays transport-neutral.

::

    CrossAuditError                       code (gRPC status)       retryable
    ├── InvalidInputError                 invalid_argument
    │   ├── PolicyValidationError         (issues)
    │   ├── RequestTooLargeError          (size, limit, setting)
    │   ├── DependencyRejectedError
    │   ├── EvaluatorCodeError
    │   └── CassetteMismatchError         (a recorded-answers file for another policy version, or unreadable)
    ├── NotFoundError                     not_found
    ├── AlreadyExistsError                already_exists
    ├── UnauthenticatedError              unauthenticated
    ├── PermissionDeniedError             permission_denied
    ├── RateLimitedError                  resource_exhausted       yes
    │   └── PoolExhaustedError
    ├── QuotaExceededError                resource_exhausted                (setting)
    ├── DeadlineExceededError             deadline_exceeded
    ├── ConfigurationError                failed_precondition
    │   ├── ModelRequiredError            (field)
    │   └── DownloadError                 (a model file; entry stays local)
    ├── StoreUnavailableError             unavailable              yes
    ├── ServerUnavailableError            unavailable              yes      (client side: no answer)
    ├── ReviewAlreadyResolvedError        failed_precondition
    ├── DeliveryPendingError              failed_precondition
    ├── NotReplayableError                failed_precondition               (reason)
    ├── RetentionKeyError                 failed_precondition               (operator key missing or not the one)
    ├── RetainedInputsTamperedError       failed_precondition               (a retained row fails authentication)
    ├── CandidateStateError               failed_precondition
    ├── LogForkError                      failed_precondition               (the store lost what the server signed)
    └── EvaluatorError                    internal
        ├── EvaluatorTimeoutError         deadline_exceeded        yes
        ├── EvaluatorUnavailableError     unavailable              yes
        ├── ProviderError                 unavailable              per instance
        │   └── ResponseTooLargeError     (over engine_limits.max_llm_response_bytes)   no
        ├── CassetteMissError             not_found                no       (evaluator, digest: not recorded)
        └── SandboxError                  failed_precondition
            ├── SandboxCodeError
            ├── SandboxCrashedError
            │   └── ProtocolError         (the agent broke the protocol)
            ├── SandboxLimitError         (limit)
            ├── SandboxSecurityError
            └── ResultInvalidError
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, ClassVar


class ErrorCode(StrEnum):
    """Stable, transport-neutral error categories (mapped to gRPC codes in the service)."""

    INVALID_ARGUMENT = "invalid_argument"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    UNAUTHENTICATED = "unauthenticated"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    FAILED_PRECONDITION = "failed_precondition"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class CrossAuditError(Exception):
    """Base of every typed error. ``retryable`` tells retry loops whether to try again."""

    code: ErrorCode = ErrorCode.INTERNAL
    retryable: bool = False
    # Seconds the failing party asked us to wait before trying again (HTTP Retry-After); the
    # engine's one retry policy waits at least this long, within the deadline.
    retry_after: float | None = None
    # Attributes beyond message/retryable that cross process boundaries (JSON values).
    wire_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable

    def wire_data(self) -> dict[str, Any]:
        """The extra state of ``wire_fields``, as JSON-compatible values."""
        return {name: getattr(self, name, None) for name in self.wire_fields}

    @classmethod
    def from_wire(cls, message: str, data: Mapping[str, Any], retryable: bool | None = None) -> CrossAuditError:
        """Rebuild an error that crossed a process boundary. Subclass constructors take other
        arguments (``SandboxLimitError(limit, message)``), so none of them is called here."""
        exc = cls.__new__(cls)
        CrossAuditError.__init__(exc, message, retryable=retryable)
        for name in cls.wire_fields:
            value = data.get(name)
            if isinstance(value, str | int | float | bool):  # scalars only; richer state needs an override
                setattr(exc, name, value)
        return exc


# --- policy / input errors -------------------------------------------------------------


@dataclass(frozen=True)
class PolicyIssue:
    """One problem found in a policy file, located as precisely as the source allows."""

    message: str
    path: str = ""  # field path such as ``rules[2].threshold``
    file: str = ""
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based

    def location(self) -> str:
        where = self.file or "<policy>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where

    def __str__(self) -> str:
        field = f" {self.path}:" if self.path else ""
        return f"{self.location()}:{field} {self.message}"


class InvalidInputError(CrossAuditError):
    """A request or argument is malformed."""

    code = ErrorCode.INVALID_ARGUMENT


class PolicyValidationError(InvalidInputError):
    """A policy failed to load or validate. Carries *every* issue found, not just the first."""

    wire_fields = ("issues",)

    def __init__(self, issues: list[PolicyIssue]) -> None:
        self.issues = list(issues)
        lines = "\n".join(str(i) for i in self.issues)
        super().__init__(f"policy is invalid ({len(self.issues)} issue(s)):\n{lines}")

    def wire_data(self) -> dict[str, Any]:
        return {"issues": [asdict(i) for i in self.issues]}

    @classmethod
    def from_wire(cls, message: str, data: Mapping[str, Any], retryable: bool | None = None) -> CrossAuditError:
        issues = [i for i in map(_issue_from_wire, data.get("issues") or ()) if i is not None]
        if not issues:  # never an "invalid" policy without a reason
            issues = [PolicyIssue(message=message)]
        exc = cls.__new__(cls)
        PolicyValidationError.__init__(exc, issues)
        if retryable is not None:
            exc.retryable = retryable
        return exc


def _issue_from_wire(doc: Any) -> PolicyIssue | None:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("message"), str):
        return None

    def text(key: str) -> str:
        v = doc.get(key)
        return v if isinstance(v, str) else ""

    def number(key: str) -> int | None:
        v = doc.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return PolicyIssue(text("message"), text("path"), text("file"), number("line"), number("column"))


class RequestTooLargeError(InvalidInputError):
    """A request is larger than the named limit (``limits.max_request_bytes``) of whoever
    refuses it: the CLI or SDK before sending, the server, the guard proxy. Retrying cannot
    help; the message names the setting and its value so the user knows what to raise."""

    wire_fields = ("size", "limit", "setting")
    size: int | None = None  # bytes of the refused request (None: not measured, e.g. a stream read in part)
    limit: int | None = None
    setting: str = ""

    def __init__(self, message: str, *, size: int | None = None, limit: int | None = None, setting: str = "") -> None:
        super().__init__(message)
        self.size, self.limit, self.setting = size, limit, setting


class CassetteMismatchError(InvalidInputError):
    """A recorded-answers directory (``--replay DIR``) holds no cassette for the policy version
    being run (it was recorded for another version), or a cassette file there is unreadable."""


class DependencyRejectedError(InvalidInputError):
    """A declared dependency string is malformed or not allowed."""


class EvaluatorCodeError(InvalidInputError):
    """Uploaded evaluator code does not compile or lacks ``evaluate(prompt, response, context)``."""


class NotFoundError(CrossAuditError):
    code = ErrorCode.NOT_FOUND


class AlreadyExistsError(CrossAuditError):
    code = ErrorCode.ALREADY_EXISTS


class UnauthenticatedError(CrossAuditError):
    code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(CrossAuditError):
    code = ErrorCode.PERMISSION_DENIED


class RateLimitedError(CrossAuditError):
    """A rate limit or queue bound was hit; trying later may succeed."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    retryable = True


class QuotaExceededError(CrossAuditError):
    """A tenant reached a named quota or cap (``setting``: its settings key, also in the
    message). Not retryable as such: the same request fails until the tenant's own backlog
    shrinks or the operator raises the setting, so a retry loop must not hammer it."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    wire_fields = ("setting",)
    setting: str = ""

    def __init__(self, message: str, *, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting


class DeadlineExceededError(CrossAuditError):
    """The caller's deadline ran out before a decision could be made."""

    code = ErrorCode.DEADLINE_EXCEEDED


class ConfigurationError(CrossAuditError):
    """The platform is misconfigured (missing model path, no Docker daemon when required, ...)."""

    code = ErrorCode.FAILED_PRECONDITION


class ModelRequiredError(ConfigurationError):
    """Resolution found no model and the config cannot be served without one (e.g. Presidio's
    PERSON with no spaCy NER pipeline). Unlike a missing or broken file, which fails when it
    loads, this is known before any call, so policy validation and deploy report it at
    ``field`` of the evaluator's config (see :func:`crossaudit.modelserver.builtins.model_problem`).
    Raised by the model servers, decoded by their pool and the service's clients."""

    wire_fields = ("field",)
    field: str = ""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class DownloadError(ConfigurationError):
    """A model file could not be downloaded (or was not what its source publishes). ``entry``:
    the store entry (name, variant) being pulled, when known, so a caller can say how to add that
    entry without a download (``crossaudit models import``). ``entry`` is not a wire field: the
    CLI reads it where the download ran."""

    entry: tuple[str, str] | None = None


class NotReplayableError(CrossAuditError):
    """A recorded decision cannot be re-evaluated faithfully under a candidate policy (replay):
    ``reason`` is a stable code (``orchestrator.engine.replay.Unreplayable``) that replay counts
    decisions by. The message names evaluators, never the decision's text."""

    code = ErrorCode.FAILED_PRECONDITION
    wire_fields = ("reason",)
    reason: str = ""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StoreUnavailableError(CrossAuditError):
    """The database cannot be used right now (closed, locked, disk full, I/O error)."""

    code = ErrorCode.UNAVAILABLE
    retryable = True


class ServerUnavailableError(CrossAuditError):
    """A client got no answer from the CrossAudit server: nothing listens at the address, the
    name does not resolve, TLS does not match, or the connection broke. Raised by the SDK (never
    sent by a server); the message says what to check. Retryable: a server that is starting or
    restarting may answer the next call. (Before it existed, the SDK raised
    ``EvaluatorUnavailableError`` for this; that class now means an evaluator's runner only.)"""

    code = ErrorCode.UNAVAILABLE
    retryable = True
    wire_fields = ("address",)
    address: str = ""  # the server address the client was given

    def __init__(self, message: str, *, address: str = "") -> None:
        super().__init__(message)
        self.address = address


class ReviewAlreadyResolvedError(CrossAuditError):
    """A review was resolved before; its resolution is immutable."""

    code = ErrorCode.FAILED_PRECONDITION


class DeliveryPendingError(CrossAuditError):
    """A webhook or decision-log message is still pending: there is nothing to redeliver yet."""

    code = ErrorCode.FAILED_PRECONDITION


class RetentionKeyError(CrossAuditError):
    """Retained inputs need an operator key that is not configured, or a tenant's data key is
    wrapped by another operator key than the ones configured (docs/retention.md). The message
    names key ids, never key material."""

    code = ErrorCode.FAILED_PRECONDITION


class RetainedInputsTamperedError(CrossAuditError):
    """A retained row (or a wrapped tenant key) failed AES-GCM authentication: altered, or moved
    to another tenant or decision. Never answered as garbage; the message names the decision only."""

    code = ErrorCode.FAILED_PRECONDITION


class LogForkError(CrossAuditError):
    """A tenant's decision log in the store is not an extension of the newest checkpoint this
    server signed (that checkpoint deleted, or the records under it rewritten): the server signs
    nothing more of that log, since a new checkpoint would vouch for the altered history."""

    code = ErrorCode.FAILED_PRECONDITION


class CandidateStateError(CrossAuditError):
    """A shadow or canary candidate cannot start or end in its policy's current state (one is
    already running, none is running, or it is the version already active)."""

    code = ErrorCode.FAILED_PRECONDITION


# --- evaluator errors --------------------------------------------------------------------


class EvaluatorError(CrossAuditError):
    """An evaluator could not produce a result. The engine turns it into an ``error`` result."""

    code = ErrorCode.INTERNAL


class EvaluatorTimeoutError(EvaluatorError):
    """The evaluator did not answer within its deadline (it was killed)."""

    code = ErrorCode.DEADLINE_EXCEEDED
    retryable = True


class EvaluatorUnavailableError(EvaluatorError):
    """A runner, model server or provider is temporarily unreachable."""

    code = ErrorCode.UNAVAILABLE
    retryable = True


class ProviderError(EvaluatorError):
    """An LLM provider answered with an error or an unusable completion."""

    code = ErrorCode.UNAVAILABLE


class ResponseTooLargeError(ProviderError):
    """A provider's answer went over ``engine_limits.max_llm_response_bytes``: not retryable, the
    same endpoint would send the same body again."""

    retryable = False


class CassetteMissError(EvaluatorError):
    """Replaying recorded LLM answers (``--replay DIR``): the request an LLM evaluator would send
    was not recorded. Names the evaluator and the request's digest; never retryable (the same
    request misses again)."""

    code = ErrorCode.NOT_FOUND
    retryable = False
    wire_fields = ("evaluator", "digest")
    evaluator: str = ""
    digest: str = ""

    def __init__(self, message: str, *, evaluator: str = "", digest: str = "") -> None:
        super().__init__(message)
        self.evaluator, self.digest = evaluator, digest


class SandboxError(EvaluatorError):
    """Custom code failed inside the sandbox (raised, crashed, or broke a limit)."""

    code = ErrorCode.FAILED_PRECONDITION


class SandboxCodeError(SandboxError):
    """The user's ``evaluate`` raised an exception (the message carries its type and text)."""


class SandboxCrashedError(SandboxError):
    """The sandboxed process died without delivering a result (signal, ``os._exit``, ...)."""


class ProtocolError(SandboxCrashedError):
    """The agent broke the protocol (bad JSON, oversized line, wrong frame): treat as a crash."""


class SandboxLimitError(SandboxError):
    """A resource limit was hit: memory, processes, output bytes, result bytes, file size."""

    wire_fields = ("limit",)
    limit: str = "unknown"

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class SandboxSecurityError(SandboxError):
    """The code tried something the sandbox forbids (restricted attribute, import, ...)."""


class ResultInvalidError(SandboxError):
    """The evaluator returned something that is not a valid result document."""


class PoolExhaustedError(RateLimitedError):
    """Every warm sandbox of an evaluator stayed busy until the deadline."""


def _declared_here() -> dict[str, type[CrossAuditError]]:
    """This module's error classes by name: the codec's whole vocabulary. Built from the classes
    declared above rather than registered on subclassing, so what a peer can decode never
    depends on which other modules it happened to import."""
    found: dict[str, type[CrossAuditError]] = {CrossAuditError.__name__: CrossAuditError}
    todo: list[type[CrossAuditError]] = [CrossAuditError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__ == __name__ and sub.__name__ not in found:
                found[sub.__name__] = sub
                todo.append(sub)
    return found


_REGISTRY: dict[str, type[CrossAuditError]] = _declared_here()


def error_class(name: str) -> type[CrossAuditError] | None:
    """The CrossAuditError class called ``name`` (None when this module declares none)."""
    return _REGISTRY.get(name)


def error_classes() -> dict[str, type[CrossAuditError]]:
    """Every error class by name (those declared in this module)."""
    return dict(_REGISTRY)
