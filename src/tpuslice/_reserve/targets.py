"""What a reservation claims: whole slices, or parts of them (:mod:`tpuslice._run.subslices`).
The claiming loop asks its targets which idle ones to take, whether they need head claims
and autoscaler demand, and how to say what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tpuslice._reserve.plan import ReservationPlan, explain, pick_slices, shortage
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo


class Targets(Protocol):
    """The kind of thing a reservation claims."""

    @property
    def head_claims(self) -> bool:
        """Whether each target is claimed through worker 0's head resource."""
        ...

    @property
    def autoscaling(self) -> bool:
        """Whether a waiting reservation shows the autoscaler what it lacks."""
        ...

    def prepare(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Learn what picking needs (may ask the cluster); the snapshot to pick from, a
        fresh one if preparing changed the cluster."""
        ...

    def pick(self, snapshot: ClusterSnapshot, taken: Mapping[int, str]) -> dict[int, SliceInfo]:
        """Idle targets, ``{slice index: target}``, for the indices not in ``taken``
        (index to the slice name held); one with a suspect host only as a last resort."""
        ...

    def shortage(self, snapshot: ClusterSnapshot) -> str | None:
        """Why the cluster as it is can never hold the request (``None``: it can)."""
        ...

    def explain(self, snapshot: ClusterSnapshot) -> str:
        """One sentence on what the cluster has for this request, for timeouts and errors."""
        ...


@dataclass(frozen=True)
class WholeSlices:
    """Idle whole slices of the plan's shape (the usual target). ``least``: the fewest
    that serve (a range's minimum; ``None``: the plan's count); ``time_left``: seconds
    to the deadline."""

    plan: ReservationPlan
    least: int | None = None
    time_left: Callable[[], float | None] = lambda: None

    @property
    def head_claims(self) -> bool:
        return self.plan.needs_head_claim

    @property
    def autoscaling(self) -> bool:
        return True

    def prepare(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        return snapshot

    def pick(self, snapshot: ClusterSnapshot, taken: Mapping[int, str]) -> dict[int, SliceInfo]:
        return pick_slices(
            snapshot, self.plan, taken, least=self.least, time_left_s=self.time_left()
        )

    def shortage(self, snapshot: ClusterSnapshot) -> str | None:
        return shortage(snapshot, self.plan)

    def explain(self, snapshot: ClusterSnapshot) -> str:
        return explain(snapshot, self.plan)
