"""Goodput: where every second of a run went, from asking for slices to handing them back.

Each run's :class:`Account` cuts its wall time into :data:`CATEGORIES`, which sum to it,
from the moments the driver saw and the gang published (rules: ``docs/observability.md``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tpuslice._host.heartbeats import Progress
from tpuslice._tpu import _ray
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import GOODPUT_KEY_PREFIX, NAMESPACE
from tpuslice.record import events, metrics

__all__ = ["CATEGORIES", "LOST_CAUSES", "Account", "flush", "read_accounts"]

logger = logging.getLogger(__name__)

CATEGORIES = (
    "queued",
    "reserving",
    "starting",
    "productive",
    "checkpointing",
    "lost",
    "recovering",
    "handing_back",
)
"""Where a run's wall time goes; they sum to it."""
LOST_CAUSES = ("preemption", "host_failure", "hang", "failure")
"""Why work was lost: the failed attempt's class."""
MAX_ACCOUNTS = 500
"""The store keeps about this many accounts (the newest)."""


def new_run_id() -> str:
    """A run id: 12 hex digits, unique in practice, short enough to type."""
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class GangProgress:
    """What a gang's ranks published, taken together: the earliest first beat, the newest
    checkpoint (and its step), and the most checkpoints and checkpointing time of any one
    rank (ranks save together, so their times overlap)."""

    first_beat: float | None = None
    checkpoint_at: float | None = None
    checkpoint_s: float = 0.0
    checkpoints: int = 0
    step: int | None = None

    @classmethod
    def of_published(cls, published: Mapping[str, bytes], keys: Sequence[str]) -> GangProgress:
        """Take together the records published under the gang's keys (one per rank)."""
        return cls.of(Progress.decode(published.get(key)) for key in keys)

    @classmethod
    def of(cls, ranks: Iterable[Progress | None]) -> GangProgress:
        """Take together the ranks' records (``None`` for a rank that published none)."""
        found = [p for p in ranks if p is not None]
        if not found:
            return cls()
        marked = [p for p in found if p.checkpoint_at is not None]
        newest = max(marked, key=lambda p: p.checkpoint_at or 0.0) if marked else None
        return cls(
            first_beat=min(p.first for p in found),
            checkpoint_at=None if newest is None else newest.checkpoint_at,
            checkpoint_s=max((p.checkpoint_s for p in found), default=0.0),
            checkpoints=max((p.checkpoints for p in found), default=0),
            step=None if newest is None else newest.step,
        )


