"""What a reservation tells its observers: each call adds an event to the timeline and
records the matching metrics, without waiting on the GCS or raising into the caller."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tpuslice._host.suspects import Suspect
from tpuslice._reserve.request import SliceRequest
from tpuslice.record import events, metrics

logger = logging.getLogger(__name__)
DETAIL_CHARS = 120
"""A failed reservation's event keeps this much of the error's first line."""
_F = TypeVar("_F", bound=Callable[..., None])


def never_raises(function: _F) -> _F:
    """Wrap a function that records an outcome to log what it raises: observing must
    not break what is observed."""

    @functools.wraps(function)
    def observed(*args: Any, **kwargs: Any) -> None:
        try:
            function(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - see above
            logger.debug("could not record %s: %s", function.__name__, exc)

    return observed  # type: ignore[return-value]


def describe_request(request: SliceRequest) -> tuple[str, str]:
    """How a request is named: the event's ``what`` (``"2 x v4 2x2x2"``; a range
    ``1..3 x ...``) and the metrics' ``topology`` tag (``"v4 2x2x2"``: no count, so bounded)."""
    count = request.num_slices
    counted = f"{count[0]}..{count[1]}" if isinstance(count, tuple) else str(count)
    shape = f"{request.accelerator_version} {request.topology}"
    return f"{counted} x {shape}", shape


@never_raises
def reservation_ended(
    request: SliceRequest,
    outcome: str,
    wait_s: float,
    slices: Sequence[str] = (),
    detail: str = "",
) -> None:
    """A reservation was ``granted``, ``timed_out`` or found ``impossible`` (``outcome``)
    ``wait_s`` seconds after it was asked; ``detail``: a failure's first line."""
    what, shape = describe_request(request)
    kind = {"granted": "reserved"}.get(outcome, outcome)
    if len(detail) > DETAIL_CHARS:  # the error itself has it all
        detail = detail[: DETAIL_CHARS - 1].rstrip() + "…"
    events.record(
        kind,
        slices=tuple(slices),
        what=what,
        seconds=wait_s,
        outcome=outcome,
        detail=detail,
        tenant=request.tenant or "",
    )
    metrics.reservation_ended(shape, outcome, wait_s, request.tenant or "")


@never_raises
def released(slices: Sequence[str], held_s: float, request: SliceRequest) -> None:
    """Slices of ``request`` were handed back after ``held_s`` seconds."""
    what = describe_request(request)[0]
    tenant = request.tenant or ""
    events.record("released", slices=tuple(slices), what=what, seconds=held_s, tenant=tenant)


@never_raises
def host_suspected(record: Suspect) -> None:
    """A host was marked suspect."""
    where = f"host {record.worker_id} (node {record.node_id[:12]})"
    events.record(
        "suspect",
        slices=(record.slice_name,),
        seconds=record.until - record.since,
        outcome=record.reason.value,
        detail=f"{where}: {record.evidence}" if record.evidence else where,
    )


@never_raises
def slice_cleared(slice_name: str, records: Sequence[Suspect], why: str = "") -> None:
    """A slice's suspect hosts were trusted again (``why``: what cleared it, if known)."""
    hosts = ", ".join(str(r.worker_id) for r in records)
    detail = f"host(s) {hosts} trusted again" + (f": {why}" if why else "")
    events.record("cleared", slices=(slice_name,), detail=detail)
