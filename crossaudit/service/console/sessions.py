"""Console sessions: a random id in a cookie, mapped server-side to the signed-in principal.

The cookie holds only ``secrets.token_urlsafe(32)``; the table is keyed by its SHA-256, holds
the :class:`~crossaudit.service.principals.Principal` (never the API key) and the session's
CSRF token, and forgets a session after ``session_idle_s`` without use or ``session_max_age_s``
after sign-in (``ConsoleLimits``). At most ``max_sessions`` are held: beyond, the least
recently used is dropped. Sessions live in the server process: a restart signs everyone out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from crossaudit.service.config import ConsoleLimits
from crossaudit.service.principals import Principal

TOKEN_BYTES = 32  # session ids and CSRF tokens: 256 random bits
FAILURE_WINDOW_S = 60.0  # sign-in failures are counted over this window


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def tokens_match(expected: str, given: str | None) -> bool:
    """Constant-time comparison of a CSRF token (a missing one never matches)."""
    if not given or not expected:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def _key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


@dataclass
class Session:
    principal: Principal
    csrf: str
    created: float
    last_seen: float


@dataclass
class Sessions:
    limits: ConsoleLimits
    clock: Callable[[], float] = time.monotonic
    _table: OrderedDict[bytes, Session] = field(default_factory=OrderedDict)
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def create(self, principal: Principal) -> tuple[str, Session]:
        """A new session (a new id at every sign-in: no fixation)."""
        now = self.clock()
        session_id = new_token()
        session = Session(principal, new_token(), now, now)
        self._table[_key(session_id)] = session
        while len(self._table) > self.limits.max_sessions:
            self._table.popitem(last=False)
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id`` (touched), or None (unknown, idle or too old)."""
        if not session_id:
            return None
        key = _key(session_id)
        session = self._table.get(key)
        if session is None:
            return None
        now = self.clock()
        if (
            now - session.last_seen > self.limits.session_idle_s
            or now - session.created > self.limits.session_max_age_s
        ):
            del self._table[key]
            return None
        session.last_seen = now
        self._table.move_to_end(key)
        return session

    def drop(self, session_id: str | None) -> None:
        if session_id:
            self._table.pop(_key(session_id), None)

    def __len__(self) -> int:
        return len(self._table)

    # --- sign-in throttling -------------------------------------------------------------

    def throttled(self, client: str) -> bool:
        """Whether ``client`` (an address) failed too many sign-ins in the last minute."""
        failures = self._failures.get(client)
        if not failures:
            return False
        now = self.clock()
        while failures and now - failures[0] > FAILURE_WINDOW_S:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return False
        return len(failures) >= self.limits.signin_failures_per_minute

    def failed(self, client: str) -> None:
        if len(self._failures) >= self.limits.max_sessions and client not in self._failures:
            self._failures.pop(next(iter(self._failures)))  # bounded: the oldest address goes
        self._failures.setdefault(client, deque(maxlen=self.limits.signin_failures_per_minute)).append(self.clock())