@dataclass
class AttemptTimes:
    """The moments of one attempt, as the driver saw them (wall clock, seconds): of the time
    from ``asked`` to ``held`` (None: never held), ``queued_s`` waiting for a grant; ``ended``
    when its calls returned or it was judged failed; ``outcome`` ``success``, the failure's
    class, or empty if it never ran; ``first_return`` an actor group's set-up. ``only_call``:
    its one call is its work (a one-shot or an attempt), so without beats the whole call
    counts as starting, not only up to a first return."""

    asked: float
    queued_s: float = 0.0
    held: float | None = None
    ended: float | None = None
    hand_back: float | None = None
    handed_back: float | None = None
    outcome: str = ""
    progress: GangProgress = field(default_factory=GangProgress)
    first_return: float | None = None
    only_call: bool = True
    slices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Account:
    """Where one run's wall time went."""

    run_id: str
    kind: str
    """``resilient``, ``one_shot``, ``command`` or ``actor_group``."""
    what: str
    """The request, as ``<count> x <accelerator> <topology>``."""
    started_at: float
    """When it asked for slices (wall clock)."""
    wall_s: float
    """From then to the end of its last hand-back."""
    seconds: Mapping[str, float]
    """Category -> seconds, every one of :data:`CATEGORIES`; they sum to ``wall_s``."""
    lost: Mapping[str, float]
    """Cause -> seconds lost to it (they sum to ``seconds["lost"]``)."""
    attempts: int
    outcome: str
    """``success``, the last failure's class, or ``gave_up``."""
    slices: tuple[str, ...] = ()
    """The slices of its last attempt."""
    checkpoints: int = 0
    notes: tuple[str, ...] = ()
    """What the account could not see, in words (no heartbeats, no checkpoints)."""
    job: str = ""

    @property
    def at(self) -> float:
        """When the run ended: its key in the store sorts by it."""
        return self.started_at + self.wall_s

    @property
    def goodput(self) -> float:
        """Productive seconds over wall seconds, 0 to 1 (0 for a run of no time)."""
        return self.seconds.get("productive", 0.0) / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The account as JSON-ready data.

        Returns:
            Its fields, with ``goodput`` added.
        """
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "what": self.what,
            "started_at": self.started_at,
            "wall_s": self.wall_s,
            "goodput": self.goodput,
            "seconds": {c: self.seconds.get(c, 0.0) for c in CATEGORIES},
            "lost": {c: self.lost.get(c, 0.0) for c in LOST_CAUSES},
            "attempts": self.attempts,
            "outcome": self.outcome,
            "slices": list(self.slices),
            "checkpoints": self.checkpoints,
            "notes": list(self.notes),
            "job": self.job,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Account:
        """Read back :meth:`to_dict`'s output.

        Args:
            data: What :meth:`to_dict` gave.

        Returns:
            The account.

        Raises:
            KeyError: a field is missing.
            TypeError: a field has the wrong type.
            ValueError: a number is not one.
        """
        return cls(
            run_id=str(data["run_id"]),
            kind=str(data["kind"]),
            what=str(data.get("what", "")),
            started_at=float(data["started_at"]),
            wall_s=float(data["wall_s"]),
            seconds={c: float(data["seconds"].get(c, 0.0)) for c in CATEGORIES},
            lost={c: float(data.get("lost", {}).get(c, 0.0)) for c in LOST_CAUSES},
            attempts=int(data.get("attempts", 0)),
            outcome=str(data.get("outcome", "")),
            slices=tuple(str(s) for s in data.get("slices", ())),
            checkpoints=int(data.get("checkpoints", 0)),
            notes=tuple(str(n) for n in data.get("notes", ())),
            job=str(data.get("job", "")),
        )


class _Spans:
    """Cuts a run's life into consecutive spans from a cursor that only moves forward, so
    they cover the wall time exactly once whatever order the moments came in."""

    def __init__(self, start: float) -> None:
        self.cursor = start
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.lost = dict.fromkeys(LOST_CAUSES, 0.0)

    def until(self, category: str, moment: float | None, cause: str = "") -> None:
        """Give the time from the cursor to ``moment`` to ``category``."""
        if moment is None or moment <= self.cursor:
            return
        self.seconds[category] += moment - self.cursor
        if category == "lost":
            self.lost[cause if cause in self.lost else "failure"] += moment - self.cursor
        self.cursor = moment

    def take(self, category: str, seconds: float, limit: float, into: str) -> float:
        """Give ``seconds`` (at most up to ``limit``) to ``category``, the rest of the way
        to ``limit`` to ``into``; the order within the span is not known, only the sums."""
        span = max(0.0, limit - self.cursor)
        part = min(max(0.0, seconds), span)
        self.seconds[category] += part
        self.cursor += part
        self.until(into, limit)
        return part


def account_of(
    run_id: str,
    kind: str,
    attempts: Sequence[AttemptTimes],
    *,
    what: str = "",
    slices: Sequence[str] = (),
    outcome: str = "",
    job: str = "",
) -> Account:
    """The account of a run from its attempts' moments, in order (at least one); its
    categories sum to its wall time. Pure. ``slices`` and ``outcome`` default to the last
    attempt's (the slices of the last that held any)."""
    if not attempts:
        raise ValueError("account_of needs at least one attempt")
    spans = _Spans(attempts[0].asked)
    for number, attempt in enumerate(attempts):
        _cut(spans, attempt, retry=number > 0)
    marks = sum(a.progress.checkpoints for a in attempts if a.held is not None)
    return Account(
        run_id=run_id,
        kind=kind,
        what=what,
        started_at=attempts[0].asked,
        wall_s=spans.cursor - attempts[0].asked,
        seconds=spans.seconds,
        lost=spans.lost,
        attempts=sum(1 for a in attempts if a.held is not None),
        outcome=outcome or attempts[-1].outcome or "gave_up",
        slices=tuple(slices) or next((a.slices for a in reversed(attempts) if a.slices), ()),
        checkpoints=marks,
        notes=tuple(_notes(attempts, marks)),
        job=job,
    )


