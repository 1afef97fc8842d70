"""Runner entry point: make the warm agent non-dumpable, then run it as ``__main__``.

Why: the call child runs as the same uid as its warm parent (the agent, PID 1). Without
this, user code could ``ptrace`` the parent or open ``/proc/1/{mem,fd,environ}`` and tamper
with later calls. ``PR_SET_DUMPABLE=0`` (kept across fork, reset only by execve) makes every
process of the container refuse same-uid ptrace access when no process has CAP_SYS_PTRACE,
which ``cap_drop ALL`` guarantees. Stdlib only.

The agent is a package (``/opt/crossaudit/agent/``) run as ``__main__`` by its own
``launch.py``, the same way the process backend starts it on the host.
"""

import ctypes
import runpy
import sys

PR_SET_DUMPABLE = 4
AGENT = "/opt/crossaudit/agent/launch.py"  # runs the agent package as __main__

try:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
except Exception as exc:  # never start an agent that other processes could trace
    sys.stderr.write(f"crossaudit runner: cannot make the agent non-dumpable: {exc}\n")
    sys.exit(3)

sys.argv[0] = AGENT
runpy.run_path(AGENT, run_name="__main__")
