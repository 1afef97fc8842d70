"""CrossAudit public SDK: ``PolicyTester`` (in-process), ``Client`` and ``AsyncClient`` (gRPC)."""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncClient", "Client", "PolicyTester"]


def __getattr__(name: str) -> Any:
    # Lazy so that ``import crossaudit`` stays cheap and the CLI starts fast.
    if name == "PolicyTester":
        from crossaudit.sdk.tester import PolicyTester

        return PolicyTester
    if name == "Client":
        from crossaudit.sdk.client import Client

        return Client
    if name == "AsyncClient":
        from crossaudit.sdk.client import AsyncClient

        return AsyncClient
    raise AttributeError(name)
