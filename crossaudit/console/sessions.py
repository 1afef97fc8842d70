"""Console sessions: a random id in a cookie, mapped server-side to the signed-in principal.

The cookie holds only ``secrets.token_urlsafe(32)``; the table is keyed by its SHA-256, holds
the :class:`~crossaudit.service.principals.Principal` (never the API key) and the session's
CSRF token, and forgets a session after ``session_idle_s`` without use or ``session_max_age_s``
after sign-in (``ConsoleLimits``). Sessions live in the server process: a restart signs everyone out.

The table is shared by every tenant, so its bounds are per key and per tenant: a key beyond
``max_sessions_per_key`` signs out its own least recently used session, a tenant beyond
``max_sessions_per_tenant`` one of its own, and a full table (``max_sessions``) refuses the
new sign-in (:class:`SessionsFull`) instead of signing out someone else. Sign-ins are
rate-limited per client address (failures, successes) and per key (successes), so filling even
one's own share takes minutes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from crossaudit.service.config import ConsoleLimits
from crossaudit.service.principals import Principal

TOKEN_BYTES = 32  # session ids and CSRF tokens: 256 random bits
WINDOW_S = 60.0  # sign-ins (failed and successful) are counted over this window
K = TypeVar("K", bytes, str)


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def tokens_match(expected: str, given: str | None) -> bool:
    """Constant-time comparison of a CSRF token (a missing one never matches)."""
    if not given or not expected:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def _key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


def key_id(api_key: str) -> bytes:
    """What the per-key bounds count by: the key's SHA-256 (the key itself is never kept)."""
    return hashlib.sha256(api_key.encode()).digest()


class SessionsFull(Exception):
    """Every session the console may hold is in use: the sign-in is refused (HTTP 503)."""

    # Internal only, not in crossaudit.kernel.errors: the console app answers it as an HTTP page;
    # it never crosses the gRPC edge.


@dataclass
class Session:
    principal: Principal
    csrf: str
    created: float
    last_seen: float
    key: bytes = b""  # key_id() of the key that signed in


@dataclass
class Window:
    """Events per name over the last :data:`WINDOW_S` seconds, at most ``limit`` kept per name and
    ``max_names`` names (beyond, the name seen first is forgotten: memory stays bounded whoever
    sends)."""

    limit: int
    max_names: int
    clock: Callable[[], float]
    _events: dict[object, deque[float]] = field(default_factory=dict)

    def full(self, name: object) -> bool:
        events = self._events.get(name)
        if not events:
            return False
        now = self.clock()
        while events and now - events[0] > WINDOW_S:
            events.popleft()
        if not events:
            del self._events[name]
            return False
        return len(events) >= self.limit

    def add(self, name: object) -> None:
        if name not in self._events and len(self._events) >= self.max_names:
            self._events.pop(next(iter(self._events)))
        self._events.setdefault(name, deque(maxlen=self.limit)).append(self.clock())


def _unindex(index: dict[K, OrderedDict[bytes, None]], name: K, sid: bytes) -> None:
    group = index.get(name)
    if group is not None:
        group.pop(sid, None)
        if not group:
            del index[name]


