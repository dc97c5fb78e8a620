"""The processes that own a held slice's TPUs and run every call on it.

libtpu lets one process per host use the TPU, and keeps it until that process exits.
Ray's tasks go to whichever idle worker a host has, so two calls on one held slice can
land in two processes and the second fails ("TPU already in use"). So ``run_on_slice``
on a held slice (``tpu_slice=``) runs each rank's call in that bundle's *owner*:

- one actor per bundle, created at the first call, in the bundle and holding its TPU
  (so Ray sets the chip environment for it as for a task);
- every later call reuses it, so a JAX backend stays initialised between calls (and an
  actor call is cheaper than a task: about 5 ms against 13 ms for a 4-host round here);
- the calls of one gang are submitted to every owner under one lock, so all owners see
  the gangs in the same order (an actor runs one caller's calls in submission order),
  and concurrent gangs cannot deadlock across hosts;
- a :class:`~tpuslice.SliceActorGroup` on the slice *is* its owners while it lives:
  calls enter its actors through Ray's ``__ray_call__``;
- when the slice is handed back the owners are killed, and each host's agent confirms
  that no process of this job still owns its TPU (:mod:`tpuslice.agent`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tpuslice.errors import InvalidArgumentError
from tpuslice.labels import CallEnv


class HostOwner:
    """The owner of one bundle's TPU (a Ray actor): it runs calls in its slice context."""

    def call(
        self,
        function: Callable[..., Any],
        env: CallEnv,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """Run ``function(*args, **kwargs)`` with the slice context ``env`` set.

        Args:
            function: The user's Python function.
            env: The rank's context variables.
            args: Positional arguments.
            kwargs: Keyword arguments.

        Returns:
            What ``function`` returns.
        """
        return call_in_context(function, env, args, kwargs)

    def ping(self) -> int:
        """This owner's pid (the call also proves the owner started).

        Returns:
            The pid.
        """
        import os

        return os.getpid()


def call_in_context(
    function: Callable[..., Any],
    env: CallEnv,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """``function(*args, **kwargs)`` with the slice context in ``os.environ`` for the call.

    Args:
        function: The user's Python function.
        env: The rank's ``TPUSLICE_*`` (and ``MEGASCALE_*``) variables.
        args: Positional arguments.
        kwargs: Keyword arguments.

    Returns:
        What ``function`` returns.

    Raises:
        TPUInUseError: the call met a TPU another process owns (libtpu refused it).
        Exception: whatever ``function`` raises.
    """
    from tpuslice.run import _with_context

    return _with_context(function)(env, *args, **kwargs)


def _pid_of_actor(actor: Any) -> int:
    """Body of ``__ray_call__`` asking a SliceActorGroup actor for its pid."""
    import os

    return os.getpid()


def _call_in_actor(
    actor: Any,
    function: Callable[..., Any],
    env: CallEnv,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """Body of ``__ray_call__`` on a SliceActorGroup actor (``actor`` is its instance)."""
    return call_in_context(function, env, args, kwargs)


_RemoteOwner = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(HostOwner)


class Owners:
    """The owners of one held slice: one per bundle, in rank order.

    Args:
        handles: One actor handle per bundle, in rank order.
        actor_group: They are a SliceActorGroup's actors (calls go in through
            ``__ray_call__``), not tpuslice's own :class:`HostOwner` actors.
    """

    def __init__(self, handles: Sequence[Any], *, actor_group: bool = False) -> None:
        self.handles = list(handles)
        self.actor_group = actor_group
        self._submit_lock = threading.Lock()
        self._pid_refs: list[Any] = (
            [h.__ray_call__.remote(_pid_of_actor) for h in self.handles] if actor_group else []
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
        cls, placements: Sequence[tuple[Any, int]], tpu: float, runtime_env: Any = None
    ) -> Owners:
        """Start one :class:`HostOwner` in each bundle, holding the bundle's TPU.

        Args:
            placements: ``(placement group, bundle index)`` per rank.
            tpu: ``TPU`` resources each bundle holds.
            runtime_env: The runtime environment of the owners' processes, if any.

        Returns:
            The owners (their processes start in the background).
        """
        options: dict[str, Any] = {"resources": {"TPU": tpu}}
        if runtime_env:
            options["runtime_env"] = runtime_env
        handles = [
            _RemoteOwner.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                ),
                **options,
            ).remote()
            for pg, bundle in placements
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
                    .remote(_call_in_actor, function, env, args, kwargs)
                    for rank, env in envs
                ]
            return [
                self.handles[rank].call.options(**options).remote(function, env, args, kwargs)
                for rank, env in envs
            ]

    def kill(self) -> None:
        """Kill tpuslice's own owners (their TPUs are freed as the processes exit). An
        actor group's actors are left to the group."""
        if not self.actor_group:
            for handle in self.handles:
                ray.kill(handle, no_restart=True)
        self.handles = []


class SliceOwnership:
    """Who owns the TPUs of one held slice, and handing them back.

    Args:
        placements: ``(placement group, bundle index)`` per rank (called when needed).
        tpu: ``TPU`` resources each bundle holds.
        rank_nodes: The node id of each rank's host (for the agents' hand-back check).
    """

    def __init__(
        self,
        placements: Callable[[], Sequence[tuple[Any, int]]],
        tpu: float,
        rank_nodes: Callable[[], Sequence[str]],
    ) -> None:
        self._placements = placements
        self._tpu = tpu
        self._rank_nodes = rank_nodes
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
                self._owners = Owners.start(self._placements(), self._tpu, runtime_env)
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

    def hand_back(self, pids: Mapping[str, set[int]] | None = None) -> None:
        """Kill tpuslice's own owners, then confirm on every host that none of the
        processes that ran this slice's work owns its TPU (stopping any that does).

        Args:
            pids: Per host, pids of processes that ran tasks of this slice.
        """
        with self._lock:
            owners, self._owners = self._owners, None
        known = {node: set(p) for node, p in (pids or {}).items()}
        if owners is not None:
            for node, pid in owners.pids(self._rank_nodes()).items():
                known.setdefault(node, set()).update(pid)
            owners.kill()
        self.confirm_free(known)

    def confirm_free(self, pids: Mapping[str, set[int]] | None = None) -> None:
        """Have each host's agent stop this job's TPU owners there and confirm it.

        Args:
            pids: Per host, pids of processes that ran this slice's work.
        """
        from tpuslice.agent import confirm_released

        known = {node: set(found) for node, found in self._departed.items()}
        for node, found in (pids or {}).items():
            known.setdefault(node, set()).update(found)
        confirm_released(sorted(set(self._rank_nodes())), known)
