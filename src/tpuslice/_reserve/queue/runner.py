"""The queue's event loop, without Ray: a driver's :meth:`QueueRunner.wait` is held until its
ticket is granted, can never be, or its time is up, so a waiter costs one call per grant, not a
poll. One task decides: it reads the cluster in a thread (the loop keeps answering), applies the
policy on the loop and wakes the waiters whose answers changed. Slices a hand-back saw free are
granted as its report arrives."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from tpuslice._reserve.queue.book import Answer, Waiting
from tpuslice._reserve.queue.service import Joined, Orders, QueueService, Ticket
from tpuslice._view.queue_record import QueueRecord

logger = logging.getLogger(__name__)

RETRY_S = 1.0
"""After a decision failed (the cluster could not be read), how long before the next."""


class QueueRunner:
    """A queue service, its held asks and its decisions, on the running asyncio loop; its
    public coroutines are what drivers call (``publish`` and ``act`` run in a thread)."""

    def __init__(
        self,
        service: QueueService,
        *,
        publish: Callable[[QueueRecord], None] = lambda record: None,
        act: Callable[[Orders], None] = lambda orders: None,
    ) -> None:
        self.service = service
        self._publish = publish
        self._act = act
        self._wake = asyncio.Event()
        self._asks: dict[str, list[asyncio.Event]] = {}  # ticket -> its held asks
        self._decider: asyncio.Task[None] | None = None
        self.calls = 0  # from drivers
        self.decisions = 0
        self.quick_grants = 0  # decisions that granted freed slices before a read

    async def enqueue(self, ticket: Ticket, arrival: int | None = None) -> int:
        """:meth:`QueueService.enqueue`: add a waiter; its arrival number."""
        number = self.service.enqueue(ticket, arrival)
        self._changed()
        return number

    async def join(self, ticket: Ticket, arrival: int | None, timeout_s: float) -> Joined:
        """:meth:`enqueue`, then :meth:`wait`, in one call."""
        number = await self.enqueue(ticket, arrival)
        return Joined(number, await self.wait(ticket.ticket, timeout_s))

    async def wait(self, ticket: str, timeout_s: float) -> Answer:
        """Where a ticket stands, once it is no longer waiting, or after ``timeout_s``."""
        self._changed(decide=False)
        answer = self.service.answer(ticket)
        if not isinstance(answer, Waiting) or timeout_s <= 0:
            return answer
        event = asyncio.Event()
        self._asks.setdefault(ticket, []).append(event)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        finally:
            self._asks[ticket].remove(event)
            if not self._asks[ticket]:
                del self._asks[ticket]
        return self.service.answer(ticket)

    async def claimed(self, ticket: str) -> None:
        """The driver holds its grant."""
        self.service.claimed(ticket)
        self._changed()

    async def leave(self, ticket: str) -> None:
        """The driver gave up; any grant goes to the next."""
        self.service.leave(ticket)
        self._changed()

    async def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back of these slices ended: grant them now if ``freed``, and decide."""
        self.service.released(slices, freed=freed)
        if freed:
            self._grant_freed()
        self._changed()

    def stop(self) -> None:
        """Stop deciding (the loop is about to close)."""
        if self._decider is not None:
            self._decider.cancel()
            self._decider = None

    def _changed(self, *, decide: bool = True) -> None:
        """Count the call, start the decider if needed, and (``decide``) wake it."""
        self.calls += 1
        if self._decider is None or self._decider.done():
            self._decider = asyncio.get_running_loop().create_task(self._decide_forever())
        if decide:
            self._wake.set()

    async def _decide_forever(self) -> None:
        while True:
            delay = self.service.next_due()
            if delay is None or delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            if not self.service.due():
                continue
            try:
                await self._decide()
            except Exception as exc:  # noqa: BLE001 - the cluster may be briefly unreadable
                logger.warning("the slice queue could not decide: %s; trying again", exc)
                await asyncio.sleep(RETRY_S)

    async def _decide(self) -> None:
        self.service.book.touch(list(self._asks))
        reading = await asyncio.to_thread(self.service.reader())
        self.service.apply(reading)
        self.decisions += 1
        orders = self.service.take_orders()
        if orders:
            await asyncio.to_thread(self._act, orders)
        self._answer_granted()
        await asyncio.to_thread(self._publish, self.service.record())

    def _grant_freed(self) -> None:
        """Grant freed slices from the last read now, even during a read."""
        self.service.book.touch(list(self._asks))  # a read under way may be long
        quick = self.service.quick_reading()
        if quick is not None and self.service.apply(quick):
            self.quick_grants += 1
            self._answer_granted()

    def _answer_granted(self) -> None:
        """Wake the held asks whose tickets are no longer waiting."""
        for ticket, events in list(self._asks.items()):
            if not isinstance(self.service.book.poll_quietly(ticket), Waiting):
                for event in events:
                    event.set()
