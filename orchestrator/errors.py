"""The one error hierarchy of CrossAudit.

Every failure a user can see is a :class:`CrossAuditError` subclass with a stable
``code`` and a ``retryable`` flag. The gRPC layer maps ``code`` to a status in one
place (``orchestrator/service/errors.py``); the CLI prints ``str(error)``. Nothing
else should raise bare exceptions across a layer boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable


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

    def __init__(self, issues: list[PolicyIssue]) -> None:
        self.issues = list(issues)
        lines = "\n".join(str(i) for i in self.issues)
        super().__init__(f"policy is invalid ({len(self.issues)} issue(s)):\n{lines}")


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


class DeadlineExceededError(CrossAuditError):
    """The caller's deadline ran out before a decision could be made."""

    code = ErrorCode.DEADLINE_EXCEEDED


class ConfigurationError(CrossAuditError):
    """The platform is misconfigured (missing model path, no Docker daemon when required, ...)."""

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


class SandboxError(EvaluatorError):
    """Custom code failed inside the sandbox (raised, crashed, or broke a limit)."""

    code = ErrorCode.FAILED_PRECONDITION


class SandboxCodeError(SandboxError):
    """The user's ``evaluate`` raised an exception (the message carries its type and text)."""


class SandboxCrashedError(SandboxError):
    """The sandboxed process died without delivering a result (signal, ``os._exit``, ...)."""


class SandboxLimitError(SandboxError):
    """A resource limit was hit: memory, processes, output bytes, result bytes, file size."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


class SandboxSecurityError(SandboxError):
    """The code tried something the sandbox forbids (restricted attribute, import, ...)."""


class ResultInvalidError(SandboxError):
    """The evaluator returned something that is not a valid result document."""


class PoolExhaustedError(RateLimitedError):
    """Every warm sandbox of an evaluator stayed busy until the deadline."""
