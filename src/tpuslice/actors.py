"""One actor per host of a reserved slice, ordered by rank: for stateful work over many steps.

Each actor starts with the same slice context as :func:`tpuslice.run_on_slice` tasks
(``TPUSLICE_*`` and, for several slices, ``MEGASCALE_*``). :meth:`SliceActorGroup.call`
fans a method out and returns refs in rank order; :meth:`SliceActorGroup.get` turns a
dead actor into a :class:`~tpuslice.errors.HostLostError` naming the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tpuslice.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice.errors import HostLostError, InvalidArgumentError, SliceShutdownError
from tpuslice.request import SliceRequest
from tpuslice.reserve import ShutsDownOnExit, SlicePlacementGroup
from tpuslice.run import MEGASCALE_VARS, HostContext, host_contexts


class SliceActorGroup(ShutsDownOnExit):
    """Actors of ``actor_cls`` on every bundle of ``tpu_slice``, in rank order.

    With ``owns_slice=True`` (the default when you pass topology arguments to
    :meth:`create`), :meth:`shutdown` also gives the slice back.
    """

    def __init__(
        self,
        actor_cls: Any,
        tpu_slice: SlicePlacementGroup,
        *args: Any,
        owns_slice: bool = False,
        **kwargs: Any,
    ) -> None:
        if tpu_slice.is_shut_down:
            raise SliceShutdownError("tpu_slice has been shut down; reserve a new one")
        remote_cls = actor_cls if hasattr(actor_cls, "remote") else ray.remote(actor_cls)
        self.slice = tpu_slice
        self.owns_slice = owns_slice
        self.contexts: list[HostContext] = host_contexts(tpu_slice)
        tpu = tpu_slice.bundle_resources.get("TPU", tpu_slice.devices_per_host)
        self.actors: list[Any] = []
        try:
            for context, (pg, bundle) in zip(self.contexts, tpu_slice.worker_groups(), strict=True):
                self.actors.append(
                    remote_cls.options(
                        num_cpus=0,
                        resources={"TPU": tpu},
                        max_restarts=0,
                        runtime_env={"env_vars": _actor_env(context)},
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=pg, placement_group_bundle_index=bundle
                        ),
                    ).remote(*args, **kwargs)
                )
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def create(
        cls,
        actor_cls: Any,
        *args: Any,
        topology: str,
        accelerator_version: str,
        num_slices: int = 1,
        chips_per_vm: int | None = None,
        head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
        **kwargs: Any,
    ) -> SliceActorGroup:
        """Reserve slices and start the group (``kwargs`` go to the actor constructor);
        :meth:`shutdown` gives the slices back."""
        request = SliceRequest(
            topology=topology,
            accelerator_version=accelerator_version,
            num_slices=num_slices,
            chips_per_vm=chips_per_vm,
            head_reservation_timeout_s=head_reservation_timeout_s,
        )
        spg = SlicePlacementGroup.from_request(request)
        try:
            return cls(actor_cls, spg, *args, owns_slice=True, **kwargs)
        except BaseException:
            spg.shutdown()
            raise

    def __len__(self) -> int:
        return len(self.actors)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call ``method`` on every actor; refs in rank order."""
        if not self.actors:
            raise SliceShutdownError("this SliceActorGroup has been shut down")
        if not hasattr(self.actors[0], method):
            raise InvalidArgumentError(f"the actors have no method {method!r}")
        return [getattr(actor, method).remote(*args, **kwargs) for actor in self.actors]

    def get(self, refs: Sequence[ray.ObjectRef], timeout: float | None = None) -> list[Any]:
        """``ray.get`` in rank order; a dead actor raises :class:`HostLostError` naming
        its slice, worker id and rank."""
        results = []
        for rank, ref in enumerate(refs):
            try:
                results.append(ray.get(ref, timeout=timeout))
            except ray.exceptions.RayActorError as exc:
                context = self.contexts[rank]
                cause = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise HostLostError(
                    f"host {context.worker_id} of slice {context.slice_name} (rank {rank}) "
                    f"lost its actor ({type(exc).__name__}): {cause[:300]}"
                ) from exc
        return results

    def shutdown(self) -> None:
        """Kill every actor and, if the group owns it, give the slice back. Idempotent."""
        actors, self.actors = self.actors, []
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self.owns_slice:
            self.slice.shutdown()


def _actor_env(context: HostContext) -> dict[str, str]:
    """The context env; with one slice, MEGASCALE_* set empty so none leaks from the driver."""
    env = {name: "" for name in MEGASCALE_VARS}
    env.update(context.env())
    return env
