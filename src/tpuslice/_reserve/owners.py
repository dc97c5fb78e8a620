"""The processes that own a held slice's TPUs and run every call on it.

libtpu lets one process per host use the TPU, and keeps it until that process exits.
Ray's tasks go to whichever idle worker a host has, so two calls on one held slice can
land in two processes and the second fails ("TPU already in use"). So ``run_on_slice``
on a held slice (``tpu_slice=``) runs each rank's call in that bundle's *owner*:

- one actor per bundle. Where a bundle is a whole host's TPU (the usual case) the
  owner is pinned to that host and holds no Ray resources: the bundle keeps the TPU
  reserved, and Ray's environment for a task holding every chip of a host is the host's
  own. Such an owner can outlive its slice or start before one is reserved, so the
  first call runs in the driver's spare on that host (:mod:`tpuslice._reserve.spares`),
  not in a process started for it on every host. Where a bundle is part of a host, the
  owner is created in the bundle at the first call, holding its TPU, so Ray gives it
  that bundle's chips; so it is too where the queue may take the slice back
  (``preemptible``), since taking back removes the groups, which ends only the actors
  inside them;
- every later call reuses it, so a JAX backend stays initialised between calls (and an
  actor call is cheaper than a task: about 5 ms against 13 ms for a 4-host round here);
- the calls of one gang are submitted to every owner under one lock, so all owners see
  the gangs in the same order (an actor runs one caller's calls in submission order),
  and concurrent gangs cannot deadlock across hosts;
- a :class:`~tpuslice.SliceActorGroup` on the slice *is* its owners while it lives:
  calls enter its actors through Ray's ``__ray_call__``;
- when the slice is handed back, an owner whose calls never opened the TPU (it holds
  neither libtpu's lock nor a device) stays up as the driver's spare on its host, so the
  next slice held there runs its first call at once; every other owner is killed, since
  libtpu keeps the TPU until its process exits. Then each host's agent confirms that no
  process of this job still owns its TPU (:mod:`tpuslice._host.agent`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from tpuslice._host.host_owner import RemoteOwner, call_in_actor, pid_of_actor
from tpuslice._reserve.groups import RankPlacement
from tpuslice._reserve.spares import SPARES, Spare
from tpuslice._tpu.labels import CallEnv
from tpuslice.errors import InvalidArgumentError

CLEAN_WAIT_S = 2.0
"""How long a hand-back waits for its idle owners to say whether they are clean (one
actor call each); an owner that has not answered by then is killed with the rest."""


class Owners:
    """The owners of one held slice: one per bundle, in rank order.

    Args:
        handles: One actor handle per bundle, in rank order.
        actor_group: They are a SliceActorGroup's actors (calls go in through
            ``__ray_call__``), not tpuslice's own
            :class:`~tpuslice._host.host_owner.HostOwner` actors.
    """

    def __init__(self, handles: Sequence[Any], *, actor_group: bool = False) -> None:
        self.handles = list(handles)
        self.actor_group = actor_group
        self._submit_lock = threading.Lock()
        self._last: list[Any] = [None] * len(self.handles)
        """Per rank, a ref of the last call submitted to its owner: an owner runs its
        calls in order, so once that one is done the owner is idle."""
        self._pid_refs: list[Any] = (
            [h.__ray_call__.remote(pid_of_actor) for h in self.handles] if actor_group else []
        )

    def pids(self, rank_nodes: Sequence[str]) -> dict[str, set[int]]:
        """Per host, the pids of tpuslice's own owners that have started.

        Args:
            rank_nodes: The node id of each rank's host.

        Returns:
            The pids by node id (owners not yet started are left out).
        """
        found: dict[str, set[int]] = {}
        refs = self._pid_refs
        if not refs:
            return found
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(done)
        for rank, ref in enumerate(refs):
            if ref in ready and rank < len(rank_nodes):
                try:
                    found.setdefault(rank_nodes[rank], set()).add(int(ray.get(ref)))
                except ray.exceptions.RayError:
                    continue
        return found

    @classmethod
    def start(
        cls,
        ranks: Sequence[RankPlacement],
        runtime_env: Any = None,
        *,
        pinned_to: Sequence[str] | None = None,
    ) -> Owners:
        """Start one owner per rank: on its host, from this driver's spares
        (``pinned_to``), or in its bundle, holding the bundle's TPU.

        Args:
            ranks: Where each rank runs, in rank order.
            runtime_env: The runtime environment of the owners' processes, if any.
            pinned_to: Each rank's node id when the owners may run outside the bundles
                and in the job's runtime environment: they are then taken
                from :data:`SPARES` (see the module docstring).

        Returns:
            The owners (their processes start in the background).
        """
        if pinned_to is not None and not runtime_env:
            started = [SPARES.take(node) for node in pinned_to]
            owners = cls([spare.handle for spare in started])
            owners._pid_refs = [spare.pid for spare in started]
            return owners
        extra: dict[str, Any] = {"runtime_env": runtime_env} if runtime_env else {}
        handles = [
            RemoteOwner.options(
                scheduling_strategy=rank.strategy(), resources={"TPU": rank.tpu}, **extra
            ).remote()
            for rank in ranks
        ]
        owners = cls(handles)
        owners._pid_refs = [handle.ping.remote() for handle in handles]
        return owners

    def submit(
        self,
        function: Callable[..., Any],
        envs: Sequence[tuple[int, CallEnv]],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        num_returns: int | None = None,
    ) -> list[Any]:
        """Run ``function`` on the owners of the given ranks, as one gang.

        Args:
            function: The user's Python function.
            envs: ``(rank, context env)`` for each rank to run, in rank order.
            args: Positional arguments for every rank.
            kwargs: Keyword arguments for every rank.
            num_returns: The function's ``num_returns`` option, if it has one.

        Returns:
            One ref per rank (a list of refs when ``num_returns`` > 1), in rank order.

        Raises:
            InvalidArgumentError: a rank is outside this slice.
        """
        for rank, _ in envs:
            if not 0 <= rank < len(self.handles):
                raise InvalidArgumentError(f"rank {rank} is outside 0..{len(self.handles) - 1}")
        options = {} if num_returns is None else {"num_returns": num_returns}
        with self._submit_lock:  # one gang at a time, so every owner sees the same order
            if self.actor_group:
                return [
                    self.handles[rank]
                    .__ray_call__.options(**options)
                    .remote(call_in_actor, function, env, args, kwargs)
                    for rank, env in envs
                ]
            refs = [
                self.handles[rank].call.options(**options).remote(function, env, args, kwargs)
                for rank, env in envs
            ]
            for (rank, _), ref in zip(envs, refs, strict=True):
                self._last[rank] = ref[0] if isinstance(ref, list) and ref else ref
            return refs

    def take_clean(
        self, rank_nodes: Sequence[str], timeout_s: float = CLEAN_WAIT_S
    ) -> dict[str, Spare]:
        """Take out the owners that can serve another slice on their host: idle (their
        last call is done), and clean (:meth:`~tpuslice._host.host_owner.HostOwner.clean`).
        The rest stay in, for :meth:`kill`.

        Args:
            rank_nodes: The node id of each rank's host (one rank per host).
            timeout_s: Bound on waiting for the owners' answers.

        Returns:
            The owners taken out, by node id.
        """
        if self.actor_group or len(set(rank_nodes)) != len(self.handles):
            return {}
        asked: dict[int, Any] = {}
        for rank, last in enumerate(self._last):
            if last is not None and not ray.wait([last], timeout=0)[0]:
                continue  # still running a call: it may be about to open the TPU
            if rank < len(self._pid_refs):
                asked[rank] = self.handles[rank].clean.remote()
        if not asked:
            return {}
        ray.wait(list(asked.values()), num_returns=len(asked), timeout=timeout_s)
        taken: dict[str, Spare] = {}
        for rank, ref in asked.items():
            try:
                if ray.get(ref, timeout=0) is True:
                    taken[rank_nodes[rank]] = Spare(self.handles[rank], self._pid_refs[rank])
            except (ray.exceptions.RayError, TimeoutError):
                continue  # died, or did not answer in time: killed with the rest
        kept = {id(spare.handle) for spare in taken.values()}
        self.handles = [h for h in self.handles if id(h) not in kept]
        return taken

    def kill(self) -> None:
        """Kill tpuslice's own owners (their TPUs are freed as the processes exit). An
        actor group's actors are left to the group."""
        if not self.actor_group:
            for handle in self.handles:
                ray.kill(handle, no_restart=True)
        self.handles = []


