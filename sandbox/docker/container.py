"""One hardened sandbox container running the agent, and the attach channel to it.

Why this shape:

* Every isolation setting lives in :func:`container_spec`, derived from named limits only, so
  the hardening is reviewed (and tested) in one place: the settings every CrossAudit container
  runs with (:class:`crossaudit.imagebuild.hardening.Hardening`, the model servers' too) and the
  sandbox's own on top (ulimits, CPU, IPC caps, no logs, auto-remove).
* The agent protocol travels over the container's attached stdin/stdout (``attach_socket``
  with ``tty=False``). Without a TTY the daemon *multiplexes* the output: every chunk is an
  8-byte header ``[stream, 0, 0, 0, size(uint32 BE)]`` then ``size`` bytes. docker-py only
  demultiplexes for ``logs``/``attach`` generators, not for the raw socket, so
  :class:`AttachChannel` does it, on a ``dup`` of the socket driven by asyncio (a warm call
  costs no executor hop). Only stream 1 (the agent's private protocol fd) can carry frames;
  the user's code never writes there.
* ``StdinOnce`` is set (docker-py does so for ``stdin_open`` without ``detach``): when the
  orchestrator dies its attach connection closes, the agent reads EOF and exits, and
  ``auto_remove`` deletes the container. The reaper catches anything left over.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import shutil
import socket
import stat
import struct
import tempfile
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from crossaudit.imagebuild.hardening import Hardening
from crossaudit.kernel.errors import (
    ConfigurationError,
    CrossAuditError,
    EvaluatorTimeoutError,
    EvaluatorUnavailableError,
    SandboxCrashedError,
)
from crossaudit.kernel.limits import PoolLimits, SandboxLimits
from crossaudit.kernel.ownership import OWNER_LABEL, owner_alive, owner_id
from sandbox.cpugroups import docker_parent
from sandbox.docker.images import IMAGE_LABEL, LABEL, SANDBOX_UID
from sandbox.protocol import AgentChannel, error_from_frame

log = logging.getLogger(__name__)

BUNDLE_LABEL = "crossaudit.bundle"  # the code's digest: identical code of two tenants shares it
POOL_LABEL = "crossaudit.pool"  # the warm pool (tenant + code, ``CodeBundle.pool_key``): never shared
UID_LABEL = "crossaudit.uid"  # the container's uid: what other orchestrators on the daemon skip
AGENT_NOFILE_HEADROOM = 64  # the warm parent's own pipes; the call's child gets exactly ``nofile``
AGENT_PIDS_HEADROOM = 16  # the warm parent, its threads and the waiting child; calls get ``pids``
STDOUT, STDERR = 1, 2
MAX_FRAMES_PER_CALL = 64  # unrelated frames skipped while waiting for the call's answer
STDERR_KEEP = 8 * 1024  # tail of the agent's own stderr kept for diagnostics
SETTLE_SLACK_S = 5.0  # beyond SandboxLimits.cleanup_s: the agent also forks its next child before reporting
SCRATCH_DIRS = ("/tmp", "/dev/shm")  # the only writable filesystems: tmpfs, size- and inode-capped
RESET_PATHS = (*SCRATCH_DIRS, "/dev/mqueue")  # emptied by the agent after every call (POSIX queues too)
SEM_PER_SET = 250  # kernel.sem SEMMSL; SEMMNI (sets) is SandboxLimits.ipc_objects
SEM_OPS_PER_CALL = 32  # kernel.sem SEMOPM
_BACKGROUND: set[asyncio.Task[None]] = set()  # strong references to fire-and-forget cleanups

# Environment variables a sandbox may receive (values from the backend's configuration). The
# image's own ENV (PATH, HOME, PYTHONPATH, ...) is fixed at build time. Nothing from the host.
ENV_ALLOWLIST = frozenset(
    {
        "LANG", "LC_ALL", "TZ", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONWARNINGS",
        "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
        "TOKENIZERS_PARALLELISM", "NLTK_DATA", "TRANSFORMERS_OFFLINE", "HF_HUB_OFFLINE",
    }
)  # fmt: skip
DEFAULT_ENV: dict[str, str] = {
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",  # numeric libraries: one thread (pids budget, fork safety)
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """Refuse any variable outside :data:`ENV_ALLOWLIST` (a typo must not leak a host secret)."""
    bad = sorted(k for k in env if k not in ENV_ALLOWLIST)
    if bad:
        raise ConfigurationError(f"environment variables not allowed in sandboxes: {', '.join(bad)}")
    return {k: str(v) for k, v in env.items()}


SANDBOX_UID_RANGE = (20_000, 60_000)  # one uid per container, see UidAllocator


class UidAllocator:
    """Hands every container its own unprivileged uid (gid stays the image's sandbox group).

    Why: ``RLIMIT_NPROC`` (the agent's per-call process cap) and the kernel's process
    accounting are per *uid across the host*, not per container. With one shared uid, warm
    parents of many pools, or one evaluator's fork bomb, would exhaust every other
    evaluator's process budget. Distinct uids keep each container's count its own.

    One allocator walks the range from a random start; another process's (a second worker, a
    second orchestrator on the daemon) walks it too, so ``next`` skips the uids that containers
    on the daemon already hold (``uids_in_use``). Without that, two walks that met handed one
    uid to two tenants' containers, and one's fork bomb refused the other's threads.
    """

    def __init__(self, start: int | None = None) -> None:
        lo, hi = SANDBOX_UID_RANGE
        self._next = start if start is not None else lo + secrets.randbelow(hi - lo)

    def next(self, taken: Collection[int] = ()) -> int:
        """The next uid of the range that is not in ``taken``."""
        lo, hi = SANDBOX_UID_RANGE
        for _ in range(hi - lo):  # bounded: one lap of the range
            uid = self._next
            self._next = lo + (uid + 1 - lo) % (hi - lo)
            if uid not in taken:
                return uid
        raise EvaluatorUnavailableError(f"every sandbox uid ({lo}-{hi - 1}) is held by a container")


def uids_in_use(api: Any) -> set[int]:
    """The uids of the sandbox containers on the daemon, whichever process started them (their
    ``crossaudit.uid`` label; created, running or exiting alike). One list call."""
    taken: set[int] = set()
    for c in api.containers(all=True, filters={"label": [f"{LABEL}=1", UID_LABEL]}):
        value = str((c.get("Labels") or {}).get(UID_LABEL, ""))
        if value.isdigit():
            taken.add(int(value))
    return taken


def ipc_sysctls(limits: SandboxLimits) -> dict[str, str]:
    """Caps of the container's own IPC namespace: what a call can leave there stays small to remove."""
    n = int(limits.ipc_objects)
    return {
        "kernel.shmmni": str(n),
        "kernel.msgmni": str(n),
        "kernel.sem": f"{SEM_PER_SET} {SEM_PER_SET * n} {SEM_OPS_PER_CALL} {n}",
        "fs.mqueue.queues_max": str(n),
        "kernel.shm_rmid_forced": "1",  # a segment nobody is attached to dies with its creator
    }


def container_spec(
    api: Any,
    image: str,
    limits: SandboxLimits,
    env: Mapping[str, str],
    labels: Mapping[str, str],
    uid: int = SANDBOX_UID,
    channel_dir: str | None = None,
    cgroup_parent: str | None = None,
) -> dict[str, Any]:
    """``create_container`` keyword arguments: every isolation setting, from named limits only.
    ``channel_dir``: the container's private channel directory (:class:`SocketChannel`), bound
    read-only at :data:`CHANNEL_MOUNT`; the agent connects to the socket in it. ``cgroup_parent``:
    the tenant's (:func:`sandbox.cpugroups.docker_parent`), None for the daemon's default."""
    from docker.types import LogConfig, Ulimit

    hardened = Hardening(
        memory_bytes=int(limits.container_memory_bytes),
        pids=int(limits.pids) + AGENT_PIDS_HEADROOM,
        tmpfs_bytes=int(limits.tmpfs_bytes),
        scratch_dirs=SCRATCH_DIRS,  # /dev/shm too: same size and inode caps
        tmpfs_inodes=int(limits.tmpfs_inodes),
    )
    host_config = api.create_host_config(
        **hardened.settings(),  # no network, read-only root, no capabilities, memory/pids caps, ...
        sysctls=ipc_sysctls(limits),
        nano_cpus=int(limits.cpus * 1e9),
        ulimits=[
            Ulimit(
                name="nofile",
                soft=int(limits.nofile) + AGENT_NOFILE_HEADROOM,
                hard=int(limits.nofile) + AGENT_NOFILE_HEADROOM,
            ),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="fsize", soft=int(limits.file_bytes), hard=int(limits.file_bytes)),
        ],
        auto_remove=True,  # removed by the daemon when it exits, whatever happens to us
        log_config=LogConfig(type="none"),  # runaway output never reaches the host's disk
        ipc_mode="private",
        privileged=False,
        # No host path, no Docker socket; at most the container's own channel directory,
        # read-only, holding nothing but the socket its agent connects to once.
        binds=[f"{channel_dir}:{CHANNEL_MOUNT}:ro"] if channel_dir else [],
        init=False,
        cgroup_parent=cgroup_parent,
    )
    return {
        "image": image,
        "user": f"{int(uid)}:{SANDBOX_UID}",  # never 0: uid from UidAllocator, gid the sandbox group
        "stdin_open": True,  # + detach=False → StdinOnce: our disconnect is the agent's EOF
        "tty": False,
        "network_disabled": True,
        "environment": {**env, CHANNEL_ENV: f"{CHANNEL_MOUNT}/{CHANNEL_SOCKET}"} if channel_dir else dict(env),
        "labels": {LABEL: "1", **labels},
        "hostname": "sandbox",
        "working_dir": "/tmp",
        "host_config": host_config,
        "use_config_proxy": False,  # the client's proxy settings are host environment too
    }


