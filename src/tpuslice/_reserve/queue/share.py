"""Teams sharing one cluster: tenants' use and fair share. Pure.

With quotas (:class:`~tpuslice._view.quotas.Quotas`), grants go by the *standing* they give
their tenant (within quota, then borrowing, then no quota), then by *weighted usage*: decayed
slice-seconds (:class:`Usage`) over the tenant's weight, as in Kueue's admission fair sharing.
What it guarantees:

- A quota can always be taken back: work beyond its quota is granted only if preemptible, or
  if it fits in the slices no quota covers (rule 7 of :mod:`tpuslice._reserve.queue.schedule`).
- A grant never exceeds a borrow limit (a range request is cut to fit).
- Weights are met over time while every tenant keeps demand (as far as the half-life remembers).
- No starvation while the cluster is not permanently full: a request is passed over only for
  one of a better standing or a lower weighted usage.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tpuslice._view.quotas import DEFAULT_HALF_LIFE_S, Quotas


@dataclass
class Usage:
    """Each tenant's past use in slice-seconds, halving every ``half_life_s``."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    _values: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _decayed(self, value: float, at: float, now: float) -> float:
        return value * math.exp(-math.log(2.0) * max(0.0, now - at) / self.half_life_s)

    def add(self, tenant: str, slice_seconds: float, now: float) -> None:
        """Count use at ``now`` (seconds, any one clock)."""
        value, at = self._values.get(tenant, (0.0, now))
        self._values[tenant] = (self._decayed(value, at, now) + slice_seconds, now)

    def of(self, tenant: str, now: float) -> float:
        """A tenant's use, decayed to ``now`` (0 if never used)."""
        value, at = self._values.get(tenant, (0.0, now))
        return self._decayed(value, at, now)

    def all(self, now: float) -> dict[str, float]:
        """Tenant -> its use decayed to ``now`` (what is stored)."""
        return {t: self.of(t, now) for t in sorted(self._values)}

    @classmethod
    def from_dict(cls, data: Mapping[str, float], at: float, half_life_s: float) -> Usage:
        """Read what :meth:`all` gave at ``at``."""
        usage = cls(half_life_s)
        for tenant, value in data.items():
            usage._values[str(tenant)] = (float(value), at)
        return usage


class UsageMeter:
    """Counts each tenant's slice-seconds from who holds what at each :meth:`tick`;
    thread-safe."""

    def __init__(self, usage: Usage | None = None) -> None:
        self.usage = usage or Usage()
        self._last: float | None = None
        self._lock = threading.Lock()

    def tick(self, held: Mapping[str, int], now: float) -> None:
        """Count the time since the last tick as held by ``held`` (tenant -> slices).

        ``now`` is wall-clock seconds, since the counts are stored.
        """
        with self._lock:
            if self._last is not None and now > self._last:
                for tenant, slices in held.items():
                    if slices:
                        self.usage.add(tenant, slices * (now - self._last), now)
            self._last = now

    def of_all(self, now: float) -> dict[str, float]:
        """Tenant -> its decayed use."""
        with self._lock:
            return self.usage.all(now)

    def with_half_life(self, half_life_s: float, now: float) -> None:
        """Follow a changed half-life, keeping the counts so far."""
        with self._lock:
            if half_life_s != self.usage.half_life_s:
                self.usage = Usage.from_dict(self.usage.all(now), now, half_life_s)


@dataclass(frozen=True)
class Sharing:
    """The quotas and the tenants' decayed use (slice-seconds), for one pass of the policy."""

    quotas: Quotas = field(default_factory=Quotas)
    usage: Mapping[str, float] = field(default_factory=dict)

    def weighted(self, tenant: str) -> float:
        """A tenant's usage over its weight (lower is served first)."""
        return self.usage.get(tenant, 0.0) / self.quotas.weight(tenant)


def held_by(holdings: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Tenant -> slices, added up from ``(tenant, slices)`` pairs."""
    total: dict[str, int] = {}
    for tenant, count in holdings:
        total[tenant] = total.get(tenant, 0) + count
    return total
