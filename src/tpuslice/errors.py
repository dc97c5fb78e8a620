"""One exception hierarchy for tpuslice.

Every error subclasses :class:`TPUSliceError` and the builtin that Ray 2.60's ``ray.util.tpu``
raises in the same situation, so code written against Ray keeps catching what it caught.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AmbiguousPodTypeError",
    "AttemptRecord",
    "DiscoveryFailedError",
    "HostHungError",
    "HostLostError",
    "InsufficientSlicesError",
    "InvalidAcceleratorError",
    "InvalidArgumentError",
    "InvalidResourceError",
    "InvalidTopologyError",
    "NoSubsliceParentError",
    "NotConnectedError",
    "ReservationTimeoutError",
    "RetriesExhaustedError",
    "SliceShutdownError",
    "SliceUnhealthyError",
    "SubsliceUnavailableError",
    "TPUInUseError",
    "TPUSliceError",
    "TokenAuthError",
]


class TPUSliceError(Exception):
    """Base class of every error tpuslice raises on purpose."""


# --- bad input (ValueError, as in Ray) ------------------------------------------------------


class InvalidArgumentError(TPUSliceError, ValueError):
    """An argument is out of range or of the wrong form (num_slices=0, slice_index=7, ...)."""


class InvalidAcceleratorError(InvalidArgumentError):
    """The accelerator version or type names no TPU generation we know."""


class InvalidTopologyError(InvalidArgumentError):
    """The topology is malformed or not offered for that generation."""


class AmbiguousPodTypeError(InvalidTopologyError):
    """A pod type such as ``v4-32`` fits more than one topology."""


class InvalidResourceError(InvalidArgumentError):
    """A resource request (chips per VM, TPU per bundle, label selectors) cannot be met."""


# --- reservation (TimeoutError, as in Ray) ------------------------------------------------


class ReservationTimeoutError(TPUSliceError, TimeoutError):
    """No idle whole slice could be reserved within the timeout."""


class InsufficientSlicesError(ReservationTimeoutError):
    """The cluster does not have (and cannot grow to have) the slices asked for. Raised at
    once; a TimeoutError because Ray 2.60 reports the same situation as a timeout."""


class SubsliceUnavailableError(ReservationTimeoutError, RuntimeError):
    """No idle sub-slice within the timeout. Also a RuntimeError, as Ray 2.60 raises when
    every sub-slice is busy."""


class NoSubsliceParentError(InsufficientSlicesError, ValueError):
    """No slice of the cluster can hold the sub-slice asked for. Also a ValueError, as Ray
    2.60 raises when no parent topology is found."""


# --- runs (RuntimeError) ------------------------------------------------------------------


class SliceShutdownError(TPUSliceError, RuntimeError):
    """The slice was shut down (or is being shut down) while work was placed on it."""


class NotConnectedError(TPUSliceError, RuntimeError):
    """Ray is not initialised (reserving needs a cluster), or there is no slice context
    (``current_host()`` outside a task started by tpuslice)."""


class TokenAuthError(TPUSliceError, ConnectionError):
    """The cluster requires token authentication and this driver's token is missing, wrong
    or unreadable. A ConnectionError, as Ray's ``ray.init`` raises for a refused token.

    Args:
        message: What was asked, what was found, and what to set.
        address: The cluster's address.
    """

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.address))


class HostLostError(TPUSliceError, RuntimeError):
    """A host of a slice died or became unreachable while it ran our work."""


class HostHungError(HostLostError):
    """Hosts of a gang sent no :func:`tpuslice.heartbeat` within ``heartbeat_timeout_s`` (or
    none at all within ``startup_timeout_s``)."""


class QueueUnreachableError(TPUSliceError, RuntimeError):
    """The cluster-wide slice queue could not be reached."""


class DiscoveryFailedError(TPUSliceError, RuntimeError):
    """A slice's physical layout could not be learned (for sub-slices): it could not be
    reserved whole in time, or a host reported no chip coordinates (no libtpu)."""


class TPUInUseError(TPUSliceError, RuntimeError):
    """A host's TPU is owned by another process (libtpu allows one), so this one could not
    open it. Names the owner's pid, command and Ray job, where libtpu gives only a pid.

    Args:
        message: What happened and what to do.
        host: ``<slice name>/<worker id>`` (or the host name) of the host.
        owner: The owning process, if it was found.
    """

    def __init__(self, message: str, host: str = "", owner: object = None) -> None:
        super().__init__(message)
        self.host = host
        self.owner = owner

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.host, self.owner))


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a resilient run: where it ran, how it ended, how long it took.

    Attributes:
        attempt: The attempt's number, from 1.
        outcome: How it ended: a :class:`tpuslice.Outcome` value (``"preemption"``).
        cause: What ended it, in one line.
        evidence: What decided its outcome (a notice seen, none seen, silent hosts).
    """

    attempt: int
    slice_names: tuple[str, ...]
    num_hosts: int
    outcome: str
    cause: str
    duration_s: float
    evidence: str = ""


class RetriesExhaustedError(TPUSliceError, RuntimeError):
    """A resilient run used up a retry budget; ``history`` holds every attempt.

    Args:
        message: What was exhausted, and what to do.
        history: Every attempt of the run, in order (kept as a tuple).
    """

    def __init__(self, message: str, history: Sequence[AttemptRecord]) -> None:
        super().__init__(message)
        self.history: tuple[AttemptRecord, ...] = tuple(history)
        self.account: Any = None
        """The run's goodput account (a :class:`tpuslice.Account`), once the run ended."""


class SliceUnhealthyError(RetriesExhaustedError):
    """A resilient run with health checks found only slices that failed their check, so a
    retry would land on a failed host again."""


# --- message helpers ----------------------------------------------------------------------


def did_you_mean(value: str, candidates: Iterable[str]) -> str:
    """Return ``"; did you mean 'x'?"`` for the closest candidate, or ``""`` if none is close.

    Args:
        value: What the user typed.
        candidates: The valid values.

    Returns:
        A suffix for an error message.
    """
    matches = difflib.get_close_matches(value, list(candidates), n=1, cutoff=0.5)
    return f"; did you mean '{matches[0]}'?" if matches else ""


def first_line(error: BaseException | str, limit: int = 300) -> str:
    """The first non-blank line of an error's message (or a text), stripped and cut.

    Args:
        error: An exception (its ``str``) or a text.
        limit: Most characters to keep.

    Returns:
        The line, or ``""``.
    """
    for line in str(error).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def listing(values: Iterable[str], limit: int = 12) -> str:
    """Join values for a message, eliding the middle of long lists.

    Args:
        values: The values, in the order to show them.
        limit: Most items to show; longer lists keep the first ``limit - 2`` and the last.

    Returns:
        The values joined by ``", "``, with ``... (N more)`` for those left out.
    """
    items = list(values)
    if len(items) <= limit:
        return ", ".join(items)
    head = ", ".join(items[: limit - 2])
    return f"{head}, ... ({len(items) - limit + 1} more), {items[-1]}"
