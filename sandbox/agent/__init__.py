"""CrossAudit sandbox agent: runs one evaluator's code, one call at a time, in throwaway children.

Stdlib only, Linux only, run as ``__main__`` inside a sandbox (a container for the Docker
backend, a subprocess for the process backend; both start it through :mod:`.launch`). It speaks the JSON-lines protocol
of ``docs/agent-protocol.md`` on its stdin/stdout and nothing else:

* the original stdout is moved to a private fd used only for protocol frames, and fds 0/1 are
  pointed at /dev/null, so nothing the user's code prints can ever become a frame;
* the warm parent compiles the code and imports the declared modules once, then forks a
  single-use child per call *ahead of demand*; the child applies rlimits (and drops root) and
  waits for its call, so a call costs a pipe round trip, not a fork. No evaluator code runs
  while no call is in flight: the module body runs in the child once its call has arrived;
* the warm parent never reads a call: a long-lived *I/O process*, forked from it right after
  the load, speaks the protocol and drives each child through pipes the parent hands over, so
  every child is forked from memory that never held a caller's prompt, response or result;
* the child's stdout/stderr go to capped capture pipes, its result to a private pipe; the I/O
  process answers with a typed frame, then the parent *resets* the sandbox before forking the
  next child: every other process killed (all of the container's PID namespace when the agent
  is its PID 1), the scratch directories emptied, SysV IPC objects removed (``reset`` in the
  load frame). Nothing one call leaves behind is seen by the next.

The wall-clock deadline is enforced from outside (the orchestrator kills the process group or
the container); the agent's own backstop only bounds its loops.

One module per job, relative imports and the standard library only (the package is copied into
the runner image as a bare directory and must run there unchanged):

* :mod:`.supervisor`: the warm parent (process supervision) and ``main``;
* :mod:`.ioprocess`: the I/O process ("crossaudit-io"): frame dispatch, calls, result collection;
* :mod:`.callchild`: forking the single-use call child, and everything that runs inside it;
* :mod:`.load`: the load frame (limits, compilation, isolation) and the entry-point guard;
* :mod:`.preload`: dependency preloading (``PLATFORM_PACKAGES``, ``is_dependency_name``);
* :mod:`.restrictions`: restricted mode's audited guards (``Restrictions``);
* :mod:`.cleanup`: the per-call reset (kill, wipe the scratch dirs, SysV IPC);
* :mod:`.framing`: the wire protocol's framing and error documents;
* :mod:`.state`: the state the jobs share; :mod:`.osutil`: /proc and libc;
* :mod:`.launch`: runs the package as ``__main__`` from its directory alone.
"""
