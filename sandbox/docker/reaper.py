"""Remove sandbox containers left behind by a crashed orchestrator.

Every container carries ``crossaudit.sandbox=1`` and ``crossaudit.owner=<host>:<pid>``. At
backend start, labelled containers whose owner is gone (a dead pid on this host), and any
that already exited, are force-removed. Containers of *live* owners are left
alone, so two services or a test run next to a service on one daemon do not kill each other's
warm pools. Blocking (docker-py): async callers use an executor.
"""

from __future__ import annotations

import contextlib
from typing import Any

from crossaudit.kernel.ownership import OWNER_LABEL, owner_alive
from sandbox.docker.container import kill_and_remove
from sandbox.docker.images import LABEL

MAX_REAP = 1_000  # containers examined per pass


def leftovers(client: Any, *, include_live_owners: bool = False) -> list[dict[str, Any]]:
    """Labelled containers to remove: exited, or owned by a process that no longer exists."""
    found = client.api.containers(all=True, filters={"label": f"{LABEL}=1"})[:MAX_REAP]
    out = []
    for c in found:
        labels = c.get("Labels") or {}
        finished = c.get("State") in {"exited", "dead"}
        owner = labels.get(OWNER_LABEL, "")
        if include_live_owners or finished or not owner_alive(owner):
            out.append(c)
    return out


def reap(client: Any, *, include_live_owners: bool = False) -> int:
    """Force-remove leftovers; returns how many were removed."""
    n = 0
    for c in leftovers(client, include_live_owners=include_live_owners):
        with contextlib.suppress(Exception):
            kill_and_remove(client, c["Id"])
            n += 1
    return n
