"""Every CrossAuditError class and one instance of each, for the error tests.

The classes are found by walking ``__subclasses__`` after importing every module of the product
packages, so a class added anywhere is covered (and, when declared outside
``crossaudit.kernel.errors``, caught) without editing a test. Classes whose constructor is not
``(message, *, retryable=None)`` need an entry in :data:`EXAMPLES`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import cache

from crossaudit.kernel import errors as E
from crossaudit.kernel.errors import CrossAuditError, PolicyIssue

PRODUCT_PACKAGES = ("orchestrator", "sandbox", "crossaudit")
ISSUES = [
    PolicyIssue("threshold must be between 0.0 and 1.0", path="rules[0].threshold", file="p.yaml", line=7, column=16),
    PolicyIssue("a policy needs a name", file="p.yaml", line=1, column=1),
    PolicyIssue("no location at all"),
]
EXAMPLES: dict[type[CrossAuditError], Callable[[], CrossAuditError]] = {
    E.PolicyValidationError: lambda: E.PolicyValidationError(ISSUES),
    E.SandboxLimitError: lambda: E.SandboxLimitError("memory", "evaluator used more than 128 MiB"),
    E.ModelRequiredError: lambda: E.ModelRequiredError(
        "presidio: entity PERSON needs a spaCy pipeline", field="entities"
    ),
    E.RequestTooLargeError: lambda: E.RequestTooLargeError(
        "the request is 9 bytes, over 4", size=9, limit=4, setting="limits.max_request_bytes"
    ),
    E.ServerUnavailableError: lambda: E.ServerUnavailableError("cannot reach 127.0.0.1:9", address="127.0.0.1:9"),
    E.QuotaExceededError: lambda: E.QuotaExceededError(
        "10000 webhooks pending, at most 10000", setting="delivery_limits.max_pending_per_tenant"
    ),
    E.NotReplayableError: lambda: E.NotReplayableError(
        "evaluator 'judge' (llm) changed: not called again without --rerun-llm", reason="llm_changed"
    ),
    E.CassetteMissError: lambda: E.CassetteMissError(
        "llm evaluator 'judge': request sha256:ab was not recorded", evaluator="judge", digest="sha256:ab"
    ),
}


@cache
def import_product_modules() -> tuple[str, ...]:
    """Import every module of the product packages (``__main__`` modules run commands: skipped)."""
    names = []
    for root in PRODUCT_PACKAGES:
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                importlib.import_module(info.name)
                names.append(info.name)
    return tuple(names)


def all_error_classes() -> list[type[CrossAuditError]]:
    """CrossAuditError and every subclass the product defines, parents first."""
    import_product_modules()
    out, todo = [CrossAuditError], [CrossAuditError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.split(".")[0] in PRODUCT_PACKAGES and sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def example(cls: type[CrossAuditError], retryable: bool | None = None) -> CrossAuditError:
    """An instance of ``cls`` built with its own constructor (non-ASCII text included)."""
    exc = EXAMPLES[cls]() if cls in EXAMPLES else cls(f"{cls.__name__} happened: naïve ✓")
    if retryable is not None:
        exc.retryable = retryable
    return exc
