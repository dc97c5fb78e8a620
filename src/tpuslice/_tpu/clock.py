"""Injected time for waits whose logic is tested without Ray (a reservation's wait, a
resilient run's back-off, the cluster view's polls); other waits read the real time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Clock:
    """Monotonic seconds, a sleep, and wall-clock nanosecond stamps (a reservation's arrival
    order, comparable across drivers); the real ones by default."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    stamp: Callable[[], int] = time.time_ns
