"""Message budgets: how fast a socket may send each kind of message (SPEC 6).

How this works: the hub meters what each socket sends with one token bucket per kind of
message, so that drafts, presence and pings never spend what pushes need. A message over its
budget is not refused: the hub stops reading that socket until the bucket holds a token again
(backpressure), and closes it (`rate_limited`) only when the socket has been held at a budget
for a while without a break, which a replica that paces itself never is. `welcome` tells each
replica the push budget, and the replica paces its pushes within it, putting more records in
each push rather than sending more pushes. Nothing here reads a clock: every call takes `now`.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from .errors import UsageError

__all__ = ["BUDGETS", "Budget", "BudgetKind", "TokenBucket", "pace", "pacer_for"]

BudgetKind = Literal["push", "draft", "status", "control"]
"""What a message spends: `push`; `draft` (draft ops); `status` (presence); `control` (hello,
auth, ping)."""


class Budget(msgspec.Struct, frozen=True, array_like=True):
    """At most `rate` messages a second on average, with bursts of up to `burst` (on the
    wire: `[rate, burst]`)."""

    rate: float
    burst: float


BUDGETS: dict[BudgetKind, Budget] = {
    "push": Budget(2000.0, 4000.0),
    "draft": Budget(200.0, 400.0),
    "status": Budget(20.0, 40.0),
    "control": Budget(10.0, 20.0),
}
"""The hub's defaults; `push` is the `rate` / `rate_burst` settings. A writer at 1,000
records a second stays within the push budget even unbatched, and so within what a replica
paces itself to (0.9 of it); the others are far above what a
replica sends (a replica paces its draft ops within the `draft` budget, a ping goes every
few seconds)."""


def pace(budget: Budget) -> Budget:
    """The budget a replica paces itself by for a hub's `budget`: a tenth slower and half the
    burst, so that the jitter of the network between them never empties the hub's bucket."""
    return Budget(budget.rate * 0.9, max(1.0, budget.burst / 2))


def pacer_for(budget: Budget | None) -> TokenBucket | None:
    """The bucket a replica paces one kind of message by within the hub's `budget` for it
    (None for no budget, or one no bucket can hold: the hub then meters nothing this replica
    needs to mind). It starts full."""
    if budget is None:
        return None
    paced = pace(budget)
    if not (0 < paced.rate < math.inf and 1 <= paced.burst < math.inf):
        return None
    return TokenBucket(paced.rate, paced.burst, 0.0)


class TokenBucket:
    """At most `rate` messages a second on average, with bursts of up to `burst`.

    The bucket starts full; each `take` or `spend` uses a token, time refills them. A clock
    that goes backwards refills nothing (it never drains the bucket either).
    """

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        """A full bucket as of `now`.

        Raises:
            UsageError: `rate` is not positive or `burst` is below 1.
        """
        if not rate > 0 or not burst >= 1:
            raise UsageError("bad_setting", "a rate limit needs rate > 0 and burst >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._last = now

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend `cost` tokens if the bucket holds them; False (and nothing spent) if not."""
        self._refill(now)
        if self._tokens < cost:
            return False
        self._tokens -= cost
        return True

    def spend(self, now: float) -> float:
        """Spend a token even if the bucket is empty; the seconds until it holds none less than
        zero again (0.0: the token was there). The caller waits that long before it takes
        more (backpressure), so the debt never grows past one message."""
        self._refill(now)
        self._tokens -= 1.0
        return -self._tokens / self.rate if self._tokens < 0 else 0.0

    def available(self, now: float) -> float:
        """Tokens the bucket would hold at `now` (no change)."""
        if now <= self._last:
            return self._tokens
        return min(self.burst, self._tokens + (now - self._last) * self.rate)

    def ready_at(self, now: float) -> float:
        """When the bucket holds a whole token (`now` if it does already)."""
        missing = 1.0 - self.available(now)
        return now if missing <= 0 else now + missing / self.rate
