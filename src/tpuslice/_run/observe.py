"""What a run tells its observers: timeline events, metrics, goodput accounts; never raising."""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tpuslice._host.notices import Notice
from tpuslice._reserve.observe import describe_request, never_raises
from tpuslice._reserve.reserve import SliceHandle, record_of
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE
from tpuslice.record import events, goodput, metrics

logger = logging.getLogger(__name__)


class Outcome(str, enum.Enum):
    """How a failed attempt ended; it decides which retry budget the attempt uses."""

    PREEMPTION = "preemption"
    """A host of the attempt had a preemption or maintenance notice."""
    FAILURE = "failure"
    """The user's code raised, or something unrecognised went wrong."""
    HOST_FAILURE = "host_failure"
    """A host was lost with no notice: the VM died, a worker crashed or was OOM-killed."""
    HANG = "hang"
    """Hosts stopped beating, or never started."""


EventKind = Literal["started", "notice", "failed", "check_failed", "succeeded", "giving_up"]


@dataclass(frozen=True)
class AttemptEvent:
    """One step of a resilient run, given to ``on_event`` (a ``notice`` also to ``on_notice``)
    as it happens. ``attempt`` counts from 1; ``duration_s`` is since the attempt started;
    ``evidence`` is what decided the outcome."""

    kind: EventKind
    attempt: int
    slice_names: tuple[str, ...] = ()
    outcome: Outcome | None = None
    cause: str = ""
    next_action: str = ""
    duration_s: float = 0.0
    evidence: str = ""
    notice: Notice | None = None

    def describe(self) -> str:
        """One log line.

        Returns:
            ``attempt 2 on v4-16-b: failed after 3.1 s: preemption (...); ...``.
        """
        where = f" on {', '.join(self.slice_names)}" if self.slice_names else ""
        text = f"attempt {self.attempt}{where}: {self.kind.replace('_', ' ')}"
        if self.kind in ("failed", "succeeded"):
            text += f" after {self.duration_s:.1f} s"
        if self.outcome is not None and self.kind == "failed":
            text += f": {self.outcome.value} ({self.cause}); next: {self.next_action}"
        elif self.cause:
            text += f": {self.cause}"
            if self.next_action:
                text += f"; next: {self.next_action}"
        if self.evidence and self.kind == "failed":
            text += f" [evidence: {self.evidence}]"
        return text


@never_raises
def run_ended(
    kind: str, outcome: str, seconds: float, slices: Sequence[str] = (), detail: str = ""
) -> None:
    """A one-shot (``kind``: ``one_shot``) or a ``tpuslice run`` (``command``) ended;
    ``detail`` is read by everyone reading the timeline, so it holds no secrets."""
    text = f"{kind}; {detail}" if detail else kind
    events.record("run", slices=tuple(slices), seconds=seconds, outcome=outcome, detail=text)
    metrics.run_ended(kind, outcome, seconds)


@never_raises
def attempt(event: AttemptEvent) -> None:
    """A step of a resilient run (``started`` steps are not in the metrics)."""
    outcome = "" if event.outcome is None else event.outcome.value
    if event.kind == "succeeded":
        outcome = "success"
    kind = "gave_up" if event.kind == "giving_up" else "attempt"
    seconds = event.duration_s if event.kind in ("failed", "succeeded") else None
    detail = f"attempt {event.attempt} {event.kind.replace('_', ' ')}"
    if event.cause:
        detail += f": {event.cause}"
    if event.next_action:
        detail += f"; next: {event.next_action}"
    if event.evidence:
        detail += f" [evidence: {event.evidence}]"
    events.record(kind, slices=event.slice_names, seconds=seconds, outcome=outcome, detail=detail)
    if event.kind in ("failed", "succeeded"):
        metrics.attempt_ended(outcome)
        metrics.run_ended("resilient_attempt", outcome, event.duration_s)


def one_shot_times(spg: SliceHandle, outcome: str) -> goodput.AttemptTimes | None:
    """A one-shot's moments as its tasks end, read before the hand-back forgets them
    (``None`` if they could not be read)."""
    try:
        held = record_of(spg)
        now = goodput.now()
        return goodput.AttemptTimes(
            asked=held.asked_at,
            queued_s=held.queued_s,
            held=held.held_at,
            ended=now,
            hand_back=now,
            outcome="" if outcome == "interrupted" else outcome,  # not a failure: nothing lost
            slices=tuple(spg.slice_names),
        )
    except Exception as exc:  # noqa: BLE001 - the hand-back follows, whatever happens here
        logger.debug("one-shot's goodput account not kept: %s", exc)
        return None


@never_raises
def one_shot_account(
    spg: SliceHandle, times: goodput.AttemptTimes, prefix: str, keys: Sequence[str]
) -> None:
    """Once a one-shot's slices are back: read its ranks' progress, delete their heartbeat
    keys (under ``prefix``; no rank runs to publish again), keep its goodput account."""
    try:
        times.progress = goodput.read_progress(keys)
    finally:
        _ray.kv_delete(prefix, NAMESPACE, prefix=True)
    what = describe_request(record_of(spg).request)[0]
    outcome = times.outcome or "interrupted"
    goodput.keep(
        goodput.account_of(goodput.new_run_id(), "one_shot", [times], what=what, outcome=outcome)
    )
