"""Teams sharing one cluster: tenants' use and fair share. Pure. With quotas, grants go by the
*standing* they give their tenant (within quota, borrowing, no quota), then by *weighted usage*
(decayed slice-seconds over the tenant's weight), as in Kueue's admission fair sharing. Work
beyond a quota is granted only if preemptible or on slices no quota covers, so a quota can always
be taken back; a grant never exceeds a borrow limit; a request is passed over only for one of
better standing or lower weighted usage (no starvation)."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpuslice._view.quotas import DEFAULT_HALF_LIFE_S, Quotas


@dataclass
class Usage:
    """Each tenant's past use in slice-seconds, halving every ``half_life_s``."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    _values: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, tenant: str, slice_seconds: float, now: float) -> None:
        """Count use at ``now`` (seconds, any one clock)."""
        self._values[tenant] = (self.of(tenant, now) + slice_seconds, now)

    def of(self, tenant: str, now: float) -> float:
        """A tenant's use, decayed to ``now`` (0 if never used)."""
        value, at = self._values.get(tenant, (0.0, now))
        return value * math.exp(-math.log(2.0) * max(0.0, now - at) / self.half_life_s)

    def all(self, now: float) -> dict[str, float]:
        """Tenant -> its use decayed to ``now`` (what is stored)."""
        return {t: self.of(t, now) for t in sorted(self._values)}

    @classmethod
    def from_dict(cls, data: Mapping[str, float], at: float, half_life_s: float) -> Usage:
        """Read what :meth:`all` gave at ``at``."""
        return cls(half_life_s, {str(t): (float(v), at) for t, v in data.items()})


class UsageMeter:
    """Counts each tenant's slice-seconds from who holds what at each :meth:`tick`; thread-safe."""

    def __init__(self, usage: Usage | None = None) -> None:
        self.usage = usage or Usage()
        self._last: float | None = None
        self._lock = threading.Lock()

    def tick(self, held: Mapping[str, int], now: float) -> None:
        """Count the time since the last tick as held by ``held`` (tenant -> slices); ``now`` is
        wall-clock seconds, since the counts are stored."""
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
