"""The Python SDK: :class:`~crossaudit.sdk.client.Client` / ``AsyncClient`` (gRPC) and
:class:`~crossaudit.sdk.tester.PolicyTester` (in-process), with the models the clients answer:
the records (:mod:`crossaudit.api.records`) and the API models derived from them
(:mod:`crossaudit.api.models`), all from the wire layer: nothing here loads the service or the store.

Names load on first use (PEP 562), so importing ``crossaudit.sdk.tester`` does not pull in gRPC.
Each home is imported by a plain ``import`` statement, so the import contract sees every edge.
"""

from __future__ import annotations

from typing import Any

_CLIENT = ("Client", "AsyncClient")
_RECORDS = (
    "AuditRecord",
    "CandidateRecord",
    "CandidateState",
    "ShadowDiffRecord",
    "DeploymentRecord",
    "EvaluatorRecord",
    "PolicySummaryRecord",
    "PolicyVersionRecord",
    "ReviewRecord",
)
_REVIEW_RULES = ("ReviewKind", "ReviewState")
_MODELS = (  # what the API adds to the records
    "DeployResult",
    "PolicyInfo",
    "PromoteResult",
    "ShadowReport",
    "RemoteDecision",
    "ReviewInfo",
    "RollbackResult",
    "ServerInfo",
    "UploadedEvaluator",
)

__all__ = sorted(("PolicyTester", "TlsOption", "ProgressCallback", *_CLIENT, *_RECORDS, *_REVIEW_RULES, *_MODELS))


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        from crossaudit.sdk import client as home
    elif name == "PolicyTester":
        from crossaudit.sdk import tester as home
    elif name == "TlsOption":
        from crossaudit.sdk import options as home
    elif name == "ProgressCallback":
        from crossaudit.kernel import progress as home
    elif name in _RECORDS:
        from crossaudit.api import records as home
    elif name in _REVIEW_RULES:
        import orchestrator.reviews as home
    elif name in _MODELS:
        from crossaudit.api import models as home
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