def _cut(spans: _Spans, attempt: AttemptTimes, *, retry: bool) -> None:
    """Give one attempt's time, and the pause before it, to their categories."""
    spans.until("recovering", attempt.asked)  # the pause before a retry
    end_of_reserve = attempt.held if attempt.held is not None else attempt.ended
    if retry:
        spans.until("recovering", end_of_reserve)
    elif end_of_reserve is not None:
        spans.take("queued", attempt.queued_s, end_of_reserve, "reserving")
    if attempt.held is None:  # it never held its slices: nothing ran, nothing to give back
        return
    ended = attempt.ended if attempt.ended is not None else attempt.held
    progress = attempt.progress
    failed = attempt.outcome not in ("", "success")
    spans.until("recovering" if retry else "starting", _start_ends(attempt, ended, failed))
    if failed:
        saved = progress.checkpoint_at
        if saved is not None:
            saved_until = min(max(saved, spans.cursor), ended)
            spans.take("checkpointing", progress.checkpoint_s, saved_until, "productive")
        spans.until("lost", ended, attempt.outcome)
        spans.until("recovering", attempt.hand_back)
    else:
        spans.take("checkpointing", progress.checkpoint_s, ended, "productive")
        spans.until("handing_back", attempt.hand_back)
    spans.until("handing_back", attempt.handed_back)


def _notes(attempts: Sequence[AttemptTimes], marks: int) -> list[str]:
    """What the account could not see, in words."""
    if not any(a.progress.first_beat is not None for a in attempts):
        return [
            "no heartbeats: start-up and work could not be told apart, so each call "
            "counts as starting (and a failed attempt's whole run as lost); call "
            "tpuslice.heartbeat() once per step"
        ]
    if marks == 0 and any(a.outcome not in ("", "success") for a in attempts):
        return [
            "no checkpoints marked: all the work of each failed attempt counts as lost; "
            "call tpuslice.checkpointed() after each save"
        ]
    return []


def _start_ends(attempt: AttemptTimes, ended: float, failed: bool) -> float:
    """When an attempt's start-up ended: its first beat; without beats, its first return
    (an actor group) or the end (a failed call is lost whole instead)."""
    held = attempt.held if attempt.held is not None else ended
    first = attempt.progress.first_beat
    if first is not None:
        return min(max(first, held), ended)
    if failed:
        return held
    if attempt.first_return is not None and not attempt.only_call:
        return min(max(attempt.first_return, held), ended)
    return ended


class AccountWriter(events.EventWriter):
    """Writes the connection's accounts in the background, keeping the newest
    :data:`MAX_ACCOUNTS`."""

    def __init__(self) -> None:
        super().__init__(keep=MAX_ACCOUNTS, prefix=GOODPUT_KEY_PREFIX)


def read_progress(keys: Sequence[str]) -> GangProgress:
    """What a gang published under its keys, one per rank (nothing if Ray cannot answer)."""
    try:
        return GangProgress.of_published(_ray.kv_get_many(list(keys), NAMESPACE), keys)
    except _ray.kv_errors() as exc:
        logger.debug("could not read the gang's progress: %s", exc)
        return GangProgress()


def keep(account: Account) -> Account:
    """Keep a run's account in the store (in the background), the metrics and the log;
    return it with this driver's job id if it had none."""
    if not account.job:
        account = replace(account, job=events.job_id())
    connection().part(AccountWriter).record(account)
    for category in CATEGORIES:
        seconds = account.seconds.get(category, 0.0)
        if seconds > 0 and category != "lost":
            metrics.goodput_seconds(category, seconds)
    for cause in LOST_CAUSES:
        seconds = account.lost.get(cause, 0.0)
        if seconds > 0:
            metrics.goodput_seconds("lost", seconds, cause)
    logger.info(
        "run %s (%s): %.0f%% of its %.1f s productive; `tpuslice goodput %s` shows the rest",
        account.run_id,
        account.kind,
        100 * account.goodput,
        account.wall_s,
        account.run_id,
    )
    return account


def flush(timeout_s: float = 2.0) -> bool:
    """Wait until this process's accounts are in the store.

    Args:
        timeout_s: The most seconds to wait.

    Returns:
        Whether all were.
    """
    return connection().part(AccountWriter).flush(timeout_s)


def read_accounts(limit: int = MAX_ACCOUNTS) -> list[Account]:
    """The newest accounts in the store, oldest first (unreadable ones skipped).

    Args:
        limit: At most this many.

    Returns:
        The accounts.
    """
    return events.read_stored(GOODPUT_KEY_PREFIX, limit, Account.from_dict) if limit > 0 else []


def now() -> float:
    """Wall-clock seconds, as the gang's beats are (a seam for tests)."""
    return time.time()