class AttachChannel:
    """Agent frames (``sandbox.protocol.AgentChannel``) over the multiplexed attach stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame: int) -> None:
        self.reader = reader
        self.writer = writer
        self.codec = AgentChannel(max_frame)
        self._frames: collections.deque[dict[str, Any]] = collections.deque()
        self.stderr_tail = bytearray()

    @property
    def closed(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    async def send(self, frame: Mapping[str, Any]) -> None:
        self.writer.write(self.codec.encode(frame))
        await self.writer.drain()

    async def recv(self) -> dict[str, Any]:
        """Next frame. EOF → :class:`SandboxCrashedError`; an oversized or bad line → ProtocolError."""
        while not self._frames:
            try:
                header = await self.reader.readexactly(8)
                size = int.from_bytes(header[4:8], "big")
                payload = await self.reader.readexactly(size) if size else b""
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise SandboxCrashedError("sandbox container exited without a result") from exc
            if header[0] == STDOUT:
                self._frames.extend(self.codec.feed(payload))
            elif header[0] == STDERR:
                self.stderr_tail = (self.stderr_tail + payload)[-STDERR_KEEP:]
        return self._frames.popleft()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


CHANNEL_MOUNT = "/run/crossaudit"  # where a container sees its private channel directory
CHANNEL_PREFIX = "crossaudit-channel-"  # + the owner's pid + "-": host directories in the system temp dir
CHANNEL_SOCKET = "agent.sock"
CHANNEL_ENV = "CROSSAUDIT_AGENT_SOCKET"  # tells the agent where to connect (sandbox.agent.supervisor)
CHANNEL_READ_BYTES = 1 << 16
MAX_CHANNEL_REAP = 10_000  # temp-dir entries examined per sweep of dead owners' channel directories


class SocketChannel(AttachChannel):
    """Agent frames over a unix socket the agent connected to: no daemon in the path.

    The attach stream carries the frames otherwise, relayed by dockerd and the container's shim:
    two more processes woken, and ~0.45 ms of their CPU, per call (docs/performance.md). The
    attach connection stays open for the agent's own stderr (``stderr_tail``)."""

    async def recv(self) -> dict[str, Any]:
        while not self._frames:
            try:
                data = await self.reader.read(CHANNEL_READ_BYTES)
            except ConnectionError as exc:
                raise SandboxCrashedError("sandbox container exited without a result") from exc
            if not data:
                raise SandboxCrashedError("sandbox container exited without a result")
            self._frames.extend(self.codec.feed(data))
        return self._frames.popleft()


