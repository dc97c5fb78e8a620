"""What a running gang is watched for besides its tasks' errors: notices on its hosts (the
run calls ``on_notice``, then leaves before the hosts go), hangs (silent heartbeats), and the
evidence that tells a lost host's preemption from its failure and names whom to blame."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray

from tpuslice._host.heartbeats import BEAT_ENV, Progress, beat_key
from tpuslice._host.notices import Notice
from tpuslice._host.suspects import Blame, SuspectReason
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import BEAT_KEY_PREFIX as BEAT_PREFIX
from tpuslice._tpu.keys import NAMESPACE
from tpuslice._view.agents import notices_for
from tpuslice._view.cluster import HostInfo
from tpuslice.errors import InvalidArgumentError
from tpuslice.record.goodput import GangProgress

logger = logging.getLogger(__name__)

CHECK_S = 1.0
"""How often a running gang's notices and heartbeats are read (one or two KV calls)."""
NOTICE_MARGIN_S = 2.0
"""Time kept back from a notice's deadline to cancel the gang and give the slices back."""


@dataclass(frozen=True)
class Hang:
    """Ranks that stopped making progress; ``startup``: they never beat at all."""

    ranks: tuple[int, ...]
    startup: bool
    reason: str
    cause: str = ""
    """The ranks with their hosts: ``silent: rank 1 (v4-16-a host 1)``."""

    @property
    def what(self) -> str:
        return "stuck starting" if self.startup else "silent"


def find_hang(
    beats: Sequence[float | None],
    now: float,
    started: float,
    heartbeat_timeout_s: float | None,
    startup_timeout_s: float | None,
) -> Hang | None:
    """Whether a gang hangs, from each rank's last heartbeat (wall clock; ``None``: never).
    Pure. A rank is silent even while others beat: a collective stuck on one host blocks
    them too. ``heartbeat_timeout_s`` bounds silence after a first beat, ``startup_timeout_s``
    the wait for one (``None``: not watched)."""
    never = tuple(r for r, at in enumerate(beats) if at is None)
    if startup_timeout_s is not None and never and now - started > startup_timeout_s:
        return Hang(
            never,
            True,
            f"{len(never)} of {len(beats)} rank(s) sent no heartbeat within "
            f"startup_timeout_s={startup_timeout_s:g} s of the start",
        )
    if heartbeat_timeout_s is None:
        return None
    silent = tuple(
        r for r, at in enumerate(beats) if at is not None and now - at > heartbeat_timeout_s
    )
    if not silent:
        return None
    beating = sum(1 for at in beats if at is not None and now - at <= heartbeat_timeout_s)
    longest = max(now - at for at in beats if at is not None and now - at > heartbeat_timeout_s)
    others = f"while {beating} other(s) still beat" if beating else "as did every other rank"
    return Hang(
        silent,
        False,
        f"{len(silent)} rank(s) silent for up to {longest:.1f} s "
        f"(heartbeat_timeout_s={heartbeat_timeout_s:g}) {others}",
    )


def describe_hang(
    config: WatchConfig,
    keys: Sequence[str],
    published: Mapping[str, bytes],
    ranks: Sequence[str],
    started: float,
    now: float,
) -> Hang | None:
    """Whether a gang hangs, from the records ``published`` under its ranks' ``keys``
    (``ranks`` names each rank with its host, for messages). Pure."""
    records = [Progress.decode(published.get(key)) for key in keys]
    beats = [None if record is None else record.last for record in records]
    hang = find_hang(beats, now, started, config.heartbeat_timeout_s, config.startup_timeout_s)
    if hang is None:
        return None
    return replace(hang, cause=f"{hang.what}: {', '.join(ranks[r] for r in hang.ranks)}")


