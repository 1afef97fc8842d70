"""Fair shares of the server's evaluation slots between tenants.

At most ``limits.max_concurrent_evaluations`` decisions are evaluated at once, all tenants
together. While a slot is free a call takes it at once (a counter and a dict: no lock, no store
round trip: admission runs on the event loop). When all are taken, calls wait, and each freed
slot goes to the waiting tenant holding the smallest share of slots for its weight (slots held /
weight; ties to the tenant served least recently in weighted turns), so a tenant flooding the
server with slow calls holds at most its weighted share as soon as another tenant waits, and
the other's calls are admitted at the next freed slot rather than behind the whole flood.

Weights come from the API-keys file (``share:`` of a tenant, default 1, see
:mod:`crossaudit.service.grants`): a tenant of share 2 gets twice the slots of a tenant of
share 1 while both wait. A wait is bounded by the caller's deadline.

No tenant holds more than ``limits.max_concurrent_evaluations_tenant_fraction`` of the slots
(at least one; ``per_tenant`` here), even when the rest are free: what is left is always open to
the other tenants, so a tenant arriving beside a flood is admitted at once instead of at the
flood's next freed slot. A call over its tenant's cap waits in the same fair queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping

from crossaudit.kernel.errors import DeadlineExceededError

SLOTS_KEY = "limits.max_concurrent_evaluations"
TENANT_SLOTS_KEY = "limits.max_concurrent_evaluations_tenant_fraction"


class FairSlots:
    """Slots shared by weighted fair queueing across tenants (see the module docstring)."""

    def __init__(
        self, slots: int, weights: Mapping[str, float] | None = None, *, per_tenant: int | None = None
    ) -> None:
        self.slots = slots
        self.per_tenant = max(1, min(slots, per_tenant if per_tenant is not None else slots))
        self.weights = dict(weights or {})
        self.used = 0
        self.held: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._pass: dict[str, float] = {}  # weighted turns served (stride scheduling's pass)
        self._clock = 0.0  # the pass of the last tenant served: a newly waiting tenant starts here
        self.admitted: list[str] = []  # tenants in the order they were given a slot after waiting (tests)
        self.record_order = False

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def free_for(self, tenant: str) -> bool:
        """Whether :meth:`acquire` would give ``tenant`` a slot at once (no wait)."""
        return self.used < self.slots and self.held.get(tenant, 0) < self.per_tenant

    async def acquire(self, tenant: str, timeout: float) -> None:
        """A slot for ``tenant``: at once when one is free and nobody waits, else in its fair
        turn within ``timeout`` seconds (DeadlineExceededError beyond)."""
        # Free slots with tenants waiting means every waiter is at its cap (release admits the rest).
        if self.free_for(tenant):
            self.used += 1
            self.held[tenant] = self.held.get(tenant, 0) + 1
            return
        queue = self.waiting.get(tenant)
        if queue is None:
            queue = self.waiting[tenant] = deque()
            self._pass[tenant] = max(self._pass.get(tenant, 0.0), self._clock)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=max(0.0, timeout))
        except (TimeoutError, asyncio.CancelledError) as e:
            if fut.done() and not fut.cancelled():  # handed a slot just as the wait ended: give it back
                self.release(tenant)
            else:
                fut.cancel()
                self._forget(tenant, fut)
            if isinstance(e, asyncio.CancelledError):
                raise
            if self.held.get(tenant, 0) >= self.per_tenant:
                reason = f"this tenant holds its {TENANT_SLOTS_KEY} of them ({self.per_tenant})"
            else:
                reason = f"the server is at {SLOTS_KEY} ({self.slots}) and this tenant's fair share of it is taken"
            raise DeadlineExceededError(f"no evaluation slot within the deadline: {reason}") from None

    def release(self, tenant: str) -> None:
        """Free ``tenant``'s slot and hand it to the next tenant in fair order, if any waits."""
        held = self.held.get(tenant, 0) - 1
        if held > 0:
            self.held[tenant] = held
        else:
            self.held.pop(tenant, None)
        self.used -= 1
        while self.waiting and self.used < self.slots:
            eligible = [t for t in self.waiting if self.held.get(t, 0) < self.per_tenant]
            if not eligible:  # every waiting tenant is at its cap: the free slots stay open to others
                return
            nxt = min(eligible, key=lambda t: (self.held.get(t, 0) / self.weight(t), self._pass.get(t, 0.0)))
            queue = self.waiting[nxt]
            fut = queue.popleft()
            if not queue:
                del self.waiting[nxt]
            if fut.done():  # its caller already gave up
                continue
            self._clock = self._pass.get(nxt, 0.0)
            self._pass[nxt] = self._clock + 1.0 / self.weight(nxt)
            self.used += 1
            self.held[nxt] = self.held.get(nxt, 0) + 1
            if self.record_order:
                self.admitted.append(nxt)
            fut.set_result(None)

    def _forget(self, tenant: str, fut: asyncio.Future[None]) -> None:
        queue = self.waiting.get(tenant)
        if queue is None:
            return
        try:
            queue.remove(fut)
        except ValueError:
            return
        if not queue:
            del self.waiting[tenant]
