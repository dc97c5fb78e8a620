"""The claiming loop (``tpuslice.claim.Reserver``) against a scripted cluster. Pure: no Ray.

Ray's calls are replaced on the module: the snapshot is built from synthetic node records,
placement groups are plain objects, and ``wait_all`` says which of them placed.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpuslice import claim
from tpuslice.cluster import build_snapshot
from tpuslice.errors import ReservationTimeoutError
from tpuslice.labels import host_labels, host_resources
from tpuslice.plan import plan_reservation
from tpuslice.topology import slice_shape


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeGroup:
    def __init__(self, bundles: list[dict[str, float]], **_: Any) -> None:
        self.bundles = bundles
        self.is_head = any(key.endswith("-head") for key in bundles[0])


def idle_slice_nodes(name: str) -> list[dict[str, Any]]:
    shape = slice_shape("4x4", "v6e")
    return [
        {
            "NodeID": f"{name}-{w}",
            "NodeManagerAddress": f"10.0.0.{w}",
            "Alive": True,
            "Labels": host_labels(shape, name, w),
            "Resources": {"CPU": 8.0, **host_resources(shape, name, w)},
        }
        for w in range(shape.num_hosts)
    ]


def test_worker_bundles_that_never_place_end_in_a_timeout_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heads place but the worker group never does (here: a bundle no host can hold);
    the loop must honour the timeout, give everything back, and say why."""
    monkeypatch.setenv("TPUSLICE_CLUSTER_CAN_GROW", "0")
    clock = FakeClock()
    made: list[FakeGroup] = []
    removed: list[FakeGroup] = []
    snapshot = build_snapshot(idle_slice_nodes("v6e-16-a"), {})

    def make_group(**kwargs: Any) -> FakeGroup:
        made.append(FakeGroup(**kwargs))
        return made[-1]

    def wait_all(groups: list[FakeGroup], timeout: float) -> list[bool]:
        clock.t += timeout
        return [g.is_head for g in groups]

    monkeypatch.setattr(claim, "read_snapshot", lambda per_chip=None: snapshot)
    monkeypatch.setattr(claim, "placement_group", make_group)
    monkeypatch.setattr(claim, "wait_all", wait_all)
    monkeypatch.setattr(claim, "remove_group", lambda g: g is not None and removed.append(g))
    plan = plan_reservation("4x4", "v6e", resources_per_bundle={"TPU": 4, "CPU": 500})
    reserver = claim.Reserver(plan, 10.0, claim.Clock(clock.now, clock.sleep))

    with pytest.raises(ReservationTimeoutError, match="did not place") as info:
        reserver.run()

    assert "holding 1 of 1" in str(info.value)
    assert 10.0 <= clock.t <= 10.0 + 2 * claim.CLAIM_BOUND_S
    assert reserver.claims == {}
    assert {id(g) for g in made} == {id(g) for g in removed}
