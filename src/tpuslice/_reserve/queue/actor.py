"""The cluster-wide queue on Ray: a named detached actor on the head node, and the drivers'
handle to it (:class:`RayQueue`). A driver that cannot reach it waits for it, never claims
without it."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import ray

from tpuslice._reserve.queue.agents import start_probe
from tpuslice._reserve.queue.book import LEASE_S, Answer
from tpuslice._reserve.queue.orders import USAGE_SAVE_S, carry_out, read_usage, save_usage
from tpuslice._reserve.queue.runner import QueueRunner
from tpuslice._reserve.queue.service import Joined, QueueService, Ticket
from tpuslice._reserve.queue.share import UsageMeter
from tpuslice._tpu import _ray
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import NAMESPACE, QUEUE_KEY
from tpuslice._tpu.keys import QUEUE_ACTOR_NAME as NAME
from tpuslice._view.cluster import ClusterSnapshot, read_queue_record, read_snapshot
from tpuslice._view.holders import read_holders
from tpuslice._view.queue_record import QueueRecord
from tpuslice._view.quotas import quota_keys, read_quotas
from tpuslice.errors import QueueUnreachableError
from tpuslice.record import metrics
from tpuslice.record.metrics import ClusterReporter
from tpuslice.record.slice_seconds import SliceSeconds

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 2.0
"""How long a driver waits for the queue beyond the time it asked it to hold the call."""
MAX_ASKS = 100_000
"""Calls the actor may hold at once (each waiter holds one)."""
HEAD_NODE_RESOURCE = "node:__internal_head__"
"""Only the head node has it: the queue asks for a sliver, so it does not die with a TPU host."""


class SliceQueueActor(QueueRunner):
    """A :class:`QueueRunner` over the live cluster; restarted, it keeps the places it had."""

    def __init__(self) -> None:
        self._meter = UsageMeter(read_usage())  # counted by an earlier life of this actor
        self._usage_saved = time.time()
        service = QueueService(
            read_snapshot,
            dead_jobs=_ray.dead_jobs,
            reprobe=_reprobe,
            holders=read_holders,
            quotas=read_quotas,
            meter=self._meter,
        )
        last = read_queue_record()  # by an earlier life of this actor
        if last is not None and time.time() - last.at < LEASE_S:
            service.expect(last.requests)
        super().__init__(service, publish=_publish, act=carry_out)
        self._slice_seconds = SliceSeconds()
        # Tenants and pod types whose gauges were set: they go to 0 once the tenant holds none.
        self._tenant_keys: set[tuple[str, str]] = set()
        ClusterReporter(read_snapshot, on_report=self._report).start()

    def _report(self, snapshot: ClusterSnapshot, seconds: float) -> None:
        """Count slice-seconds by state and, with quotas, by tenant (even while no one waits)."""
        self._slice_seconds.add(snapshot, seconds)
        if not snapshot.quotas.configured:
            return
        now = time.time()
        holders = read_holders()
        self._meter.tick(Counter(h.tenant for h in holders.values()), now)
        usage = self._meter.of_all(now)
        held = Counter(
            (holder.tenant, snapshot.slices[name].pod_type)
            for name, holder in holders.items()
            if name in snapshot.slices
        )
        quota = {
            (tenant, quota_keys(key)[0]): count
            for tenant, q in snapshot.quotas.tenants.items()
            for key, count in q.slices.items()
        }
        for key in self._tenant_keys - set(held):
            held[key] = 0
        self._tenant_keys |= set(held)
        metrics.tenant_values(held, quota, usage)
        if now - self._usage_saved >= USAGE_SAVE_S:
            self._usage_saved = now
            save_usage(usage, now)

    async def counts(self) -> dict[str, int]:
        """How busy the queue has been (for benchmarks)."""
        return {
            "calls": self.calls,
            "decisions": self.decisions,
            "reads": self.service.reads,
            "quick_grants": self.quick_grants,
        }

    async def pid(self) -> int:
        """This process's id (tests kill it to see the queue come back)."""
        return os.getpid()


def _publish(record: QueueRecord) -> None:
    _ray.kv_put(QUEUE_KEY, record.to_json(), NAMESPACE)


def _reprobe(node_ids: Sequence[str]) -> None:
    start_probe(node_ids)()


_remote_queue = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=MAX_ASKS)(SliceQueueActor)


