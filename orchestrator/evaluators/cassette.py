"""Recorded LLM answers ("cassettes"): the one hook on the LLM adapter's provider call.

:class:`~orchestrator.evaluators.llm.LLMEvaluator` sends every provider (OpenAI, Azure OpenAI,
Anthropic, Google GenAI, OpenAI-compatible) through one call path; while a :class:`Cassette` is
installed (:func:`installed`), that call goes through :meth:`Cassette.answer` instead:

* ``record``: the provider is called as usual and its answer (the completion text the adapter
  parses, its finish reason, token usage and response id) is kept under the request's digest;
  :meth:`Cassette.save` writes one JSON file per policy version, atomically (temporary file,
  then rename), keys sorted.
* ``replay``: the answer comes from the files and nothing else: no SDK client is made, no key
  is read, no socket is opened. A request that was not recorded raises
  :class:`~crossaudit.kernel.errors.CassetteMissError` naming the evaluator and the digest (the
  engine turns it into that rule's error); :meth:`Cassette.check` refuses a policy version the
  directory holds no cassette for, before anything runs.

The request digest is ``sha256:`` + the SHA-256 of the canonical request (sorted-key compact
JSON of provider, model, system prompt, messages and parameters; never the API key nor the
endpoint, so a cassette recorded against one server replays for another). A request recorded
several times (``--repeat``) keeps each answer in order; replay hands them out in that order,
cycling, so a non-deterministic judge replays its spread of answers.

The installed cassette is process-wide (the CLI's in-process runs); the service never installs one.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import re
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from crossaudit.kernel.canonical import canonical_json
from crossaudit.kernel.dsl import EvaluatorType, Policy
from crossaudit.kernel.errors import CassetteMismatchError, CassetteMissError, InvalidInputError

CASSETTE_FORMAT = "crossaudit-cassette/1"  # the "format" field of every cassette file
CASSETTE_SUFFIX = ".json"
DIGEST_PREFIX = "sha256:"
MAX_CASSETTE_FILES = 1_000  # cassette files one replay directory may hold
MAX_CASSETTE_BYTES = 64 * 1024 * 1024  # bytes of one cassette file read back
MAX_REQUESTS_PER_CASSETTE = 100_000  # distinct requests one policy version's cassette may hold
MAX_ANSWERS_PER_REQUEST = 1_000  # answers kept per request (--repeat); later ones are not kept
MAX_MISSES_KEPT = 1_000  # unrecorded requests remembered for the run's summary

Mode = Literal["record", "replay"]
PolicyRef = tuple[str, str]  # (policy name, policy version)
# What one provider call gives the adapter: the completion text and its facts (usage, finish reason, id).
Answer = tuple[str, dict[str, Any]]
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def request_digest(request: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical request (sorted keys, compact separators, UTF-8)."""
    doc = canonical_json(request, ascii=False, stringify=True)
    return DIGEST_PREFIX + hashlib.sha256(doc.encode("utf-8")).hexdigest()