def _check_timeout(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentError(f"{name} must be seconds > 0 or None, got {value!r}")
    if not 0 < value < math.inf:
        raise InvalidArgumentError(f"{name} must be finite seconds > 0, got {value!r}")


@dataclass(frozen=True)
class WatchConfig:
    """What a resilient run watches its gangs for (timeouts: see :func:`find_hang`)."""

    heartbeat_timeout_s: float | None = None
    startup_timeout_s: float | None = None
    on_notice: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        _check_timeout("heartbeat_timeout_s", self.heartbeat_timeout_s)
        _check_timeout("startup_timeout_s", self.startup_timeout_s)

    @property
    def beats(self) -> bool:
        """Whether ranks are given heartbeat keys."""
        return self.heartbeat_timeout_s is not None or self.startup_timeout_s is not None


class Broken(Exception):
    """Raised by :meth:`AttemptWatch.check`: the gang must stop (``kind``: ``notice`` or
    ``hang``; ``blamed``: a hang's silent hosts)."""

    def __init__(
        self, kind: str, cause: str, evidence: str, blamed: tuple[Blame, ...] = ()
    ) -> None:
        super().__init__(cause)
        self.kind = kind
        self.cause = cause
        self.evidence = evidence
        self.blamed = blamed


def _dead_nodes(nodes: Sequence[str]) -> set[str]:
    """Those of ``nodes`` that Ray sees dead (none when Ray is not connected)."""
    if not ray.is_initialized():
        return set()
    dead = {str(n.get("NodeID")) for n in ray.nodes() if not n.get("Alive")}
    return dead & set(nodes)


class AttemptWatch:
    """Watches one attempt's gang (``nodes``, ``ranks``, ``hosts``: per rank), reading Ray
    at most once per :data:`CHECK_S` through readers tests replace. ``on_notice_event``
    emits the run's ``notice`` event and returns what the user's hook gets."""

    def __init__(
        self,
        config: WatchConfig,
        nodes: Sequence[str],
        ranks: Sequence[str],
        on_notice_event: Callable[[Notice], object],
        *,
        read_notices: Callable[[Sequence[str]], Mapping[str, Notice]] | None = None,
        read_beats: Callable[[Sequence[str]], Mapping[str, bytes]] | None = None,
        forget: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        hosts: Sequence[HostInfo] = (),
        read_dead: Callable[[Sequence[str]], Collection[str]] = _dead_nodes,
    ) -> None:
        self.config = config
        self.nodes = list(nodes)
        self.ranks = list(ranks)
        self.hosts = list(hosts)
        self._read_dead = read_dead
        self._on_notice_event = on_notice_event
        self._read_notices = notices_for if read_notices is None else read_notices
        self._read_beats = read_beats or (lambda keys: _ray.kv_get_many(list(keys), NAMESPACE))
        self._forget = forget or (lambda prefix: _ray.kv_delete(prefix, NAMESPACE, prefix=True))
        self._clock = clock
        self.started = clock()
        self._next = self.started
        self.prefix = f"{BEAT_PREFIX}{uuid.uuid4().hex[:12]}/"
        self._published = False  # a rank's record was found: its keys need deleting
        self.seen: list[Notice] = []

    def rank_env(self, rank: int) -> dict[str, str]:
        """What a rank's call gets set: its heartbeat key, always (the goodput account reads
        its beats even when hangs are not watched)."""
        return {BEAT_ENV: self._key(rank)}

    def _host(self, rank: int) -> HostInfo | None:
        return self.hosts[rank] if rank < len(self.hosts) else None

    def _key(self, rank: int) -> str:
        # With the slice: the cluster's slice-second count sees which slices do work.
        host = self._host(rank)
        return beat_key(self.prefix, rank, host.slice_name if host is not None else "")

    def progress(self) -> GangProgress:
        """What the gang's ranks published (nothing when Ray cannot be asked)."""
        keys = [self._key(rank) for rank in range(len(self.ranks))]
        try:
            published = self._read_beats(keys)
        except _ray.kv_errors() as exc:
            logger.debug("could not read the gang's progress: %s", exc)
            self._published = True  # not known: close() deletes, to be sure
            return GangProgress()
        self._published = self._published or bool(published)
        return GangProgress.of_published(published, keys)

    def check(self) -> None:
        """Read notices and heartbeats (at most once per :data:`CHECK_S`); raise
        :class:`Broken` for a notice on a host of the gang (after the hook) or a hang."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + CHECK_S
        notices = self._read_notices(sorted(set(self.nodes)))
        if notices:
            self._leave_on_notice(min(notices.values(), key=lambda n: n.deadline))
        if self.config.beats:
            keys = [self._key(rank) for rank in range(len(self.ranks))]
            hang = describe_hang(
                self.config, keys, self._read_beats(keys), self.ranks, self.started, now
            )
            if hang is not None:
                blamed = self.blame(hang.ranks, SuspectReason.HANG, f"{hang.what}: {hang.reason}")
                raise Broken("hang", hang.cause, hang.reason, blamed)

    def close(self) -> None:
        """Forget this attempt's heartbeats, best effort (no Ray call if none were kept)."""
        if not (self.config.beats or self._published):
            return
        try:
            self._forget(self.prefix)
        except _ray.kv_errors() as exc:  # Ray may be gone: the keys go with the cluster
            logger.debug("could not delete heartbeats %s: %s", self.prefix, exc)

    def blame(
        self, ranks: Sequence[int], reason: SuspectReason, evidence: str
    ) -> tuple[Blame, ...]:
        """The hosts of these ranks, each blamed once, in rank order; ``evidence`` gets the
        host's first rank as prefix."""
        found: dict[str, Blame] = {}
        for rank in ranks:
            node = self.nodes[rank]
            host = self._host(rank)
            worker = host.worker_id if host is not None and host.worker_id is not None else -1
            slice_name = host.slice_name if host is not None else ""
            found.setdefault(
                node, Blame(node, slice_name, worker, reason, f"{self.ranks[rank]} {evidence}")
            )
        return tuple(found.values())

    def lost_hosts(self, cause: str) -> tuple[Blame, ...]:
        """The gang's hosts Ray sees dead, blamed with the failed task's ``cause`` (none if
        Ray cannot be asked)."""
        try:
            dead = self._read_dead(sorted(set(self.nodes)))
        except _ray.kv_errors() as exc:
            logger.debug("could not read which hosts died: %s", exc)
            return ()
        ranks = [rank for rank, node in enumerate(self.nodes) if node in dead]
        return self.blame(ranks, SuspectReason.HOST_FAILURE, f"died with no notice: {cause}")

    def judge_host_loss(self) -> tuple[bool, str]:
        """``(preempted, evidence)``: a lost host was a preemption if a host of the attempt
        had a notice."""
        try:
            recorded = list(self._read_notices(sorted(set(self.nodes))).values())
        except _ray.kv_errors() as exc:  # best effort: the loss stands anyway
            logger.debug("could not read notices: %s", exc)
            recorded = []
        found = self.seen + recorded
        if found:
            first = min(found, key=lambda n: n.since)
            return True, f"notice before the loss: {first.describe(first.since)}"
        return False, "no preemption or maintenance notice on any host of the attempt"

    def _leave_on_notice(self, notice: Notice) -> None:
        self.seen.append(notice)
        event = self._on_notice_event(notice)
        hook = self.config.on_notice
        if hook is not None:
            budget = max(0.0, notice.left(self._clock()) - NOTICE_MARGIN_S)
            _run_hook(hook, event, budget)
        left = notice.describe(self._clock())
        raise Broken("notice", f"left before the hosts go: {left}", notice.event)


def _run_hook(hook: Callable[[Any], None], event: object, budget_s: float) -> None:
    """Call the user's hook in a thread, waiting up to ``budget_s``: the run leaves at the
    deadline whether or not it is done."""

    def call() -> None:
        try:
            hook(event)
        except Exception:
            logger.exception("the on_notice hook raised")

    thread = threading.Thread(target=call, name="tpuslice-on-notice", daemon=True)
    thread.start()
    thread.join(budget_s)
    if thread.is_alive():
        logger.warning(
            "the on_notice hook is still running %.1f s later, at the notice's deadline "
            "less %.0f s; leaving the slices now",
            budget_s,
            NOTICE_MARGIN_S,
        )
