"""A reservation's place in the cluster-wide queue, kept by its arrival number."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import replace

from tpuslice._reserve.queue.book import Answer, Granted, Unknown, Waiting
from tpuslice._reserve.queue.service import SliceKind, SliceQueue, Ticket

logger = logging.getLogger(__name__)


def this_driver() -> str:
    """``pid 123 on host-a``: who is waiting, for status."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


class QueuePlace:
    """One reservation's ticket, and the queue's last answer (for progress and timeouts).
    ``time_left`` gives the seconds to the deadline (``None``: none), sent with each enqueue;
    ``only`` names the slices its label selectors accept (``None``: any of its kind)."""

    def __init__(
        self,
        queue: SliceQueue,
        kind: SliceKind,
        count: tuple[int, int],
        priority: int,
        time_left: Callable[[], float | None] = lambda: None,
        *,
        tenant: str = "",
        preemptible: bool = False,
        arrival: int | None = None,
        only: frozenset[str] | None = None,
    ) -> None:
        self.queue = queue
        self.time_left = time_left
        self.ticket = Ticket(
            ticket=uuid.uuid4().hex[:12],
            kind=kind,
            count=count,
            priority=priority,
            who=this_driver(),
            job="",
            tenant=tenant,
            preemptible=preemptible,
            only=None if only is None else tuple(sorted(only)),
        )
        self.arrival = arrival
        self.joined = False  # whether the queue answered a join (one unanswered may be pending)
        self.last: Answer | None = None

    def join(self, timeout_s: float) -> Answer:
        """Enqueue (again, keeping the arrival number), held until granted or ``timeout_s``.
        Raises QueueUnreachableError if the queue did not answer (a pending call is not lost)."""
        self.ticket = replace(self.ticket, time_left_s=self.time_left())
        joined = self.queue.join(self.ticket, self.arrival, timeout_s)
        self.joined = True
        self.arrival = joined.arrival
        self.last = joined.answer
        return joined.answer

    def wait(self, timeout_s: float) -> Answer:
        """Where the ticket stands; one the queue forgot is enqueued again in the same place."""
        answer = self.queue.wait(self.ticket.ticket, timeout_s)
        if isinstance(answer, Unknown):
            logger.info("the slice queue lost ticket %s; queueing again", self.ticket.ticket)
            answer = self.join(timeout_s)
        if isinstance(answer, Waiting) and answer != self.last:
            logger.debug("queued for %s: position %d", self.ticket.kind.key, answer.position)
        self.last = answer
        return answer

    def requeue(self) -> None:
        """Give a grant back and wait again in the same place (a granted slice was taken, or
        its group did not place). The new ticket is enqueued before the old one leaves, or a
        decision between the two could grant the slices to a later waiter."""
        old = self.ticket.ticket
        self.ticket = replace(self.ticket, ticket=uuid.uuid4().hex[:12])
        try:
            self.join(0.0)
        finally:
            self.queue.leave(old)

    def claimed(self) -> None:
        """The grant is held: the ticket leaves the queue."""
        self.queue.claimed(self.ticket.ticket)

    def leave(self) -> None:
        """Give up: the ticket, and any grant, leave the queue."""
        self.queue.leave(self.ticket.ticket)

    def describe(self) -> str:
        """Where the reservation stood, for a timeout's message (``position 3 ..., behind ...``)."""
        answer = self.last
        if isinstance(answer, Waiting) and answer.position:
            why = f"; {answer.reason}" if answer.reason else ""
            if not answer.ahead:
                return f"first in the cluster's queue{why}"
            behind = "; ".join(answer.ahead)
            return f"position {answer.position} in the cluster's queue, behind: {behind}{why}"
        if isinstance(answer, Granted):
            return f"granted {', '.join(answer.slices)} by the queue, not yet placed"
        return "waiting in the cluster's queue"
