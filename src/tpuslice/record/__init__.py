"""What everything else records into: the slice timeline (``events``), Ray metrics
(``metrics``), run goodput accounts (``goodput``), the cluster's slice-seconds by state
(``slice_seconds``); and the names a reader needs, loaded on first use (no Ray on import).

May import: :mod:`tpuslice._view` and below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuslice._tpu import _process

_EXPORTS: dict[str, str] = {
    "SliceEvent": "tpuslice.record.events",
    "read_events": "tpuslice.record.events",
    "Account": "tpuslice.record.goodput",
    "read_accounts": "tpuslice.record.goodput",
    "read_slice_seconds": "tpuslice.record.slice_seconds",
}
"""Each public name and its module (the modules themselves load as submodules)."""

if TYPE_CHECKING:
    from tpuslice.record import events, goodput, metrics, slice_seconds
    from tpuslice.record.events import SliceEvent, read_events
    from tpuslice.record.goodput import Account, read_accounts
    from tpuslice.record.slice_seconds import read_slice_seconds


def __getattr__(name: str) -> Any:
    return _process.load(__name__, _EXPORTS, name, globals())


def __dir__() -> list[str]:
    return _process.listing(globals(), __all__)


__all__ = [
    "Account",
    "SliceEvent",
    "events",
    "goodput",
    "metrics",
    "read_accounts",
    "read_events",
    "read_slice_seconds",
    "slice_seconds",
]
