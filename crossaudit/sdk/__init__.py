"""The Python SDK: :class:`~crossaudit.sdk.client.Client` / ``AsyncClient`` (gRPC) and
:class:`~crossaudit.sdk.tester.PolicyTester` (in-process), with the models the clients answer:
the store's records and the API models derived from them.

Names load on first use (PEP 562), so importing ``crossaudit.sdk.tester`` does not pull in gRPC.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Client": "crossaudit.sdk.client",
    "AsyncClient": "crossaudit.sdk.client",
    "PolicyTester": "crossaudit.sdk.tester",
    "TlsOption": "crossaudit.sdk.options",
    "ProgressCallback": "crossaudit.kernel.progress",
    # answers: the store's records ...
    "AuditRecord": "crossaudit.store.base",
    "CandidateRecord": "crossaudit.store.base",
    "CandidateState": "crossaudit.store.base",
    "ShadowDiffRecord": "crossaudit.store.base",
    "DeploymentRecord": "crossaudit.store.base",
    "EvaluatorRecord": "crossaudit.store.base",
    "PolicySummaryRecord": "crossaudit.store.base",
    "PolicyVersionRecord": "crossaudit.store.base",
    "ReviewRecord": "crossaudit.store.base",
    "ReviewKind": "crossaudit.store.base",
    "ReviewState": "crossaudit.store.base",
    # ... and what the API adds to them
    "DeployResult": "crossaudit.service.models",
    "PolicyInfo": "crossaudit.service.models",
    "PromoteResult": "crossaudit.service.models",
    "ShadowReport": "crossaudit.service.models",
    "RemoteDecision": "crossaudit.service.models",
    "ReviewInfo": "crossaudit.service.models",
    "RollbackResult": "crossaudit.service.models",
    "ServerInfo": "crossaudit.service.models",
    "UploadedEvaluator": "crossaudit.service.models",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
