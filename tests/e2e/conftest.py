"""A real ``crossaudit serve`` process on an ephemeral loopback port, with two tenants."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crossaudit import Client
from crossaudit.v1 import policy_pb2, policy_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
TENANT_KEYS = {
    "acme": "acme-key-0123456789abcdef",
    "globex": "globex-key-0123456789abcdef",
}
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so no server outlives it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def write_keys(path: Path) -> Path:
    lines = ["tenants:"] + [f"  {t}: [{k}]" for t, k in TENANT_KEYS.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def run_cli(
    *args: str,
    server: ServerProcess | None = None,
    api_key: str | None = None,
    stdin: str | None = None,
    sandbox: str | None = "process",
    timeout: float = 600,
    env: dict[str, str | None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m crossaudit.cli ARGS`` with no CROSSAUDIT_* variables but those given: the
    sandbox (the process sandbox by default: fast, and these tests are about the CLI), and with
    ``server`` its address and a key (globex's unless ``api_key``); then ``env`` (None removes a
    variable). Never a traceback."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")}
    if sandbox:
        environ["CROSSAUDIT_SANDBOX"] = sandbox
    if server is not None:
        environ["CROSSAUDIT_SERVER"] = server.address
        environ["CROSSAUDIT_API_KEY"] = api_key if api_key is not None else key("globex")
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    res = subprocess.run(
        [sys.executable, "-m", "crossaudit.cli", *args],
        cwd=ROOT,
        env=environ,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    return res


def start_process(
    cmd: list[str], *, env: dict[str, str], log: Path, ready: str, timeout: float = START_TIMEOUT_S
) -> tuple[subprocess.Popen[str], str]:
    """Start ``cmd`` (stderr to ``log``) and wait, bounded, for its stdout line starting with
    ``ready``: returns the process and that line; RuntimeError with the log's tail otherwise
    (the process is then left for the caller to stop)."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log.open("a"), text=True, env=env, preexec_fn=_die_with_parent
    )
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(ready):
            return proc, line.strip()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(10)
    raise RuntimeError(f"{cmd[3] if len(cmd) > 3 else cmd[0]} did not start; log:\n{log.read_text()[-3000:]}")


class ServerProcess:
    """``python -m crossaudit.cli serve`` on 127.0.0.1:0; ``address`` once started."""

    def __init__(
        self,
        data_dir: Path,
        *,
        sandbox: str = "process",
        extra: tuple[str, ...] = (),
        keys_text: str | None = None,
        env: dict[str, str] | None = None,
        dev: bool = False,
    ) -> None:
        """``keys_text``: the API-keys file (default: ``TENANT_KEYS``); ``env``: added to the
        server's environment; ``dev``: ``--dev`` instead of API keys."""
        self.data_dir = data_dir
        self.sandbox = sandbox
        self.extra = extra
        self.keys_text = keys_text
        self.extra_env = dict(env or {})
        self.dev = dev
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.start_line = ""
        self.metrics_address = ""
        self.log = data_dir / "server.log"
        self.policies_dir = data_dir / "policies"
        self.policies_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> str:
        keys = self.data_dir / "keys.yaml"
        if self.keys_text is None:
            write_keys(keys)
        else:
            keys.write_text(self.keys_text)
            keys.chmod(0o600)
        auth = ["--dev"] if self.dev else ["--api-keys", str(keys)]
        cmd = [
            sys.executable,
            "-m",
            "crossaudit.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            str(self.data_dir / "data"),
            *auth,
            "--sandbox",
            self.sandbox,
            *(["--allow-process-sandbox"] if self.sandbox == "process" else []),
            "--policies-dir",
            str(self.policies_dir),
            "--metrics-port",
            "0",
            *self.extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSAUDIT_")} | self.extra_env
        try:
            self.proc, line = start_process(cmd, env=env, log=self.log, ready="crossaudit serving on ")
        except RuntimeError:
            self.kill()
            raise
        self.start_line = line
        self.address = line.split()[3].rstrip(",")
        if "metrics on " in line:
            self.metrics_address = line.rsplit("metrics on ", 1)[1].strip()
        return self.address

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> int:
        """Graceful: SIGTERM, then wait."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """``kill -9``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> ServerProcess:
        """``with ServerProcess(...) as srv``: started, and stopped (gracefully) on leaving."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path_factory.mktemp("server")) as srv:
        yield srv


@pytest.fixture(scope="module")
def acme(server: ServerProcess) -> Iterator[Client]:
    """A client of the module's server, as tenant acme."""
    with Client(server.address, api_key=key("acme")) as c:
        yield c


@pytest.fixture(scope="module")
def globex(server: ServerProcess) -> Iterator[Client]:
    """A client of the module's server, as tenant globex."""
    with Client(server.address, api_key=key("globex")) as c:
        yield c


def need_docker() -> None:
    """Skip (fail under CI=true) unless a Docker daemon answers (docker-py is a dependency)."""
    from tests.conftest import docker_client, need

    need(docker_client() is not None, "no Docker daemon answers")


def key(tenant: str) -> str:
    return TENANT_KEYS[tenant]


def raw_deploy(
    address: str, content: str, *, tenant: str = "acme", filename: str = "policy.yaml", timeout: float = 60.0
) -> grpc.RpcError | None:
    """DeployPolicy to production exactly as any gRPC client may send it (nothing inlined or
    checked on the client's side), as ``tenant``: the RpcError, or None when accepted."""
    with grpc.insecure_channel(address) as channel:
        try:
            policy_pb2_grpc.PolicyServiceStub(channel).DeployPolicy(
                policy_pb2.DeployPolicyRequest(content=content, filename=filename, environment="production"),
                metadata=(("authorization", f"Bearer {key(tenant)}"),),
                timeout=timeout,
            )
        except grpc.RpcError as e:
            return e
    return None