class _ChannelRefused(Exception):
    """The agent exited before connecting to its channel socket."""

    # Internal only, not in crossaudit.kernel.errors: caught in this module (the container falls
    # back to the attach stream); it never leaves the backend.


def open_channel_dir(uid: int) -> tuple[socket.socket, str]:
    """A private directory holding a listening socket only ``uid`` (the container's user) may
    connect to; mounted read-only in that container alone, removed from the host once the agent
    connected. Its name carries our pid, so that what a killed orchestrator left is found
    (:func:`reap_channel_dirs`). The file mode is not what keeps others out (an unprivileged
    orchestrator's socket is 0666): :meth:`WarmContainer._accept` checks the peer's credentials."""
    path = tempfile.mkdtemp(prefix=f"{CHANNEL_PREFIX}{os.getpid()}-")
    try:
        os.chmod(path, 0o711)  # the container's user may pass through, not list or write
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock_path = os.path.join(path, CHANNEL_SOCKET)
        listener.bind(sock_path)
        if os.geteuid() == 0:
            os.chown(sock_path, uid, SANDBOX_UID)
            os.chmod(sock_path, 0o600)
        else:  # an unprivileged orchestrator cannot give the socket away: the directory guards it
            os.chmod(sock_path, 0o666)
        listener.listen(1)
        listener.setblocking(False)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return listener, path


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that connected to a unix socket, as the kernel recorded them."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def reap_channel_dirs(root: str | None = None) -> int:
    """Remove channel directories whose owner process is gone (killed while a container was
    starting: a connected container's directory is removed at once). Only directories of our
    own uid, never through a symlink; returns how many were removed. Blocking."""
    root = root or tempfile.gettempdir()
    host = socket.gethostname()
    removed = 0
    try:
        names = os.listdir(root)[:MAX_CHANNEL_REAP]
    except OSError:
        return 0
    for name in names:
        pid = name[len(CHANNEL_PREFIX) :].partition("-")[0] if name.startswith(CHANNEL_PREFIX) else ""
        if not pid.isdigit() or owner_alive(f"{host}:{pid}"):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


