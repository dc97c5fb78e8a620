"""Injected time: every wait and timeout in tpuslice reads and sleeps through a
:class:`Clock`, so tests of waiting logic need no real waiting."""

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
