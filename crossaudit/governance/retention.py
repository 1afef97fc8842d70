"""Retained evaluation inputs (docs/retention.md): opt-in, bounded in time, sealed per tenant.

What is retained, and for how long: a tenant's ``retention: {inputs: 7d}`` in the API-keys file
is its ceiling and default (absent: nothing, ever); a policy's ``settings.retention.inputs`` may
shorten it or turn it off; the server's ``retention.max_inputs_s`` caps both; and nothing is
retained without an operator key (:mod:`crossaudit.governance.vault`). A retained decision's
prompt, response, request context, stage and every evaluator result (by its identity, for
replay) are sealed as one blob and written in the audit record's transaction (admission).

:class:`Retention` also erases (by decision, or by a context field through the blind index),
rewraps tenant keys during an operator-key rotation, and runs the purge worker that deletes
expired rows; :meth:`Retention.load` never answers an expired row, purged yet or not.
Nothing here logs, counts or raises retained text: messages name decision ids and sizes only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossaudit.api.records import ErasureRecord, RetainedRecord, TenantKeyRecord
from crossaudit.governance.vault import KEY_BYTES, OperatorKey, OperatorKeys, TenantKey, is_indexable, new_data_key
from crossaudit.kernel.errors import (
    ConfigurationError,
    CrossAuditError,
    InvalidInputError,
    QuotaExceededError,
    RetainedInputsTamperedError,
    RetentionKeyError,
)
from crossaudit.kernel.results import Decision
from crossaudit.service import inputs
from crossaudit.service.config import RetentionConfig, ServerConfig
from crossaudit.service.grants import TenantGrants
from crossaudit.store.base import Store
from orchestrator.policy import Policy

log = logging.getLogger("crossaudit.service.retention")

PAYLOAD_VERSION = 1
LOAD_IDS_KEY = "retention.max_load_ids"
ERASE_BATCHES_KEY = "retention.max_erase_batches"
MAX_DECISION_ID = 256  # a decision id named in an erasure request (the server's are UUIDs)
MAX_FIELD_NAME = 256  # a context field named in an erasure request
MAX_FIELD_VALUE = 64 * 1024  # ... and its value
SKIPPED_LOG_INTERVAL_S = 60.0  # a tenant whose inputs could not be sealed is logged at most this often
DEV_OPERATOR_KEY_FILE = "retention-operator.key"  # in the data directory: `serve --dev --retain-inputs`'s own key
DEV_RETENTION_HINT = "a --dev server retains them with: crossaudit serve --dev --retain-inputs 7d"
SELECTOR_DECISION = "decision"
SELECTOR_CONTEXT_FIELD = "context_field"


@dataclass(frozen=True)
class RetainedInputs:
    decision_id: str
    prompt: str
    response: str
    context: dict[str, Any]
    stage: str
    results: dict[str, dict[str, Any]]  # EvaluatorResult.identity -> EvaluatorResult.model_dump(mode="json")


def effective_seconds(tenant_s: float | None, policy_s: float | None, server_max_s: float, keyed: bool) -> float:
    """How long a decision's inputs are retained (0: not at all): the policy's setting if it has
    one, else the tenant's; never above the tenant's ceiling or the server's maximum; nothing
    without a tenant setting or an operator key."""
    if not keyed or not tenant_s or tenant_s <= 0:
        return 0.0
    asked = tenant_s if policy_s is None else policy_s
    return max(0.0, min(asked, tenant_s, server_max_s))


def results_of(decision: Decision) -> dict[str, dict[str, Any]]:
    """Every evaluator result of ``decision`` that has an identity, keyed by it (replay reuses a
    recorded verdict by identity; one without an identity could never be matched)."""
    out: dict[str, dict[str, Any]] = {}
    for rule in decision.rules:
        for result in rule.evaluators:
            if result.identity:
                out[result.identity] = result.model_dump(mode="json")
    return out


class Retention:
    def __init__(
        self,
        store: Store,
        grants: TenantGrants | None = None,
        config: RetentionConfig | None = None,
        *,
        keys: OperatorKeys | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.grants = grants if grants is not None else TenantGrants()
        self.config = config or RetentionConfig()
        self.keys = keys if keys is not None else load_operator_keys(self.config, environ)
        # Unwrapped tenant keys: one per tenant of the API-keys file (a fixed, operator-given set).
        self._tenant_keys: dict[str, TenantKey] = {}
        self._skipped_logged: dict[str, float] = {}
        self._worker: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.purged = 0  # rows the purge worker deleted since start
        self._ceiling_after = ""  # the last tenant whose rows the purge held to its ceiling

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def period(self, tenant: str, policy: Policy) -> float:
        """Seconds ``policy``'s decisions of ``tenant`` are retained (0: not retained)."""
        settings = policy.settings.retention
        return effective_seconds(
            self.grants.retention.get(tenant),
            settings.inputs_seconds() if settings is not None else None,
            self.config.max_inputs_s,
            self.enabled,
        )

    # --- keys ------------------------------------------------------------------------------

    async def _key(self, tenant: str, *, create: bool) -> TenantKey | None:
        cached = self._tenant_keys.get(tenant)
        if cached is not None:
            return cached
        if self.keys is None:
            dev = f"; {DEV_RETENTION_HINT}" if self.grants.development else ""
            raise RetentionKeyError(
                "no operator key is configured (retention.operator_key_file or retention.operator_key_env): "
                f"retained inputs can be neither written nor read{dev}"
            )
        rec = await self.store.get_tenant_key(tenant)
        if rec is None:
            if not create:
                return None
            data_id, data_key = new_data_key()
            operator_id, wrapped = self.keys.wrap(tenant, data_key)
            rec = await self.store.put_tenant_key(TenantKeyRecord(tenant, data_id, operator_id, wrapped, time.time()))
        data_key = self.keys.unwrap(tenant, rec.operator_key_id, rec.wrapped)
        if rec.operator_key_id != self.keys.current.id:
            await self._rewrap(rec, data_key)
        key = self._tenant_keys[tenant] = TenantKey.of(tenant, rec.key_id, data_key)
        return key

    async def _rewrap(self, rec: TenantKeyRecord, data_key: bytes) -> bool:
        assert self.keys is not None
        operator_id, wrapped = self.keys.wrap(rec.tenant, data_key)
        new = TenantKeyRecord(rec.tenant, rec.key_id, operator_id, wrapped, rec.created_at)
        return await self.store.rewrap_tenant_key(rec.tenant, rec.operator_key_id, new)

    async def rotate(self) -> int:
        """Rewrap under the current operator key every tenant key the previous one wrapped;
        returns how many. Keys wrapped by neither are left (and named in the log)."""
        if self.keys is None:
            return 0
        done, after = 0, ""
        for _ in range(self.config.max_purge_batches):
            current = self.keys.current.id
            # by pages after the last tenant seen: keys no configured key opens stay, and must not
            # stop the pages after them (those may be the previous key's)
            batch = await self.store.list_tenant_keys(
                not_wrapped_by=current, limit=self.config.rewrap_batch, after=after
            )
            for rec in batch:
                try:
                    data_key = self.keys.unwrap(rec.tenant, rec.operator_key_id, rec.wrapped)
                except CrossAuditError as exc:  # names key ids only
                    log.error("retention: cannot rewrap: %s", exc)
                    continue
                done += await self._rewrap(rec, data_key)
            if len(batch) < self.config.rewrap_batch:
                break
            after = batch[-1].tenant
        else:
            log.warning(
                "retention: the rotation stopped after %d page(s) of tenant keys (%s); keys not yet rewrapped "
                "are rewrapped when first used or at the next start",
                self.config.max_purge_batches, "retention.max_purge_batches",
            )  # fmt: skip
        if done:
            log.info("retention: %d tenant key(s) rewrapped under operator key %s", done, self.keys.current.id)
        return done

    # --- write -----------------------------------------------------------------------------

    async def seal(
        self,
        tenant: str,
        policy: Policy,
        decision: Decision,
        environment: str,
        prompt: str,
        response: str,
        context: Mapping[str, Any] | None,
        *,
        stage: str,
        now: float,
    ) -> RetainedRecord | None:
        """The decision's inputs sealed for :meth:`Store.record_decision`, or None when they are
        not retained (not asked for, too large, or the keys are unusable: the decision is
        answered and audited all the same, and the log says why without any text)."""
        period = self.period(tenant, policy)
        if period <= 0:
            return None
        decision_id = decision.decision_id
        ctx = dict(context or {})
        payload = {
            "v": PAYLOAD_VERSION,
            "prompt": prompt,
            "response": response,
            "context": ctx,
            "stage": stage,
            "results": results_of(decision),
        }
        plaintext = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str).encode(
            "utf-8", "surrogatepass"
        )
        cap = self.config.max_inputs_bytes_per_decision
        if len(plaintext) > cap:
            over = f"{len(plaintext)} bytes, over retention.max_inputs_bytes_per_decision={cap}"
            self._skipped(tenant, decision_id, over)
            return None
        try:
            key = await self._key(tenant, create=True)
        except (RetentionKeyError, RetainedInputsTamperedError) as exc:
            self._skipped(tenant, decision_id, str(exc))
            return None
        assert key is not None
        nonce, ciphertext = key.seal(decision_id, plaintext)
        return RetainedRecord(
            tenant=tenant,
            decision_id=decision_id,
            policy=decision.policy,
            environment=environment,
            created_at=now,
            expires_at=now + period,
            key_id=key.id,
            nonce=nonce,
            ciphertext=ciphertext,
            index=self._index(key, ctx),
        )

    def _index(self, key: TenantKey, context: Mapping[str, Any]) -> tuple[str, ...]:
        fields = sorted(name for name, value in context.items() if isinstance(name, str) and is_indexable(value))
        first = [name for name in self.config.erasure_fields if name in context and is_indexable(context[name])]
        rest = [name for name in fields if name not in first]
        chosen = first + rest[: max(0, self.config.max_index_fields - len(first))]
        return tuple(key.blind(name, context[name]) for name in chosen)

    def _skipped(self, tenant: str, decision_id: str, why: str) -> None:
        now = time.monotonic()
        if now - self._skipped_logged.get(tenant, -SKIPPED_LOG_INTERVAL_S) >= SKIPPED_LOG_INTERVAL_S:
            self._skipped_logged[tenant] = now  # tenants of the keys file: bounded
            log.warning("decision %s: inputs not retained: %s", decision_id, why)

    # --- read ------------------------------------------------------------------------------

    async def load(self, tenant: str, decision_ids: Sequence[str]) -> dict[str, RetainedInputs]:
        """Decrypted inputs of those of ``decision_ids`` that are retained, unexpired and not
        erased, in one store round trip per call (batches of up to a few hundred ids)."""
        ids = list(dict.fromkeys(decision_ids))
        if len(ids) > self.config.max_load_ids:
            raise InvalidInputError(
                f"{len(ids)} decision ids in one load, at most {self.config.max_load_ids} ({LOAD_IDS_KEY})"
            )
        if not ids:
            return {}
        now = time.time()
        oldest = now - self.ceiling(tenant)  # a ceiling lowered since they were sealed applies too
        rows = [r for r in await self.store.load_retained(tenant, ids, now) if r.created_at > oldest]
        if not rows:
            return {}
        key = await self._key(tenant, create=False)
        if key is None:
            raise RetentionKeyError(f"tenant {tenant!r} has retained inputs but no data key")
        out: dict[str, RetainedInputs] = {}
        for row in rows:
            if row.key_id != key.id:
                raise RetainedInputsTamperedError(
                    f"the retained inputs of decision {row.decision_id} name another data key than their tenant's"
                )
            out[row.decision_id] = _inputs(row.decision_id, key.open(row.decision_id, row.nonce, row.ciphertext))
        return out

    # --- erase -----------------------------------------------------------------------------

    async def erase(
        self,
        tenant: str,
        *,
        actor: str,
        decision_id: str = "",
        context_field: tuple[str, str] | None = None,
    ) -> ErasureRecord:
        """Remove the retained inputs and the raw audit text of one decision (NotFoundError when
        the tenant has none by that id) or of every retained decision whose context had
        ``field = value``; the erasure is recorded (a digest of the selector, never its value)."""
        if bool(decision_id) == (context_field is not None):
            raise InvalidInputError("erase needs a decision id or a context field (name=value), exactly one")
        now = time.time()
        if decision_id:
            decision_id = inputs.required(decision_id, "decision id", MAX_DECISION_ID)
            digest = hashlib.sha256(f"decision\0{decision_id}".encode()).hexdigest()
            rec = ErasureRecord(str(uuid.uuid4()), tenant, SELECTOR_DECISION, digest, 0, now, actor)
            erased = await self.store.erase_inputs(rec, decision_id=decision_id)
        else:
            assert context_field is not None
            name, value = context_field
            if not name or len(name) > MAX_FIELD_NAME:
                raise InvalidInputError(f"a context field name is 1 to {MAX_FIELD_NAME} characters")
            if len(value) > MAX_FIELD_VALUE:
                raise InvalidInputError(f"a context field value is at most {MAX_FIELD_VALUE} characters")
            key = await self._key(tenant, create=True)
            assert key is not None
            digest = key.blind(name, value)  # keyed: the record cannot be matched against guessed values
            rec = ErasureRecord(str(uuid.uuid4()), tenant, SELECTOR_CONTEXT_FIELD, digest, 0, now, actor)
            erased = await self._erase_batches(rec, digest)
        log.info(
            "tenant %s: erasure %s by %s removed the inputs of %d decision(s) (%s)",
            tenant, erased.id, actor, erased.decisions, erased.selector_kind,
        )  # fmt: skip
        return erased

    async def _erase_batches(self, rec: ErasureRecord, digest: str) -> ErasureRecord:
        """Every decision matching ``digest``, ``erase_batch`` per transaction (a value shared by
        months of decisions must not hold the store's writer, or the server's memory, at once)."""
        batch = self.config.erase_batch
        erased = rec
        for _ in range(self.config.max_erase_batches):
            before = erased.decisions
            erased = await self.store.erase_inputs(rec, blind_index=digest, limit=batch)
            if erased.decisions - before < batch:
                return erased
        log.warning(
            "tenant %s: erasure %s stopped after %d decision(s) at %s=%d; more may remain",
            rec.tenant, rec.id, erased.decisions, ERASE_BATCHES_KEY, self.config.max_erase_batches,
        )  # fmt: skip
        raise QuotaExceededError(
            f"erased {erased.decisions} decision(s) (erasure {rec.id}) and stopped at {ERASE_BATCHES_KEY}="
            f"{self.config.max_erase_batches} transactions; more may match: run the same erasure again",
            setting=ERASE_BATCHES_KEY,
        )

    async def list_erasures(self, tenant: str, *, limit: int = 100) -> list[ErasureRecord]:
        return await self.store.list_erasures(tenant, limit=limit)

    # --- purge -----------------------------------------------------------------------------

    def ceiling(self, tenant: str) -> float:
        """The longest ``tenant``'s inputs may be kept now (0: not at all): its entry in the
        API-keys file, capped by the server's maximum. A row sealed under a longer one is older
        than this ceiling once it is lowered or removed: never loaded, and purged."""
        return effective_seconds(self.grants.retention.get(tenant), None, self.config.max_inputs_s, True)

    async def purge_once(self, now: float | None = None) -> int:
        """Delete expired rows, then each tenant's rows older than its current ceiling, in
        batches of ``purge_batch``, at most ``max_purge_batches`` transactions in all."""
        now = time.time() if now is None else now
        total, budget, batch = 0, self.config.max_purge_batches, self.config.purge_batch
        while budget > 0:
            budget -= 1
            n = await self.store.purge_retained(now, limit=batch)
            total += n
            if n < batch:
                break
        # tenants by their keys (each tenant that ever retained has one), a page at a time,
        # resuming where the last run stopped so that every tenant's turn comes
        while budget > 0:
            budget -= 1
            page = await self.store.list_tenant_keys(  # "": every key (an operator key id is never empty)
                not_wrapped_by="", limit=self.config.rewrap_batch, after=self._ceiling_after
            )
            for rec in page:
                cutoff, done = now - self.ceiling(rec.tenant), False
                while budget > 0 and not done:
                    budget -= 1
                    n = await self.store.purge_retained(now, limit=batch, tenant=rec.tenant, created_before=cutoff)
                    total += n
                    done = n < batch
                if not done:
                    return self._purged(total)  # out of transactions: this tenant first next run
                self._ceiling_after = rec.tenant
            if len(page) < self.config.rewrap_batch:
                self._ceiling_after = ""  # every tenant had its turn: from the first again next run
                break
        return self._purged(total)

    def _purged(self, total: int) -> int:
        self.purged += total
        return total

    def start(self) -> None:
        """Say once whether inputs can be retained, then run rotation and the purge worker
        (needs a running loop)."""
        dev = f" ({DEV_RETENTION_HINT})" if self.grants.development and not self.grants.retention else ""
        if self.keys is None:
            log.info("retention: no operator key configured: no evaluation inputs are retained%s", dev)
        else:
            previous = f", previous key {self.keys.previous.id}" if self.keys.previous else ""
            log.info("retention: operator key %s%s; tenants retaining inputs: %s%s", self.keys.current.id, previous,
                     ", ".join(sorted(self.grants.retention)) or "none", dev)  # fmt: skip
        if self._worker is None:
            self._stop = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="crossaudit-retention-purge")

    async def _run(self) -> None:
        with contextlib.suppress(CrossAuditError):
            await self.rotate()
        while not self._stop.is_set():
            try:
                n = await self.purge_once()
                if n:
                    log.info("retention: purged %d expired row(s)", n)
            except CrossAuditError as exc:  # the store is down: the next run tries again
                log.warning("retention: purge failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.config.purge_interval_s)

    async def aclose(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        self._stop.set()
        try:
            await asyncio.wait_for(worker, self.config.purge_interval_s)
        except (TimeoutError, asyncio.CancelledError):
            worker.cancel()


def with_dev_operator_key(config: ServerConfig) -> ServerConfig:
    """``serve --dev --retain-inputs``: ``config`` naming the operator key the dev tenant's inputs are
    sealed under: the one configured (``retention.operator_key_*``), else :func:`dev_operator_key`.
    Call it once the data directory is locked (private). Any other configuration is returned as is."""
    keys = config.retention
    if not (config.dev and config.retain_inputs_s > 0) or keys.operator_key_file is not None or keys.operator_key_env:
        return config
    path = dev_operator_key(Path(config.data_dir))
    return dataclasses.replace(config, retention=dataclasses.replace(keys, operator_key_file=path))


def dev_operator_key(data_dir: Path) -> Path:
    """The operator key of ``serve --dev --retain-inputs`` in ``data_dir``, made on first use.

    It is written 0600 under a temporary name in the data directory (0700 by then) and linked into
    place, so another local user never reads it and a reader never sees half a key; workers starting
    at once take turns on a lock of the directory, so they agree on one key and none sees a sibling's
    temporary name as a second link. Only its path is logged (its id at start), never the key. A key
    file that is a link, not a regular file, another user's, readable by others or linked elsewhere
    too (planted before the directory was made private) is refused: a key someone else knows would
    seal every retained input for them."""
    path = data_dir / DEV_OPERATOR_KEY_FILE
    what = "the --dev retention operator key"
    try:
        with _dir_lock(data_dir):  # a sibling's link is briefly a second name for the key: look after it
            st = _make_dev_key(path, what)
    except OSError as exc:
        raise ConfigurationError(f"cannot make {what} {path}: {exc.strerror}") from None
    problem = (
        "is not a regular file" if not stat.S_ISREG(st.st_mode)
        else "belongs to another user" if st.st_uid != os.geteuid()
        else f"is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o})" if st.st_mode & 0o077
        else "has other links to it" if st.st_nlink != 1
        else ""
    )  # fmt: skip
    if problem:
        raise ConfigurationError(
            f"{what} {path} {problem}: not used; remove it and start again (a new key is made, inputs retained "
            "under the old one can no longer be read)"
        )
    return path


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` itself, so workers of one server (and threads) take turns."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _make_dev_key(path: Path, what: str) -> os.stat_result:
    if not os.path.lexists(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{DEV_OPERATOR_KEY_FILE}.")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii") + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # a sibling worker made it first: theirs stands
                os.link(tmp, path)
                log.info("retention: generated %s %s (--dev --retain-inputs; owner-only)", what, path)
        finally:
            os.unlink(tmp)
    return os.lstat(path)


def load_operator_keys(config: RetentionConfig, environ: Mapping[str, str] | None = None) -> OperatorKeys | None:
    current = OperatorKey.load(config.operator_key_file, config.operator_key_env, "retention operator key", environ)
    previous = OperatorKey.load(
        config.previous_operator_key_file, config.previous_operator_key_env, "retention previous operator key", environ
    )
    if current is None:
        if previous is not None:
            raise RetentionKeyError("a previous operator key is configured without a current one (retention.*)")
        return None
    if previous is not None and previous.id == current.id:
        previous = None  # the same key twice: nothing to rotate
    return OperatorKeys(current, previous)


def _inputs(decision_id: str, plaintext: bytes) -> RetainedInputs:
    try:
        doc = json.loads(plaintext.decode("utf-8", "surrogatepass"))
        return RetainedInputs(
            decision_id=decision_id,
            prompt=str(doc["prompt"]),
            response=str(doc["response"]),
            context=dict(doc["context"]),
            stage=str(doc["stage"]),
            results={str(k): dict(v) for k, v in doc["results"].items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError):  # authenticated, yet not ours: never guessed at
        raise RetainedInputsTamperedError(f"the retained inputs of decision {decision_id} are not readable") from None
