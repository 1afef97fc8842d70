"""Model servers as hardened containers (the pool's ``docker`` isolation).

A model library parses untrusted text and loads model files; in a container it gets no network,
a read-only root filesystem, no capabilities and a memory/pids cap (the settings every CrossAudit
container runs with: :class:`crossaudit.imagebuild.hardening.Hardening`), so a bug in it cannot reach
the orchestrator's files, network or secrets. The server itself is unchanged: it listens on a unix
socket in a directory bind-mounted from the host (the only writable mount besides a small /tmp),
and each model path a call names is bind-mounted read-only at ``/models/<kind>/<hash>/<name>``;
the pool rewrites the config paths it sends accordingly (:func:`model_mounts`, :func:`rewrite_paths`).

:class:`ContainerProcess` gives a container the surface of ``asyncio.subprocess.Process`` the pool
uses (stdout/stderr readers, ``returncode``, ``terminate``/``kill``/``wait``), so start, health
checks, restarts and shutdown are the subprocess code paths. docker-py calls block, so they run on
daemon threads (never the default executor, whose threads the interpreter joins at exit).

Every container carries :data:`LABEL` and :data:`OWNER_LABEL`; :func:`reap_leftovers` removes those
whose owning process is gone (a crashed orchestrator), and an atexit hook removes this process's own.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import Mapping
from typing import Any

from crossaudit.imagebuild import daemon
from crossaudit.imagebuild.hardening import Hardening
from crossaudit.kernel.ownership import OWNER_LABEL, owner_alive, owner_id
from crossaudit.modelserver.builtins import RUNTIMES

LABEL = "crossaudit.modelserver"  # value: the model kind
SOCKET_DIR = "/run/crossaudit"  # where the images' servers listen (their $CROSSAUDIT_MODEL_SOCKET)
MODEL_ROOT = "/models"
MAX_REAP = 200  # containers examined per reaping pass
CLIENT_TIMEOUT_S = 60

_live: dict[str, Any] = {}  # container id -> docker client, for the atexit hook
_live_lock = threading.Lock()


def client() -> Any:
    """A docker-py client, or ConfigurationError saying why containers cannot be used."""
    return daemon.docker_client(CLIENT_TIMEOUT_S, purpose="running model servers in containers")


def model_mounts(kind: str, config: Mapping[str, Any]) -> dict[str, str]:
    """Host path → in-container path of every model file/directory ``config`` names that exists.

    The target is derived from the path alone, so the same model always lands at the same place
    and one container can hold several; the basename is kept because runtimes look at it (an ONNX
    export is a directory of known files, a checkpoint a file). A missing path is not mounted: the
    config keeps it and the server reports it missing, exactly as a subprocess server would.
    """
    mounts: dict[str, str] = {}
    for field in RUNTIMES[kind].model_paths:
        value = config.get(field)
        if not isinstance(value, str) or not value:
            continue
        host = os.path.abspath(value)
        if not os.path.exists(host):
            continue
        digest = hashlib.sha256(host.encode()).hexdigest()[:12]
        mounts[host] = f"{MODEL_ROOT}/{kind}/{digest}/{os.path.basename(host.rstrip('/')) or 'model'}"
    return mounts


def rewrite_paths(kind: str, config: Mapping[str, Any], mounts: Mapping[str, str]) -> dict[str, Any]:
    """``config`` with each mounted model path replaced by where the container sees it."""
    out = dict(config)
    for field in RUNTIMES[kind].model_paths:
        value = out.get(field)
        if isinstance(value, str) and value and os.path.abspath(value) in mounts:
            out[field] = mounts[os.path.abspath(value)]
    return out


def preload_env(kind: str) -> dict[str, str]:
    """Blank the image's default model settings: models come with each call's config (mounted),
    so the server must not try to preload a path nothing was mounted at."""
    return dict.fromkeys(RUNTIMES[kind].model_paths.values(), "")


def reap_leftovers(docker_client: Any) -> int:
    """Force-remove model-server containers that exited or whose owner process is gone."""
    removed = 0
    for c in docker_client.api.containers(all=True, filters={"label": LABEL})[:MAX_REAP]:
        labels = c.get("Labels") or {}
        if c.get("State") in {"exited", "dead", "created"} or not owner_alive(labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(Exception):
                docker_client.api.remove_container(c["Id"], force=True)
                removed += 1
    return removed


def run(
    docker_client: Any,
    *,
    kind: str,
    image: str,
    args: list[str],
    socket_dir: str,
    mounts: Mapping[str, str],
    memory_bytes: int,
    pids: int,
    tmpfs_bytes: int,
) -> Any:
    """Start ``image`` hardened (blocking). The user is the image's (a non-root uid)."""
    from docker.types import Mount

    binds = [Mount(SOCKET_DIR, socket_dir, type="bind", read_only=False)]
    binds += [Mount(target, source, type="bind", read_only=True) for source, target in sorted(mounts.items())]
    container = docker_client.containers.run(
        image,
        command=args,
        name=f"ca-ms-{kind}-{os.getpid()}-{secrets.token_hex(3)}",
        detach=True,
        # no network (a model cannot phone home or be reached), read-only root (site-packages, app
        # and /etc immutable), /tmp the only scratch (HOME=/tmp in the images), no capabilities,
        # no privilege gain, no swap beyond the memory cap
        **Hardening(memory_bytes=memory_bytes, pids=pids, tmpfs_bytes=tmpfs_bytes).settings(),
        mounts=binds,
        environment=preload_env(kind),
        labels={LABEL: kind, OWNER_LABEL: owner_id()},
    )
    with _live_lock:
        _live[container.id] = docker_client
    return container


