"""Injected time: every wait and timeout in tpuslice reads and sleeps through a
:class:`Clock`, so tests of waiting logic need no real waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Clock:
    """Monotonic seconds and a sleep (the real ones by default).

    Attributes:
        now: Monotonic seconds.
        sleep: Waits that many seconds.
    """

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