class RayQueue:
    """A driver's handle to the queue actor (the :class:`~.service.SliceQueue` on Ray); a call
    raises QueueUnreachableError if the actor does not answer within ``CALL_TIMEOUT_S`` beyond
    the time it may hold the call."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def join(self, ticket: Ticket, arrival: int | None, timeout_s: float) -> Joined:
        """Enqueue and wait (joining again with the same ticket is harmless)."""
        if not ticket.job:
            ticket = replace(ticket, job=_ray.current_job_id())
        joined: Joined = self._get(
            self.handle.join.remote(ticket, arrival, timeout_s), timeout_s + CALL_TIMEOUT_S
        )
        return joined

    def wait(self, ticket: str, timeout_s: float) -> Answer:
        """Where a ticket stands, once granted or never grantable, or after ``timeout_s``."""
        answer: Answer = self._get(
            self.handle.wait.remote(ticket, timeout_s), timeout_s + CALL_TIMEOUT_S
        )
        return answer

    def claimed(self, ticket: str) -> None:
        """Report the grant held (not waited for)."""
        self.handle.claimed.remote(ticket)

    def leave(self, ticket: str) -> None:
        """Leave the queue (not waited for)."""
        self.handle.leave.remote(ticket)

    def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back ended, ``freed`` if it saw Ray's view show the slices free (waited for,
        or a driver exiting right after would drop the call)."""
        ray.wait([self.handle.released.remote(list(slices), freed=freed)], timeout=CALL_TIMEOUT_S)

    def ping(self, timeout_s: float) -> None:
        """Wait until the actor answers, at most ``timeout_s``."""
        self._get(self.handle.counts.remote(), timeout_s)

    def _get(self, ref: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayActorError as exc:
            # Dead for good (killed, or past its restarts): look it up again next time.
            forget(self)
            raise QueueUnreachableError(f"the slice queue is gone: {exc}") from exc
        except (ray.exceptions.RayError, ConnectionError) as exc:
            raise QueueUnreachableError(f"the slice queue did not answer: {exc}") from exc


START_WAIT_S = 60.0
"""How long a cluster's set-up waits for the queue to answer (a new process on the head)."""


class KnownQueue:
    """The handle to the cluster's queue that a connection found (a part of it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handle: RayQueue | None = None


def slice_queue() -> RayQueue:
    """The cluster's queue, created on the head node if there is none (cached); raises
    QueueUnreachableError if it can neither be found nor created."""
    known = connection().part(KnownQueue)
    with known.lock:
        if known.handle is not None:
            return known.handle
        try:
            try:
                handle = ray.get_actor(NAME, namespace=NAMESPACE)
            except ValueError:  # none yet
                handle = _remote_queue.options(
                    name=NAME,
                    namespace=NAMESPACE,
                    lifetime="detached",
                    get_if_exists=True,
                    resources={HEAD_NODE_RESOURCE: 0.001},
                ).remote()
        except (ray.exceptions.RayError, ConnectionError, ValueError) as exc:
            raise QueueUnreachableError(f"could not find or start the slice queue: {exc}") from exc
        known.handle = RayQueue(handle)
        return known.handle


def start_queue(timeout_s: float = START_WAIT_S) -> None:
    """Start the cluster's queue and wait for it to answer (a cluster set-up step); raises
    QueueUnreachableError if it could not be found or created, or did not answer in time."""
    slice_queue().ping(timeout_s)


def notify_released(slices: Sequence[str], *, freed: bool = False) -> None:
    """Tell the cluster's queue, if one runs, that a hand-back ended, so it decides now
    (``freed``: Ray's view showed the slices free, so it may grant them before a read)."""
    if not slices or not ray.is_initialized():
        return
    queue = connection().part(KnownQueue).handle
    try:
        if queue is None:
            queue = RayQueue(ray.get_actor(NAME, namespace=NAMESPACE))
        queue.released(slices, freed=freed)
    except ValueError:  # no queue on this cluster: no one waits
        return
    except (ray.exceptions.RayError, ConnectionError) as exc:
        logger.debug("could not tell the slice queue of a hand-back: %s", exc)


def forget(queue: RayQueue) -> None:
    """Drop the cached handle if it is ``queue``, whose actor died for good."""
    known = connection().part(KnownQueue)
    with known.lock:
        if known.handle is queue:
            known.handle = None
