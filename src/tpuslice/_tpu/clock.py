"""Injected time for the waits whose logic is tested without Ray: a reservation's wait
for slices, a resilient run's back-off and the cluster view's polls read and sleep
through a :class:`Clock`, so their tests need no real waiting. Other waits (a thread's
period, a bound on one Ray call) read the real time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Clock:
    """Monotonic seconds, a sleep, and wall-clock stamps (the real ones by default).

    Attributes:
        now: Monotonic seconds.
        sleep: Waits that many seconds.
        stamp: Wall-clock nanoseconds (a reservation's place in the queue's arrival
            order: when it was asked for, comparable across drivers).
    """

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    stamp: Callable[[], int] = time.time_ns
