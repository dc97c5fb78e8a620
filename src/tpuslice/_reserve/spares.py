"""Spare owners: one idle owner per TPU host, per driver, up before it is needed.

A held slice's first call would otherwise wait for an owner process on every host (see
:mod:`tpuslice._reserve.owners`): about 1 s each for Python and Ray's imports, several seconds on
this project's simulator, where 16 simulated hosts share 2 cores. An owner whose bundle
is a whole host's TPU holds no Ray resources, so it can outlive its slice, or start
before one is reserved. At a hand-back, an owner that never opened the TPU stays up as
the spare on its host (:meth:`SpareOwners.keep`); where an owner had to go, the driver
starts a new spare (:meth:`SpareOwners.refill`). The next slice held there adopts it.
A spare holds no TPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpuslice._host.host_owner import RemoteOwner

SPARE_IDLE_S = 600.0
"""A spare owner unused for this long is stopped (at this driver's next reservation)."""


@dataclass
class Spare:
    """An owner started on a host ahead of use.

    Attributes:
        handle: The :class:`~tpuslice._host.host_owner.HostOwner` actor.
        pid: The ref of its ``ping``, which resolves once its process is up.
        started: When it was asked for (monotonic seconds).
    """

    handle: Any
    pid: Any
    started: float = field(default_factory=time.monotonic)

    def state(self) -> str:
        """Where it stands, without waiting.

        Returns:
            ``"up"`` once it answered, ``"starting"`` until then, ``"failed"`` if it died
            before use (its host died, or it was stopped).
        """
        done, _ = ray.wait([self.pid], timeout=0)
        if not done:
            return "starting"
        try:
            ray.get(done[0])
        except ray.exceptions.RayError:
            return "failed"
        return "up"


class SpareOwners:
    """At most one idle owner per TPU host for this driver's job (see the module
    docstring). An owner that was never used runs nothing and holds no TPU, so a spare
    never needs the hand-back check; it ends with this driver's job, or after
    :data:`SPARE_IDLE_S` unused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str], Spare] = {}
        """(job id, node id) -> the spare: a job's actors die with it, so a driver that
        connects again (a new job) starts afresh."""

    def take(self, node_id: str) -> Spare:
        """This job's spare on a node (up or still starting), or a new owner there.

        It is replaced at the hand-back (:meth:`refill`), not now: a process starting
        on the host would compete with the first call for its CPU.

        Args:
            node_id: The host.

        Returns:
            The owner, now this caller's.
        """
        with self._lock:
            spare = self._idle.pop((_job(), node_id), None)
        if spare is not None and spare.state() != "failed":
            return spare
        return _start_pinned(node_id)

    def keep(self, spares: Mapping[str, Spare]) -> None:
        """Owners that stay up after a hand-back become this job's spares on their hosts
        (one per host: a spare already there is stopped).

        Args:
            spares: The owners, by node id (see
                :meth:`~tpuslice._reserve.owners.Owners.take_clean`).
        """
        if not spares:
            return
        job, now = _job(), time.monotonic()
        with self._lock:
            old = [self._idle.pop((job, node), None) for node in spares]
            for node, spare in spares.items():
                self._idle[job, node] = Spare(spare.handle, spare.pid, now)
        for extra in old:
            if extra is not None:
                ray.kill(extra.handle, no_restart=True)

    def refill(self, node_ids: Collection[str]) -> None:
        """Start a spare on each of these hosts that has none (not waited for), and stop
        spares left unused too long.

        Args:
            node_ids: Live TPU hosts.
        """
        if not ray.is_initialized():
            return
        job, now = _job(), time.monotonic()
        with self._lock:
            stale = [k for k, s in self._idle.items() if now - s.started > SPARE_IDLE_S]
            old = [self._idle.pop(key) for key in stale]
            for node in set(node_ids):
                if (job, node) not in self._idle:
                    self._idle[job, node] = _start_pinned(node)
        for spare in old:
            ray.kill(spare.handle, no_restart=True)

    def count(self) -> int:
        """Spares this driver holds for its current job (started or starting).

        Returns:
            How many.
        """
        job = _job()
        with self._lock:
            return sum(1 for j, _ in self._idle if j == job)


def _job() -> str:
    return str(ray.get_runtime_context().get_job_id())


def _start_pinned(node_id: str) -> Spare:
    """A new owner on ``node_id``, holding no Ray resources (its slice's bundle holds the
    TPU); it dies with its host, or with this driver."""
    handle = RemoteOwner.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
    ).remote()
    return Spare(handle, handle.ping.remote())


SPARES = SpareOwners()
"""This process's spare owners."""