class ContainerProcess:
    """A running model-server container seen through the ``asyncio.subprocess.Process`` surface."""

    def __init__(self, docker_client: Any, container: Any) -> None:
        self._client = docker_client
        self.container = container
        self.id: str = container.id
        self.image_id: str = str(container.attrs.get("Image") or "")  # the image it runs (sha256:...)
        self.pid: int = int((container.attrs.get("State") or {}).get("Pid") or 0)
        self.returncode: int | None = None
        self.stdout = asyncio.StreamReader()
        self.stderr = asyncio.StreamReader()
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        for target, args in (
            (self._follow, (True, self.stdout)),
            (self._follow, (False, self.stderr)),
            (self._watch, ()),
        ):
            threading.Thread(target=target, args=args, name=f"ca-ms-{self.id[:12]}", daemon=True).start()

    @classmethod
    async def start(cls, docker_client: Any, **kwargs: Any) -> ContainerProcess:
        container = await asyncio.to_thread(run, docker_client, **kwargs)
        try:
            await asyncio.to_thread(container.reload)
            return cls(docker_client, container)
        except BaseException:
            await asyncio.to_thread(_remove, docker_client, container.id)
            raise

    def _call(self, fn: Any, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the pool's loop is gone: nobody is listening
            self._loop.call_soon_threadsafe(fn, *args)

    def _follow(self, stdout: bool, reader: asyncio.StreamReader) -> None:
        try:
            for chunk in self.container.logs(stdout=stdout, stderr=not stdout, stream=True, follow=True):
                self._call(reader.feed_data, chunk)
        except Exception:  # the daemon went away or the container was removed: end of stream
            pass
        self._call(reader.feed_eof)

    def _watch(self) -> None:
        code = -1
        with contextlib.suppress(Exception):
            code = int(self.container.wait(timeout=None).get("StatusCode", -1))
        _remove(self._client, self.id)
        self._call(self._set_exit, code)

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        if not self._exited.done():
            self._exited.set_result(code)

    def _signal(self, sig: str) -> None:
        def send() -> None:
            with contextlib.suppress(Exception):
                self.container.kill(signal=sig)

        threading.Thread(target=send, name=f"ca-ms-kill-{self.id[:12]}", daemon=True).start()

    def terminate(self) -> None:
        if self.returncode is None:
            self._signal("SIGTERM")

    def kill(self) -> None:
        if self.returncode is None:
            self._signal("SIGKILL")

    async def wait(self) -> int:
        """The exit status, once the container has exited *and* been removed."""
        return await asyncio.shield(self._exited)


def _remove(docker_client: Any, container_id: str) -> None:
    with contextlib.suppress(Exception):
        docker_client.api.remove_container(container_id, force=True)
    with _live_lock:
        _live.pop(container_id, None)


@atexit.register
def _remove_own() -> None:
    with _live_lock:
        leftovers = list(_live.items())
    for container_id, docker_client in leftovers:
        _remove(docker_client, container_id)