@dataclass
class HandBack:
    """What a slice's hand-back leaves for the driver's next slices on its hosts.

    Attributes:
        kept: Owners that never opened their TPU, still up, by node id: spares now.
        restock: Hosts whose owners were killed and whose TPU is confirmed free: each
            should get a new spare (:meth:`~tpuslice._reserve.spares.SpareOwners.refill`).
    """

    kept: dict[str, Spare]
    restock: list[str]


class SliceOwnership:
    """Who owns the TPUs of one held slice, and handing them back.

    Args:
        ranks: Where each rank runs, in rank order (called when needed).
        rank_nodes: The node id of each rank's host (for the agents' hand-back check).
        on_hosts: The owners may run outside the bundles, pinned to the hosts: each
            bundle is a host's whole TPU, and the slices cannot be taken back (which
            removes their groups, and ends only what runs inside them). They are then
            this driver's spares (see the module docstring).
    """

    def __init__(
        self,
        ranks: Callable[[], Sequence[RankPlacement]],
        rank_nodes: Callable[[], Sequence[str]],
        *,
        on_hosts: bool = False,
    ) -> None:
        self._ranks = ranks
        self._rank_nodes = rank_nodes
        self._on_hosts = on_hosts
        self._lock = threading.Lock()
        self._owners: Owners | None = None
        self._runtime_env: Any = None
        self._departed: dict[str, set[int]] = {}
        """Per host, pids of owners that have left (killed): checked at every hand-back."""

    @property
    def current(self) -> Owners | None:
        """The owners now (``None`` until the first call, and after a hand-back)."""
        return self._owners

    def owners(self, runtime_env: Any = None) -> Owners:
        """The slice's owners, started at the first call.

        Args:
            runtime_env: The calling function's runtime environment, if it has one; it
                must match the owners' (one process per host runs every call).

        Returns:
            The owners, in rank order.

        Raises:
            InvalidArgumentError: ``runtime_env`` differs from the owners'.
        """
        with self._lock:
            if self._owners is None:
                pinned = list(self._rank_nodes()) if self._on_hosts else None
                self._owners = Owners.start(self._ranks(), runtime_env, pinned_to=pinned)
                self._runtime_env = runtime_env
            elif runtime_env and runtime_env != self._runtime_env:
                raise InvalidArgumentError(
                    "every call on a held slice runs in the one process per host that owns "
                    f"its TPU, started with runtime_env {self._runtime_env!r}; this function "
                    f"asks for {runtime_env!r}. Give every function the same runtime_env, "
                    "or reserve a new slice"
                )
            return self._owners

    def adopt(self, handles: Sequence[Any]) -> None:
        """A SliceActorGroup's actors become the owners (after :meth:`retire`).

        Args:
            handles: Its actors, one per bundle, in rank order.

        Raises:
            InvalidArgumentError: another actor group owns the slice.
        """
        with self._lock:
            if self._owners is not None and self._owners.actor_group:
                raise InvalidArgumentError(
                    "this slice already has a SliceActorGroup, whose actors own its TPUs; "
                    "shut that group down first, or reserve another slice"
                )
            self._owners = Owners(handles, actor_group=True)

    def retire(self) -> None:
        """Stop tpuslice's own owners and confirm the TPUs are free, so that an actor
        group's actors can open them. Does nothing when there are none.

        Raises:
            InvalidArgumentError: another actor group owns the slice.
        """
        with self._lock:
            owners = self._owners
            if owners is None:
                return
            if owners.actor_group:
                raise InvalidArgumentError(
                    "this slice already has a SliceActorGroup, whose actors own its TPUs; "
                    "shut that group down first, or reserve another slice"
                )
            self._remember(owners.pids(self._rank_nodes()))
            owners.kill()
            self._owners = None
        self.confirm_free()

    def disown(self, handles: Sequence[Any]) -> dict[str, set[int]]:
        """An actor group that owned the slice is going; the next call starts new owners.

        Args:
            handles: The group's actors (ignored unless they are the current owners).

        Returns:
            Per host, the pids of those actors (for :meth:`confirm_free`), as far as known.
        """
        with self._lock:
            owners = self._owners
            if owners is None or owners.handles != list(handles):
                return {}
            self._owners = None
        pids = owners.pids(self._rank_nodes())
        self._remember(pids)
        return pids

    def _remember(self, pids: Mapping[str, set[int]]) -> None:
        for node, found in pids.items():
            self._departed.setdefault(node, set()).update(found)

    def hand_back(self, pids: Mapping[str, set[int]] | None = None) -> HandBack:
        """Take out the owners that stay up as spares (:meth:`Owners.take_clean`), kill
        the rest, then confirm on every host that none of the processes that ran this
        slice's work owns its TPU (stopping any that does).

        Args:
            pids: Per host, pids of processes that ran tasks of this slice.

        Returns:
            The owners kept, and the hosts that should get a new spare (see
            :class:`HandBack`).
        """
        with self._lock:
            owners, self._owners = self._owners, None
        known = {node: set(p) for node, p in (pids or {}).items()}
        kept: dict[str, Spare] = {}
        if owners is not None:
            nodes = list(self._rank_nodes())
            for node, pid in owners.pids(nodes).items():
                known.setdefault(node, set()).update(pid)
            if self._on_hosts:
                kept = owners.take_clean(nodes)
            owners.kill()
        try:
            answered = self.confirm_free(known)
        except BaseException:
            for spare in kept.values():
                ray.kill(spare.handle, no_restart=True)
            raise
        for node in [n for n in kept if answered.get(n, False) is not None]:
            # The host's TPU is not confirmed free: a spare there would only wait.
            ray.kill(kept.pop(node).handle, no_restart=True)
        if owners is None or owners.actor_group or not self._on_hosts:
            return HandBack(kept, [])
        restock = [n for n, found in answered.items() if found is None and n not in kept]
        return HandBack(kept, restock)

    def confirm_free(self, pids: Mapping[str, set[int]] | None = None) -> dict[str, Any]:
        """Have each host's agent stop this job's TPU owners there and confirm it.

        Args:
            pids: Per host, pids of processes that ran this slice's work.

        Returns:
            Per host, what its agent answered: ``None`` when the TPU is free (see
            :func:`tpuslice._host.agent.confirm_released`).
        """
        from tpuslice._host.agent import confirm_released

        known = {node: set(found) for node, found in self._departed.items()}
        for node, found in (pids or {}).items():
            known.setdefault(node, set()).update(found)
        return confirm_released(sorted(set(self._rank_nodes())), known)