@dataclass
class Sessions:
    limits: ConsoleLimits
    clock: Callable[[], float] = time.monotonic
    # Ordered by use, but not a cachetools cache: a full table refuses the sign-in instead of
    # evicting another tenant's session, idleness slides with each use, and the per-key and
    # per-tenant bounds evict within their group only.
    _table: OrderedDict[bytes, Session] = field(default_factory=OrderedDict)  # least recently used first
    _by_key: dict[bytes, OrderedDict[bytes, None]] = field(default_factory=dict)
    _by_tenant: dict[str, OrderedDict[bytes, None]] = field(default_factory=dict)
    _failures: Window = field(init=False)
    _signins_by_key: Window = field(init=False)
    _signins_by_client: Window = field(init=False)

    def __post_init__(self) -> None:
        names = self.limits.max_sessions
        self._failures = Window(self.limits.signin_failures_per_minute, names, self.clock)
        self._signins_by_key = Window(self.limits.signins_per_minute_per_key, names, self.clock)
        self._signins_by_client = Window(self.limits.signins_per_minute_per_client, names, self.clock)

    def create(self, principal: Principal, key: bytes) -> tuple[str, Session]:
        """A new session (a new id at every sign-in: no fixation) for ``principal``, signed in
        with the key whose :func:`key_id` is ``key``. Room is made only among that key's, then
        that tenant's sessions; :class:`SessionsFull` when the table is full of others'."""
        now = self.clock()
        self._expire_idle(now)
        mine = self._by_key.get(key, {})
        tenants = self._by_tenant.get(principal.tenant, {})
        if len(mine) >= self.limits.max_sessions_per_key:
            self._remove(next(iter(mine)))
        elif len(tenants) >= self.limits.max_sessions_per_tenant:
            self._remove(next(iter(tenants)))
        if len(self._table) >= self.limits.max_sessions:
            raise SessionsFull(
                f"the console holds {len(self._table)} sessions, its limit (console_limits.max_sessions)"
            )
        session_id = new_token()
        session = Session(principal, new_token(), now, now, key)
        sid = _key(session_id)
        self._table[sid] = session
        self._by_key.setdefault(key, OrderedDict())[sid] = None
        self._by_tenant.setdefault(principal.tenant, OrderedDict())[sid] = None
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id`` (touched), or None (unknown, idle or too old)."""
        if not session_id:
            return None
        sid = _key(session_id)
        session = self._table.get(sid)
        if session is None:
            return None
        now = self.clock()
        if (
            now - session.last_seen > self.limits.session_idle_s
            or now - session.created > self.limits.session_max_age_s
        ):
            self._remove(sid)
            return None
        session.last_seen = now
        self._table.move_to_end(sid)
        self._by_key[session.key].move_to_end(sid)
        self._by_tenant[session.principal.tenant].move_to_end(sid)
        return session

    def drop(self, session_id: str | None) -> None:
        if session_id:
            self._remove(_key(session_id))

    def __len__(self) -> int:
        return len(self._table)

    def count(self, *, key: bytes | None = None, tenant: str | None = None) -> int:
        """Sessions of one key or one tenant."""
        if key is not None:
            return len(self._by_key.get(key, ()))
        return len(self._by_tenant.get(tenant or "", ()))

    def _remove(self, sid: bytes) -> None:
        session = self._table.pop(sid, None)
        if session is None:
            return
        _unindex(self._by_key, session.key, sid)
        _unindex(self._by_tenant, session.principal.tenant, sid)

    def _expire_idle(self, now: float) -> None:
        """Forget sessions idle too long: the table is in order of use, so they are at its front
        (a session past its maximum age is forgotten when next seen)."""
        while self._table:
            sid, oldest = next(iter(self._table.items()))
            if now - oldest.last_seen <= self.limits.session_idle_s:
                return
            self._remove(sid)

    # --- sign-in throttling -------------------------------------------------------------

    def throttled(self, client: str) -> bool:
        """Whether ``client`` (a client key: an address, an IPv6 /64) failed too many sign-ins in
        the last minute."""
        return self._failures.full(client)

    def failed(self, client: str) -> None:
        self._failures.add(client)

    def signins_throttled(self, *, client: str, key: bytes | None = None) -> str | None:
        """Why a sign-in now would be one too many (a message), or None: successful sign-ins are
        limited per client address and per key too, so no one signs in thousands of times."""
        if self._signins_by_client.full(client):
            return (
                f"too many sign-ins from your address (console_limits.signins_per_minute_per_client: "
                f"{self.limits.signins_per_minute_per_client} a minute); wait a minute"
            )
        if key is not None and self._signins_by_key.full(key):
            return (
                f"too many sign-ins with this key (console_limits.signins_per_minute_per_key: "
                f"{self.limits.signins_per_minute_per_key} a minute); wait a minute"
            )
        return None

    def signed_in(self, *, client: str, key: bytes) -> None:
        self._signins_by_client.add(client)
        self._signins_by_key.add(key)
