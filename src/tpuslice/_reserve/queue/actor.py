"""The cluster-wide queue on Ray: one named detached actor, and the drivers' handle to it.

The actor (``tpuslice-queue`` in namespace ``tpuslice``, on the head node, restarted by
Ray if it dies) is an async actor running a :class:`~tpuslice._reserve.queue.runner.QueueRunner`
over the live cluster: a driver's ask is held until its ticket is granted, decisions are
made when something changes, and each decision's record goes to Ray's KV store. Drivers
reach it through :class:`RayQueue`. It admits every whole-slice reservation: a driver
that cannot reach it waits for it (see :func:`slice_queue`), and never claims without it.
The handle found is the connection's (:class:`KnownQueue`), so a reconnection finds the
new cluster's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import ray

from tpuslice._reserve.queue.agents import start_probe
from tpuslice._reserve.queue.book import LEASE_S, Answer
from tpuslice._reserve.queue.orders import USAGE_SAVE_S, carry_out, read_usage, save_usage
from tpuslice._reserve.queue.runner import QueueRunner
from tpuslice._reserve.queue.service import Joined, QueueService, Ticket
from tpuslice._reserve.queue.share import UsageMeter, held_by
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
"""How long a driver waits for the queue to answer (it may be starting or restarting),
beyond the time it asked the queue to hold the call."""
MAX_ASKS = 100_000
"""Calls the actor may hold at once (each waiter holds one)."""
HEAD_NODE_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only; the queue asks for a sliver of it, so it
does not live (and die) on a TPU host."""


class SliceQueueActor:
    """The queue actor's body: a :class:`QueueRunner` over the live cluster, publishing
    to Ray's KV store, learning of dead drivers from Ray's job table. Restarted, it keeps
    the places of the waiters its last record lists, while they come back."""

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
        self.runner = QueueRunner(service, publish=_publish, act=carry_out)
        self._slice_seconds = SliceSeconds()
        self._tenant_keys: set[tuple[str, str]] = set()
        """Tenants and pod types whose gauges were set: they go to 0, not stay, once
        the tenant holds none."""
        # The cluster's gauges, its slice-seconds by state, and the tenants' use.
        ClusterReporter(read_snapshot, on_report=self._report).start()

    def _report(self, snapshot: ClusterSnapshot, seconds: float) -> None:
        """Each look of the reporter: count slice-seconds by state and, with quotas
        set, by tenant (the queue decides only while someone waits; use goes on)."""
        self._slice_seconds.add(snapshot, seconds)
        if not snapshot.quotas.configured:
            return
        now = time.time()
        holders = read_holders()
        self._meter.tick(held_by((h.tenant, 1) for h in holders.values()), now)
        usage = self._meter.of_all(now)
        held: dict[tuple[str, str], int] = {}
        for name, holder in holders.items():
            info = snapshot.slices.get(name)
            if info is not None:
                key = (holder.tenant, info.pod_type)
                held[key] = held.get(key, 0) + 1
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

    async def join(self, ticket: Ticket, arrival: int | None, timeout_s: float) -> Joined:
        """See :meth:`QueueRunner.join`.

        Args:
            ticket: The request.
            arrival: Its original arrival number.
            timeout_s: How long to hold the call at most.

        Returns:
            Its arrival number and the answer.
        """
        return await self.runner.join(ticket, arrival, timeout_s)

    async def wait(self, ticket: str, timeout_s: float) -> Answer:
        """See :meth:`QueueRunner.wait`.

        Args:
            ticket: The ticket.
            timeout_s: How long to hold the call at most.

        Returns:
            The answer.
        """
        return await self.runner.wait(ticket, timeout_s)

    async def claimed(self, ticket: str) -> None:
        """See :meth:`QueueRunner.claimed`.

        Args:
            ticket: The ticket.
        """
        await self.runner.claimed(ticket)

    async def leave(self, ticket: str) -> None:
        """See :meth:`QueueRunner.leave`.

        Args:
            ticket: The ticket.
        """
        await self.runner.leave(ticket)

    async def released(self, slices: Sequence[str], freed: bool = False) -> None:
        """See :meth:`QueueRunner.released`.

        Args:
            slices: Their names.
            freed: The hand-back saw Ray's view show them free.
        """
        await self.runner.released(slices, freed=freed)

    async def counts(self) -> dict[str, int]:
        """How busy the queue has been (for benchmarks).

        Returns:
            ``calls`` from drivers, ``decisions``, cluster ``reads``, and
            ``quick_grants`` (decisions that granted freed slices before a read) so far.
        """
        runner = self.runner
        return {
            "calls": runner.calls,
            "decisions": runner.decisions,
            "reads": runner.service.reads,
            "quick_grants": runner.quick_grants,
        }

    async def pid(self) -> int:
        """This process's id (tests kill it to see the queue come back).

        Returns:
            The pid.
        """
        import os

        return os.getpid()


