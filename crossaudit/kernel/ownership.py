"""Which orchestrator process owns a container: the one labelling convention shared by the
custom-code sandbox and the container model servers, so their reapers agree on what is orphaned.

A container carries :data:`OWNER_LABEL` = ``<hostname>:<pid>`` of the process that started it.
A leftover is one whose owner is gone: a dead pid on this host. Another host's owner (a shared
daemon) is never judged from here.
"""

from __future__ import annotations

import os
import socket

OWNER_LABEL = "crossaudit.owner"


def owner_id() -> str:
    """This process's owner value."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """False only when ``owner`` is malformed or names a process of this host that no longer exists."""
    host, _, pid = owner.rpartition(":")
    if not pid.isdigit():
        return False  # malformed label: nobody owns it
    if host != socket.gethostname():
        return True  # another host's orchestrator on a shared daemon: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