def _plain(value: Any) -> Any:
    """A JSON-able default for the SDKs' usage objects (enums by value, anything else as text)."""
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def _normalized(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The facts as they will read back from the file, so recording and replay give one verdict."""
    return json.loads(json.dumps(dict(meta), sort_keys=True, default=_plain))


def cassette_file_name(ref: PolicyRef) -> str:
    """``<name>@<version>.json``, with characters unsafe in a file name replaced by ``_``."""
    name, version = ref
    return f"{_SAFE.sub('_', name) or '_'}@{_SAFE.sub('_', version) or '_'}{CASSETTE_SUFFIX}"


def uses_llm(policy: Policy) -> bool:
    """Whether an enabled rule of ``policy`` calls an LLM evaluator (primary or fallback)."""
    rules = [r for r in policy.rules if r.enabled]
    names = {n for r in rules for n in r.evaluator_names} | {
        r.fallback.evaluator for r in rules if r.fallback and r.fallback.evaluator
    }
    return any(s.kind is EvaluatorType.LLM and s.name in names for s in policy.evaluators)


@dataclass
class Recorded:
    """One request of a cassette: who sent it and each answer it got."""

    evaluator: str
    provider: str
    model: str
    answers: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"evaluator": self.evaluator, "provider": self.provider, "model": self.model, "answers": self.answers}


class Cassette:
    """Record or replay the LLM answers of a run. Thread-safe (the tester runs its event loop on
    its own thread). Use :meth:`recorder` / :meth:`replayer`, then :func:`installed`."""

    def __init__(self, directory: Path, mode: Mode) -> None:
        self.directory = directory
        self.mode: Mode = mode
        self._lock = threading.Lock()
        self._requests: dict[PolicyRef, dict[str, Recorded]] = {}
        self._files: dict[PolicyRef, Path] = {}  # replay: where each policy version's cassette was read
        self._cursor: dict[tuple[PolicyRef, str], int] = {}
        self.calls = 0  # LLM calls answered (recorded or replayed)
        self.misses: list[CassetteMissError] = []  # replay: requests that were not recorded (first ones)
        self.miss_count = 0

    @classmethod
    def recorder(cls, directory: str | os.PathLike[str]) -> Cassette:
        path = Path(directory)
        if path.exists() and not path.is_dir():
            raise InvalidInputError(f"--record {path}: not a directory")
        return cls(path, "record")

    @classmethod
    def replayer(cls, directory: str | os.PathLike[str]) -> Cassette:
        """Every cassette file of ``directory`` read and checked now (a broken one is refused)."""
        path = Path(directory)
        if not path.is_dir():
            raise InvalidInputError(f"--replay {path}: no such directory")
        cassette = cls(path, "replay")
        files = sorted(p for p in path.iterdir() if p.suffix == CASSETTE_SUFFIX and not p.name.startswith("."))
        if len(files) > MAX_CASSETTE_FILES:
            raise CassetteMismatchError(f"--replay {path}: more than {MAX_CASSETTE_FILES} cassette files")
        for file in files:
            ref, requests = read_cassette(file)
            if ref in cassette._files:
                raise CassetteMismatchError(
                    f"--replay {path}: {cassette._files[ref].name} and {file.name} both hold policy "
                    f"{ref[0]!r} version {ref[1]}: keep one"
                )
            cassette._files[ref] = file
            cassette._requests[ref] = requests
        return cassette

    # -- up front --

    def check(self, policy: Policy) -> None:
        """Only for a policy that calls an LLM (one without LLM rules needs no cassette). Record:
        note the policy version (its file is written even when no call was made, e.g. every LLM
        rule skipped). Replay: refuse a policy version this directory holds no cassette for,
        naming the versions it does hold."""
        if not uses_llm(policy):
            return
        ref = (policy.name, policy.version)
        with self._lock:
            if self.mode == "record":
                self._requests.setdefault(ref, {})
                return
            if ref in self._requests:
                return
            others = sorted(v for n, v in self._requests if n == policy.name)
        if others:
            raise CassetteMismatchError(
                f"--replay {self.directory}: the cassette of policy {policy.name!r} was recorded for version "
                f"{', '.join(others)}, not {policy.version}: record this version with --record"
            )
        raise CassetteMismatchError(
            f"--replay {self.directory}: no cassette for policy {policy.name!r} version {policy.version} "
            "(record one with --record)"
        )

    # -- the hook --

    async def answer(
        self,
        evaluator: str,
        policy: PolicyRef | None,
        request: Mapping[str, Any],
        call: Callable[[], Awaitable[Answer]],
    ) -> Answer:
        """The provider's answer to ``request``: ``call()``'s (recorded) or the recorded one."""
        digest = request_digest(request)
        if self.mode == "replay":
            return self._replay(evaluator, policy, digest)
        text, meta = await call()
        meta = _normalized(meta)
        with self._lock:
            self.calls += 1
            requests = self._requests.setdefault(policy or ("", ""), {})
            if digest not in requests and len(requests) >= MAX_REQUESTS_PER_CASSETTE:
                return text, meta  # answered, not kept: the cassette says how many it holds
            entry = requests.setdefault(
                digest, Recorded(evaluator, str(request.get("provider", "")), str(request.get("model", "")))
            )
            if len(entry.answers) < MAX_ANSWERS_PER_REQUEST:
                entry.answers.append({"text": text, **meta})
        return text, meta

    def _replay(self, evaluator: str, policy: PolicyRef | None, digest: str) -> Answer:
        with self._lock:
            entry = self._requests.get(policy, {}).get(digest) if policy is not None else None
            if entry is None or not entry.answers:
                where = f"policy {policy[0]!r} version {policy[1]}" if policy else "an unknown policy"
                miss = CassetteMissError(
                    f"llm evaluator {evaluator!r}: request {digest} was not recorded in the cassette of {where} "
                    f"(--replay {self.directory}): record it again with --record",
                    evaluator=evaluator,
                    digest=digest,
                )
                self.miss_count += 1
                if len(self.misses) < MAX_MISSES_KEPT:
                    self.misses.append(miss)
                raise miss
            assert policy is not None
            n = self._cursor.get((policy, digest), 0)
            self._cursor[(policy, digest)] = n + 1
            self.calls += 1
            answer = dict(entry.answers[n % len(entry.answers)])
        text = answer.pop("text")
        return text, answer

    # -- files --

    def documents(self) -> dict[PolicyRef, dict[str, Any]]:
        """Each policy version's cassette document (what :meth:`save` writes)."""
        with self._lock:
            return {
                ref: {
                    "format": CASSETTE_FORMAT,
                    "policy": {"name": ref[0], "version": ref[1]},
                    "requests": {d: r.as_json() for d, r in requests.items()},
                }
                for ref, requests in self._requests.items()
                if ref != ("", "")  # calls of evaluators built outside a policy are answered, not kept
            }

    def save(self) -> list[Path]:
        """Record: write one file per policy version (temporary file + rename: never a partial
        file under the final name). Returns the files written."""
        if self.mode != "record":
            return []
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InvalidInputError(f"--record {self.directory}: cannot create: {e.strerror}") from None
        written = []
        for ref, doc in sorted(self.documents().items()):
            target = self.directory / cassette_file_name(ref)
            data = json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
            write_atomically(target, data.encode("utf-8"))
            written.append(target)
        return written


def write_atomically(target: Path, data: bytes) -> None:
    """``data`` under ``target``: written to a temporary file beside it, synced, then renamed."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise InvalidInputError(f"{target}: cannot write: {e.strerror}") from None


def read_cassette(path: Path) -> tuple[PolicyRef, dict[str, Recorded]]:
    """A cassette file's policy version and requests, checked field by field."""

    def bad(why: str) -> CassetteMismatchError:
        return CassetteMismatchError(f"{path}: not a cassette: {why}")

    try:
        if path.stat().st_size > MAX_CASSETTE_BYTES:
            raise bad(f"larger than {MAX_CASSETTE_BYTES} bytes")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CassetteMismatchError(f"{path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"invalid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != CASSETTE_FORMAT:
        raise bad(f'"format" is not {CASSETTE_FORMAT!r}')
    policy = doc.get("policy")
    if not isinstance(policy, dict) or not all(isinstance(policy.get(k), str) for k in ("name", "version")):
        raise bad('"policy" needs a "name" and a "version"')
    raw = doc.get("requests")
    if not isinstance(raw, dict) or len(raw) > MAX_REQUESTS_PER_CASSETTE:
        raise bad(f'"requests" is not an object of at most {MAX_REQUESTS_PER_CASSETTE} requests')
    requests: dict[str, Recorded] = {}
    for digest, entry in raw.items():
        answers = entry.get("answers") if isinstance(entry, dict) else None
        if (
            not digest.startswith(DIGEST_PREFIX)
            or not isinstance(answers, list)
            or not all(isinstance(a, dict) and isinstance(a.get("text"), str) for a in answers)
        ):
            raise bad(f"request {digest[:80]!r}: needs answers, each with a text")
        requests[digest] = Recorded(
            str(entry.get("evaluator", "")),
            str(entry.get("provider", "")),
            str(entry.get("model", "")),
            answers[:MAX_ANSWERS_PER_REQUEST],
        )
    return (policy["name"], policy["version"]), requests


# --- the installed cassette ---------------------------------------------------------------

_installed: Cassette | None = None
_install_lock = threading.Lock()


def active() -> Cassette | None:
    """The cassette LLM calls go through now, if any."""
    return _installed


@contextlib.contextmanager
def installed(cassette: Cassette) -> Iterator[Cassette]:
    """LLM calls made in this process go through ``cassette`` for the duration (one at a time)."""
    global _installed
    with _install_lock:
        if _installed is not None:
            raise InvalidInputError("a cassette is already installed: record or replay one run at a time")
        _installed = cassette
    try:
        yield cassette
    finally:
        with _install_lock:
            _installed = None