def _publish(record: QueueRecord) -> None:
    _ray.kv_put(QUEUE_KEY, record.to_json(), NAMESPACE)


def _reprobe(node_ids: Sequence[str]) -> None:
    start_probe(node_ids)()


_remote_queue = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=MAX_ASKS)(SliceQueueActor)


class RayQueue:
    """A driver's handle to the queue actor (every call bounded by ``CALL_TIMEOUT_S``).

    Args:
        handle: The actor handle.
    """

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def join(self, ticket: Ticket, arrival: int | None, timeout_s: float) -> Joined:
        """Enqueue (again, with ``arrival``, to keep a place), held until the ticket is
        granted or can never be, or ``timeout_s`` passed. Joining again with the same
        ticket is harmless (a queue still starting may get several copies).

        Args:
            ticket: The request.
            arrival: Its arrival number.
            timeout_s: How long the actor may hold the call.

        Returns:
            Its arrival number and the answer.

        Raises:
            QueueUnreachableError: the queue did not answer (yet).
        """
        if not ticket.job:
            ticket = replace(ticket, job=_ray.current_job_id())
        joined: Joined = self._get(
            self.handle.join.remote(ticket, arrival, timeout_s), timeout_s + CALL_TIMEOUT_S
        )
        return joined

    def wait(self, ticket: str, timeout_s: float) -> Answer:
        """Where a ticket stands, once granted (or never grantable), or after at most
        ``timeout_s``; asking renews its lease.

        Args:
            ticket: The ticket.
            timeout_s: How long the actor may hold the call.

        Returns:
            The answer.

        Raises:
            QueueUnreachableError: the queue did not answer.
        """
        answer: Answer = self._get(
            self.handle.wait.remote(ticket, timeout_s), timeout_s + CALL_TIMEOUT_S
        )
        return answer

    def claimed(self, ticket: str) -> None:
        """Report the grant held (not waited for).

        Args:
            ticket: The ticket.
        """
        self.handle.claimed.remote(ticket)

    def leave(self, ticket: str) -> None:
        """Leave the queue (not waited for).

        Args:
            ticket: The ticket.
        """
        self.handle.leave.remote(ticket)

    def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back ended: waited for, within :data:`CALL_TIMEOUT_S` (a driver that
        exits right after its hand-back would otherwise drop the call, and the slices
        would wait for the queue's next periodic look).

        Args:
            slices: Their names.
            freed: The hand-back saw Ray's view show them free.
        """
        ray.wait([self.handle.released.remote(list(slices), freed)], timeout=CALL_TIMEOUT_S)

    def ping(self, timeout_s: float) -> None:
        """Wait until the actor answers.

        Args:
            timeout_s: How long to wait.

        Raises:
            QueueUnreachableError: it did not answer in time.
        """
        self._get(self.handle.counts.remote(), timeout_s)

    def _get(self, ref: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayActorError as exc:
            # Dead for good (killed, or past its restarts): look again next time.
            forget(self)
            raise QueueUnreachableError(f"the slice queue is gone: {exc}") from exc
        except (ray.exceptions.RayError, ConnectionError) as exc:
            raise QueueUnreachableError(f"the slice queue did not answer: {exc}") from exc


START_WAIT_S = 60.0
"""How long a cluster's set-up waits for the queue to answer (:func:`start_queue`):
its first start is a new worker process on the head node, slow on a loaded machine."""


class KnownQueue:
    """The handle to the cluster's queue that a connection found (a part of it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handle: RayQueue | None = None


def slice_queue() -> RayQueue:
    """The cluster's queue, created on the head node if there is none (cached).

    Returns:
        A handle to it.

    Raises:
        QueueUnreachableError: it could neither be found nor created.
    """
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
    """Have the cluster's queue running and answering, and wait for it (a cluster
    set-up step: the queue is then up before any reservation needs it). If it does
    not answer within ``timeout_s``, the first reservations wait for it instead.

    Args:
        timeout_s: How long to wait for it to answer.

    Raises:
        QueueUnreachableError: it could neither be found nor created, or did not
            answer within ``timeout_s``.
    """
    slice_queue().ping(timeout_s)


def notify_released(slices: Sequence[str], *, freed: bool = False) -> None:
    """Tell the cluster's queue, if one runs, that a hand-back of these slices ended,
    so it decides now rather than at its next periodic look. Best effort (waited for
    within a bound; never starts a queue; a queue that misses it sees the slices at that look).

    Args:
        slices: The slices handed back.
        freed: The hand-back saw Ray's view show them free (the queue may then grant
            them before it reads the cluster again).
    """
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
    """Drop the cached handle if it is ``queue`` (whose actor died for good), so that
    the next :func:`slice_queue` finds or starts the cluster's queue again.

    Args:
        queue: The handle whose actor died.
    """
    known = connection().part(KnownQueue)
    with known.lock:
        if known.handle is queue:
            known.handle = None
