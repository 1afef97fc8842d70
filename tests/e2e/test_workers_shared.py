"""``crossaudit serve --workers 2`` is one server, not two: what it must hold per server holds
across its workers, on both stores.

- The decision log's signer has one memory: a worker that never signed the newest checkpoint
  must not sign over a history written after someone deleted that checkpoint (and rewrote a
  record under it, leaf recomputed). Every worker refuses, with a typed error, and
  ``audit verify --key`` fails.
- ``limits.max_concurrent_replays_per_tenant`` holds for the server: concurrent replays from
  clients spread over both workers are admitted at most that many at once, and the slots of
  workers killed with SIGKILL mid-replay are free for their replacements at once."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossaudit import Client
from crossaudit.evidence.leaf import leaf_document
from crossaudit.evidence.merkle import leaf_hash
from crossaudit.evidence.notes import generate_private_pem, load_signing_key
from crossaudit.kernel.errors import CrossAuditError, ErrorCode, QuotaExceededError
from crossaudit.sdk.client import ReplayOptions
from crossaudit.store import open_store
from tests.e2e.conftest import TENANT_KEYS, ServerProcess, key, run_cli
from tests.e2e.policies import KEYWORDS, custom_policy, returns

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FIRST, SECOND = 10, 20  # the two checkpoints worker X signs
FORGED_SEQ = 15  # the record rewritten under the deleted checkpoint, its leaf recomputed
ATTEMPTS = 12  # verify calls on fresh connections: the kernel spreads them over both workers


class OwnConnection(Client):
    """A client on a connection of its own: gRPC shares one connection among a process's channels
    to one address (its global subchannel pool), which would put every client on one worker."""

    def _open(self, target: str, creds: Any) -> Any:
        self._options.append(("grpc.use_local_subchannel_pool", 1))
        return super()._open(target, creds)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_args(request: pytest.FixtureRequest) -> tuple[str, ...]:
    if request.param == "postgresql":
        return ("--store", request.getfixturevalue("postgres_url"))
    return ()


def _signing_key(tmp_path: Path) -> tuple[Path, object]:
    path = tmp_path / "signing.pem"
    pem = generate_private_pem()
    path.write_bytes(pem)
    path.chmod(0o600)
    return path, load_signing_key(pem, "crossaudit", "test").public


def _forge(url: str, sql_path: Path | None) -> None:
    """As a database writer without the key: delete the newest checkpoint and rewrite a record
    under it with a leaf recomputed from its new values."""

    def execute(sql: str, args: tuple[object, ...] = ()) -> None:
        if sql_path is not None:
            with sqlite3.connect(sql_path, timeout=30) as c:
                c.execute(sql, args)
        else:
            import psycopg

            with psycopg.connect(url) as c:
                c.execute(sql.replace("?", "%s"), args)

    execute("DELETE FROM log_checkpoints WHERE tenant='acme' AND size=?", (SECOND,))
    execute("UPDATE decisions SET action='allow', passed=? WHERE tenant='acme' AND log_seq=?", (1, FORGED_SEQ))

    async def recomputed() -> str:
        store = open_store(url)
        try:
            rows = await store.log_rows("acme", start=FORGED_SEQ, limit=1)
        finally:
            await store.aclose()
        return leaf_hash(leaf_document(rows[0].values, FORGED_SEQ)).hex()

    execute(
        "UPDATE decisions SET leaf_hash=? WHERE tenant='acme' AND log_seq=?", (asyncio.run(recomputed()), FORGED_SEQ)
    )


def test_no_worker_signs_over_a_deleted_newest_checkpoint(tmp_path: Path, store_args: tuple[str, ...]) -> None:
    signing, public = _signing_key(tmp_path)
    extra = ("--workers", "2", "--set", f"evidence.signing_key_file={signing}", *store_args)
    with ServerProcess(tmp_path / "srv", extra=extra) as srv:
        with Client(srv.address, api_key=key("acme")) as x:  # one channel: one worker, X, signs both
            x.deploy_policy(KEYWORDS)
            for i in range(SECOND):
                x.evaluate("keywords", f"p{i}", "bad" if i % 2 else "fine", timeout=30)
                if i + 1 == FIRST:
                    assert x.verify_log([public]).covered == FIRST  # type: ignore[list-item]
            assert x.verify_log([public]).covered == SECOND  # type: ignore[list-item]
        url = store_args[1] if store_args else str(tmp_path / "srv" / "data" / "crossaudit.db")
        _forge(url, None if store_args else Path(url))
        for _ in range(ATTEMPTS):
            with OwnConnection(srv.address, api_key=key("acme")) as c:  # a new connection: either worker
                try:
                    report = c.verify_log([public])  # type: ignore[list-item]
                except CrossAuditError as e:
                    assert e.code == ErrorCode.FAILED_PRECONDITION, repr(e)
                    assert f"checkpoint {SECOND}" in str(e), str(e)
                else:
                    got = f"ok={report.ok} covered={report.covered} unsigned={report.uncovered}"
                    raise AssertionError(f"a worker served the forged history: {got}")
        pub = tmp_path / "pub.pem"
        pub.write_text(run_cli("audit", "key", "--private", str(signing), sandbox=None).stdout)
        res = run_cli("audit", "verify", "--key", str(pub), server=srv, api_key=key("acme"))
        assert res.returncode != 0, res.stdout + res.stderr
        assert f"checkpoint {SECOND}" in res.stdout + res.stderr
        assert "internal" not in (res.stdout + res.stderr).lower()
        assert "not signing the decision log of tenant acme" in srv.log.read_text()


# --- the replay cap -------------------------------------------------------------------------------

OPERATOR_KEY_ENV = "WORKERS_E2E_OPERATOR_KEY"
REPLAY_CAP = 2
REPLAYERS = 8  # each on its own connection: all on one worker is 1 in 2**7
RECORDS = 40  # retained decisions each replay re-evaluates, a page of PAGE at a time
PAGE = 4
RECORDED = custom_policy(
    "recorded", returns('{"score": 1.0}'), evaluator="e", rules=["r"], settings={"retention": {"inputs": "7d"}}
)
# a changed evaluator: replay runs it again for every record, a little CPU each
CANDIDATE = custom_policy(
    "recorded",
    "def evaluate(prompt, response, context):\n    n = 0\n    for i in range(300000):\n        n += i\n"
    '    return {"score": 1.0, "details": {"n": n}}\n',
    evaluator="e",
    rules=["r"],
)


def _replay_keys() -> str:
    return (
        f"tenants:\n  acme:\n    keys: [{TENANT_KEYS['acme']}]\n    retention: {{inputs: 7d}}\n"
        f"  globex: [{TENANT_KEYS['globex']}]\n"
    )


@contextlib.contextmanager
def _replay_server(tmp_path: Path, store_args: tuple[str, ...]) -> Iterator[ServerProcess]:
    extra = (
        "--workers", "2", "--set", f"retention.operator_key_env={OPERATOR_KEY_ENV}",
        "--set", f"limits.max_concurrent_replays_per_tenant={REPLAY_CAP}",
        "--set", f"limits.replay_page_size={PAGE}", "--set", "limits.replay_concurrency=1", *store_args,
    )  # fmt: skip
    env = {OPERATOR_KEY_ENV: base64.b64encode(os.urandom(32)).decode()}
    with ServerProcess(tmp_path, extra=extra, keys_text=_replay_keys(), env=env) as srv:
        with Client(srv.address, api_key=key("acme")) as c:
            c.deploy_policy(RECORDED)
            for i in range(RECORDS):
                c.evaluate("recorded", "p", f"r{i}", timeout=30)
        yield srv


@pytest.fixture
def replay_server(tmp_path: Path, store_args: tuple[str, ...]) -> Iterator[ServerProcess]:
    with _replay_server(tmp_path, store_args) as srv:
        yield srv


def _replays_at_once(srv: ServerProcess, n: int) -> tuple[int, int, list[str]]:
    """``n`` replays started together, each on its own connection: (admitted, refused, events).
    Events: "first" when one was admitted (its first page) or refused, "end" when an admitted
    one finished; every "first" before any "end" means they all overlapped."""
    events: list[str] = []
    admitted, refused = [], []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def one() -> None:
        seen = []

        def progress(_p: object) -> None:
            if not seen:
                seen.append(1)
                with lock:
                    events.append("first")
                    admitted.append(1)

        with OwnConnection(srv.address, api_key=key("acme")) as c:
            c.list_policies()  # connected before the barrier
            start.wait(60)
            try:
                c.replay_policy(CANDIDATE, "recorded", ReplayOptions(), progress=progress, timeout=300)
            except QuotaExceededError as e:
                assert "max_concurrent_replays_per_tenant" in str(e)
                with lock:
                    events.append("first")
                    refused.append(1)
                return
        with lock:
            events.append("end")

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return len(admitted), len(refused), events


def test_the_replay_cap_holds_across_workers(replay_server: ServerProcess) -> None:
    admitted, refused, events = _replays_at_once(replay_server, REPLAYERS)
    assert admitted + refused == REPLAYERS
    assert "end" not in events[:REPLAYERS], f"the replays did not overlap: {events}"  # the test's premise
    assert admitted == REPLAY_CAP, f"{admitted} replays admitted at once against a cap of {REPLAY_CAP}"


RESTART_WAIT_S = 120.0  # bound on the supervisor replacing both killed workers


def test_replay_slots_of_killed_workers_are_free_at_once(tmp_path: Path) -> None:
    """Both workers killed with SIGKILL while they run the tenant's replays: the replacements
    admit a whole cap of replays (the kernel dropped the dead holders' locks: nothing expires)."""
    from tests.e2e.test_workers import metrics, workers_of

    with _replay_server(tmp_path, ()) as srv:
        running = threading.Event()
        outcomes: list[str] = []

        def long_replay() -> None:
            with OwnConnection(srv.address, api_key=key("acme")) as c:
                try:
                    c.replay_policy(CANDIDATE, "recorded", ReplayOptions(), progress=lambda _p: running.set())
                    outcomes.append("finished")
                except CrossAuditError as e:
                    outcomes.append(type(e).__name__)

        threads = [threading.Thread(target=long_replay) for _ in range(REPLAY_CAP)]
        for t in threads:
            t.start()
        assert running.wait(RESTART_WAIT_S)
        killed = workers_of(srv)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(RESTART_WAIT_S)
        deadline = time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline:
            now = workers_of(srv)
            if len(now) == 2 and not set(killed) & set(now) and metrics(srv)["crossaudit_workers"] == 2:
                break  # two replacements, both serving
            time.sleep(0.2)
        assert metrics(srv)["crossaudit_worker_restarts_total"] >= 2
        assert "finished" not in outcomes, outcomes  # the kill came while they ran
        admitted, refused, _ = _replays_at_once(srv, REPLAY_CAP)
        assert (admitted, refused) == (REPLAY_CAP, 0)