async def _drain_stderr(reader: asyncio.StreamReader, tail: bytearray) -> None:
    """Keep the last STDERR_KEEP bytes of the agent's stderr, from the attach stream, in ``tail``
    (socket channel only); returns when the container's streams end."""
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, OSError):
        while True:
            header = await reader.readexactly(8)
            payload = await reader.readexactly(int.from_bytes(header[4:8], "big"))
            if header[0] == STDERR:
                tail += payload
                del tail[: max(0, len(tail) - STDERR_KEEP)]


@dataclass
class ContainerRuntime:
    """What every container needs from its backend: client, executor, limits, identity."""

    client: Any
    executor: ThreadPoolExecutor
    limits: SandboxLimits
    pool_limits: PoolLimits
    env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV))
    owner: str = field(default_factory=owner_id)
    uids: UidAllocator = field(default_factory=UidAllocator)
    socket_channel: bool = False  # frames over a private unix socket instead of the attach stream
    socket_verified: bool = False  # an agent has connected: a later refusal is that container's own
    cgroup_driver: str = ""  # the daemon's (cgroupfs, systemd): containers go under their tenant's parent; "" = not
    idle_reset: bool = True  # a finished call's process exits at SCHED_IDLE (the agent's reset spec)

    async def blocking(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))


class WarmContainer:
    """A started container whose agent has loaded one bundle; serves one call at a time."""

    def __init__(
        self, rt: ContainerRuntime, image: str, bundle_digest: str, pool_key: str = "", *, tenant: str = ""
    ) -> None:
        self.rt = rt
        self.tenant = tenant
        self.image = image
        self.bundle_digest = bundle_digest
        self.pool_key = pool_key
        self.id: str | None = None
        self.channel: AttachChannel | None = None
        self._sockets: list[Any] = []
        self._channel_dir: str | None = None
        self._uid = -1
        self._init_pid = -1  # the container's PID 1 (the agent) as this host numbers it
        self._attach_only = False  # this container's agent could not connect: attach, for it alone
        self._stderr_task: asyncio.Task[None] | None = None
        self.dead = False
        self.calls = 0
        self.idle_since = time.monotonic()
        self.load_info: dict[str, Any] = {}
        self.reset_pending = False  # a call was answered: the agent's reset frame follows

    @property
    def alive(self) -> bool:
        return not self.dead and self.channel is not None and not self.channel.closed

    def _create_and_attach(self, uid: int) -> socket.socket:
        api = self.rt.client.api
        spec = container_spec(
            api,
            self.image,
            self.rt.limits,
            self.rt.env,
            {
                OWNER_LABEL: self.rt.owner,
                BUNDLE_LABEL: self.bundle_digest[:32],
                POOL_LABEL: self.pool_key[:32],
                UID_LABEL: str(uid),
            },
            uid=uid,
            channel_dir=self._channel_dir,
            cgroup_parent=docker_parent(self.tenant, self.rt.cgroup_driver) if self.rt.cgroup_driver else None,
        )
        cid = self.id = api.create_container(**spec)["Id"]
        sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)  # SocketIO over the unix socket → the socket itself
        dup = raw.dup()  # ours to hand to asyncio; the originals stay referenced until close
        self._sockets = [sock, raw]
        api.start(cid)
        if self._channel_dir is not None:  # the one process whose connection the channel accepts
            self._init_pid = int(api.inspect_container(cid)["State"]["Pid"])
        if self.dead:  # start() timed out while this thread was still creating: clean up here
            for s in (dup, sock, raw):
                with contextlib.suppress(Exception):
                    s.close()
            kill_and_remove(self.rt.client, cid)
            raise EvaluatorUnavailableError("sandbox start was abandoned")
        return dup

    async def start(self, load_frame: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Create, attach, start, load; returns the agent's ``loaded`` frame (ok or not).

        With the socket channel, a container whose agent cannot reach its socket starts again on
        the attach stream. When that container's image holds nothing of a tenant's (the runner
        image) and no agent has connected yet, the daemon cannot bind our path (a remote or
        rootless daemon, an orchestrator in a container of its own): the channel is turned off
        for the backend. Otherwise it may be the container's own doing (a tenant's dependency
        runs code before the agent's first line, e.g. a ``sitecustomize``), and only that
        container uses attach: no tenant can switch the other tenants' channel."""
        try:
            async with asyncio.timeout(timeout):
                try:
                    return await self._start(load_frame)
                except _ChannelRefused as exc:
                    if self.rt.socket_channel and not self.rt.socket_verified and await self._plain_image():
                        self.rt.socket_channel = False
                        log.warning(
                            "sandbox agents cannot reach their channel socket (%s): using the attach "
                            "stream for every container from now on",
                            exc,
                        )
                    else:
                        log.warning(
                            "the agent of sandbox container %s did not connect to its channel socket "
                            "(%s): this container uses the attach stream",
                            (self.id or "?")[:12],
                            exc,
                        )
                    await self.destroy()
                    self.dead = False
                    self.channel = None
                    self._attach_only = True
                    return await self._start(load_frame)
        except TimeoutError:
            await self.destroy()
            raise EvaluatorUnavailableError(f"sandbox container did not start within {timeout:.1f}s") from None
        except SandboxCrashedError as exc:
            tail = self.channel.stderr_tail.decode("utf-8", "replace")[-500:] if self.channel else ""
            await self.destroy()
            raise EvaluatorUnavailableError(f"sandbox container died while loading: {exc} {tail}".strip()) from None
        except Exception as exc:
            await self.destroy()
            if isinstance(exc, CrossAuditError):
                raise
            # docker.errors.*, requests' connection errors (daemon gone), OSError on the socket
            raise EvaluatorUnavailableError(f"docker could not start a sandbox: {type(exc).__name__}: {exc}") from None

    async def _plain_image(self) -> bool:
        """Whether this container's image is the runner itself: no tenant dependency in it."""
        try:
            info = await self.rt.blocking(self.rt.client.api.inspect_image, self.image)
        except Exception:
            return False
        return ((info.get("Config") or {}).get("Labels") or {}).get(IMAGE_LABEL) == "runner"

    async def _start(self, load_frame: Mapping[str, Any]) -> dict[str, Any]:
        listener: socket.socket | None = None
        try:
            # Not a uid another orchestrator's container holds (its allocator walks the same range);
            # picked on the loop, so this process's own concurrent starts never share one either.
            taken = await self.rt.blocking(uids_in_use, self.rt.client.api)
            uid = self._uid = self.rt.uids.next(taken)
            if self.rt.socket_channel and not self._attach_only:
                listener, self._channel_dir = open_channel_dir(uid)
            sock = await self.rt.blocking(self._create_and_attach, uid)
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
            if listener is None:
                self.channel = AttachChannel(reader, writer, self.rt.limits.frame_bytes)
            else:
                self._sockets.append(writer)  # the attach connection: the agent's stderr
                self.channel = await self._accept(listener, reader)
                listener = None
            await self.channel.send(load_frame)
            for _ in range(MAX_FRAMES_PER_CALL):
                frame = await self.channel.recv()
                if frame.get("op") == "loaded":
                    self.load_info = frame
                    return frame
            raise SandboxCrashedError("sandbox agent never acknowledged the load")
        finally:
            if listener is not None:
                listener.close()

    async def _accept(self, listener: socket.socket, attach: asyncio.StreamReader) -> SocketChannel:
        """The agent's one connection; :class:`_ChannelRefused` if the agent exits first.

        Only a connection from the container's PID 1 under the container's uid (the kernel's
        record of the peer, ``SO_PEERCRED``) is taken: the socket is reachable from the host for
        the whole start, and whoever connected first would otherwise receive the tenant's code
        and every call, and answer them. Any other connection is closed and the wait goes on."""
        loop = asyncio.get_running_loop()
        tail = bytearray()
        self._stderr_task = loop.create_task(_drain_stderr(attach, tail))
        while True:
            accept = loop.create_task(loop.sock_accept(listener))
            try:
                await asyncio.wait({accept, self._stderr_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not accept.done():
                    accept.cancel()
            if not accept.done() or accept.cancelled() or accept.exception() is not None:
                raise _ChannelRefused(tail.decode("utf-8", "replace").strip()[-300:] or "the agent exited")
            conn, _ = accept.result()
            peer = peer_credentials(conn)
            if peer == (self._init_pid, self._uid):
                break
            conn.close()
            log.warning(
                "refused a connection to the channel socket of sandbox container %s from pid %d, uid %d: "
                "not the container's agent",
                (self.id or "?")[:12],
                *peer,
            )
        listener.close()  # one connection, the agent's: nothing else can connect now
        # The container's bind holds the directory for it; the host keeps nothing of it.
        os.unlink(os.path.join(self._channel_dir or "", CHANNEL_SOCKET))
        with contextlib.suppress(OSError):
            os.rmdir(self._channel_dir or "")
            self._channel_dir = None
        self.rt.socket_verified = True
        reader, writer = await asyncio.open_unix_connection(sock=conn, limit=1 << 20)
        channel = SocketChannel(reader, writer, self.rt.limits.frame_bytes)
        channel.stderr_tail = tail  # filled by the drain from now on
        return channel

    async def call(self, prompt: str, response: str, context: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Send one call tagged with a fresh nonce; return the matching ``result`` frame.

        The deadline is enforced here, from outside: on expiry the container is killed and
        removed before :class:`EvaluatorTimeoutError` is raised.
        """
        assert self.channel is not None
        nonce, frame = AgentChannel.call_frame(prompt, response, context)
        self.calls += 1
        try:
            async with asyncio.timeout(timeout):
                await self.channel.send(frame)
                for _ in range(MAX_FRAMES_PER_CALL):
                    frame = await self.channel.recv()
                    if frame.get("op") == "result" and frame.get("id") == nonce:
                        self.reset_pending = True
                        return frame
                    if frame.get("op") == "error":
                        raise error_from_frame(frame)
                raise SandboxCrashedError("sandbox agent did not answer the call")
        except TimeoutError:
            await self.destroy()
            raise EvaluatorTimeoutError(
                f"custom evaluator exceeded its {timeout:.3g}s deadline (container killed)"
            ) from None
        except SandboxCrashedError:  # includes ProtocolError: the agent is no longer trusted
            await self.destroy()
            raise
        except (ConnectionError, OSError) as exc:
            await self.destroy()
            raise SandboxCrashedError(f"sandbox channel failed: {exc}") from None
        except asyncio.CancelledError:
            # The caller gave up mid-call: the agent is still busy with it, so this container
            # cannot serve anyone else. Mark it dead now; kill and remove it in the background.
            self.dead = True
            task = asyncio.get_running_loop().create_task(self.destroy())
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
            raise

    async def settle(self) -> dict[str, Any] | None:
        """After an answered call: wait for the agent's ``reset`` frame (clean, next child forked).

        Returns that frame (``cleanup_ms``, ``reap_ms``, ``spawn_ms``, counts). A failed, malformed
        or missing reset destroys the container and returns None: a sandbox that may still hold a
        caller's leftovers never serves another call.
        """
        assert self.channel is not None
        self.reset_pending = False
        problem: object = "no reset frame"
        try:
            async with asyncio.timeout(self.rt.limits.cleanup_s + SETTLE_SLACK_S):
                for _ in range(MAX_FRAMES_PER_CALL):
                    frame = await self.channel.recv()
                    if frame.get("op") != "reset":
                        continue
                    ms = frame.get("cleanup_ms")
                    if frame.get("ok") is True and isinstance(ms, int | float) and not isinstance(ms, bool):
                        return frame
                    problem = frame.get("error") or "malformed reset frame"
                    break
        except TimeoutError:
            problem = "reset timed out"
        except (CrossAuditError, ConnectionError, OSError) as exc:
            problem = exc
        if not self.dead:  # else it was destroyed on purpose (pool closed, evicted) while settling
            log.warning("retiring sandbox container %s: %s", (self.id or "?")[:12], problem)
        await self.destroy()
        return None

    async def destroy(self) -> None:
        """Kill then remove (idempotent, bounded); safe to call from any failure path."""
        self.dead = True
        if self.channel is not None:
            self.channel.close()
        if self._stderr_task is not None:
            self._stderr_task.cancel()
        for s in self._sockets:
            with contextlib.suppress(Exception):
                s.close()
        self._sockets = []
        if self._channel_dir is not None:
            shutil.rmtree(self._channel_dir, ignore_errors=True)
            self._channel_dir = None
        if self.id is None:
            return
        cid, self.id = self.id, None
        try:
            await asyncio.wait_for(self.rt.blocking(kill_and_remove, self.rt.client, cid), timeout=30)
        except Exception as exc:  # the reaper removes it later; never mask the caller's error
            log.warning("could not remove sandbox container %s: %s", cid[:12], exc)


REMOVE_WAIT_S = 5.0  # how long kill_and_remove waits for the daemon to finish an auto-remove


def kill_and_remove(client: Any, cid: str) -> None:
    """SIGKILL, force-remove, and wait (bounded) until the container is really gone.

    'not found' / 'removal already in progress' (auto_remove racing us) are expected.
    """
    import docker.errors

    api = client.api
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        api.kill(cid)
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        api.remove_container(cid, force=True)
    deadline = time.monotonic() + REMOVE_WAIT_S
    while time.monotonic() < deadline:
        try:
            api.inspect_container(cid)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            pass
        time.sleep(0.05)
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        api.remove_container(cid, force=True)
