"""Teams sharing one cluster: tenants, quotas, borrowing, fair share. Pure.

A *tenant* is whoever a request is charged to (a team, a user): a label, not a
credential. The cluster's :class:`~tpuslice._view.quotas.Quotas` (one record in Ray's
KV store, written by ``tpuslice quota set``) give each configured tenant a *nominal
quota* per kind of slice, a *borrow limit*, a *weight* and a *grace period*. With no
quota configured the queue behaves as it always did: priority, then arrival.

With quotas, each grant is judged by the *standing* it would give its tenant in the
request's kind of slice (:class:`~tpuslice._view.quotas.Standing`):

1. **Within quota** first: the tenant's slices of that kind, with this grant, stay within
   its nominal quota.
2. **Borrowing** next: beyond its quota, within its borrow limit, on slices that no one
   within quota is waiting for.
3. **No quota** last: tenants with no quota share what is left over.

Among heads of the tenants' queues of one standing, the tenant with the lowest *weighted
usage* (slice-seconds with an exponential decay, :class:`Usage`, divided by its weight)
goes first, as in Kueue's admission fair sharing; within a tenant, priority and then
arrival. The queue's other rules apply to tenants too: all or nothing, earmarks, other
kinds, suspects last.

What the policy guarantees:

- **A tenant's quota can always be taken back.** Work beyond its tenant's quota is
  granted only if it is preemptible, or if it fits in the slices of that kind that no
  tenant's quota covers. So whatever runs on a quota's slices that is not its owner's can
  be preempted when the owner asks (rule 7 of :mod:`tpuslice._reserve.queue.schedule`).
- **A borrow limit is never exceeded by a grant.** A range request is cut to fit it.
- **Configured weights are met over time** when every tenant keeps demand: the split of
  slice-seconds between tenants of one standing tends to the split of their weights,
  within what the half-life lets usage remember.
- **No starvation while the cluster is not permanently full.** A request is refused a
  slice only in favour of a request of a better standing or a lower weighted usage; once
  those are served and a slice is idle, it is granted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tpuslice._view.quotas import DEFAULT_HALF_LIFE_S, Quotas


@dataclass
class Usage:
    """Each tenant's past use in slice-seconds, decaying with a half-life.

    Args:
        half_life_s: After this long, a slice-second counts half.
    """

    half_life_s: float = DEFAULT_HALF_LIFE_S
    _values: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _decayed(self, value: float, at: float, now: float) -> float:
        return value * math.exp(-math.log(2.0) * max(0.0, now - at) / self.half_life_s)

    def add(self, tenant: str, slice_seconds: float, now: float) -> None:
        """Count use.

        Args:
            tenant: Whose.
            slice_seconds: How much (slices times seconds).
            now: The time it is counted at (seconds, any clock used consistently).
        """
        value, at = self._values.get(tenant, (0.0, now))
        self._values[tenant] = (self._decayed(value, at, now) + slice_seconds, now)

    def of(self, tenant: str, now: float) -> float:
        """A tenant's use, decayed to ``now``.

        Args:
            tenant: The tenant.
            now: The time.

        Returns:
            Slice-seconds (0 if never used).
        """
        value, at = self._values.get(tenant, (0.0, now))
        return self._decayed(value, at, now)

    def all(self, now: float) -> dict[str, float]:
        """Every tenant's decayed use.

        Args:
            now: The time.

        Returns:
            Tenant -> slice-seconds.
        """
        return {t: self.of(t, now) for t in sorted(self._values)}

    def to_dict(self, now: float) -> dict[str, float]:
        """What to store (every value decayed to ``now``).

        Args:
            now: The time stored with it.

        Returns:
            Tenant -> slice-seconds at ``now``.
        """
        return self.all(now)

    @classmethod
    def from_dict(cls, data: Mapping[str, float], at: float, half_life_s: float) -> Usage:
        """Read what :meth:`to_dict` gave.

        Args:
            data: Tenant -> slice-seconds at ``at``.
            at: When they were stored.
            half_life_s: The half-life.

        Returns:
            The usage.
        """
        usage = cls(half_life_s)
        for tenant, value in data.items():
            usage._values[str(tenant)] = (float(value), at)
        return usage


class UsageMeter:
    """Counts each tenant's slice-seconds as time passes, from who holds what at each
    look (:meth:`tick`); safe to tick and read from different threads.

    Args:
        usage: Where the counts go (with its half-life).
    """

    def __init__(self, usage: Usage | None = None) -> None:
        self.usage = usage or Usage()
        self._last: float | None = None
        self._lock = threading.Lock()

    def tick(self, held: Mapping[str, int], now: float) -> None:
        """Count the time since the last tick as held by ``held``.

        Args:
            held: Tenant -> slices it holds now.
            now: Seconds (wall clock: the counts are stored).
        """
        with self._lock:
            if self._last is not None and now > self._last:
                for tenant, slices in held.items():
                    if slices:
                        self.usage.add(tenant, slices * (now - self._last), now)
            self._last = now

    def of_all(self, now: float) -> dict[str, float]:
        """Every tenant's decayed use.

        Args:
            now: Seconds.

        Returns:
            Tenant -> slice-seconds.
        """
        with self._lock:
            return self.usage.all(now)

    def with_half_life(self, half_life_s: float, now: float) -> None:
        """Follow a changed half-life (the counts so far are kept).

        Args:
            half_life_s: The new half-life.
            now: Seconds.
        """
        with self._lock:
            if half_life_s != self.usage.half_life_s:
                self.usage = Usage.from_dict(self.usage.all(now), now, half_life_s)


@dataclass(frozen=True)
class Sharing:
    """What the policy needs to share slices between tenants in one pass.

    Attributes:
        quotas: The cluster's quotas.
        usage: Tenant -> its decayed past use, in slice-seconds.
    """

    quotas: Quotas = field(default_factory=Quotas)
    usage: Mapping[str, float] = field(default_factory=dict)

    def weighted(self, tenant: str) -> float:
        """A tenant's usage over its weight (lower is served first).

        Args:
            tenant: The tenant.

        Returns:
            Weighted slice-seconds.
        """
        return self.usage.get(tenant, 0.0) / self.quotas.weight(tenant)


def held_by(holdings: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Add up slices by tenant.

    Args:
        holdings: ``(tenant, slices)`` pairs.

    Returns:
        Tenant -> slices.
    """
    total: dict[str, int] = {}
    for tenant, count in holdings:
        total[tenant] = total.get(tenant, 0) + count
    return total
