"""Ray 2.60 ``ray.util.tpu`` pure helpers, with the same names, signatures and results
(but a clear ``ValueError`` where Ray accepts nonsense or crashes); and our differences."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from tpuslice._tpu import topology as topo
from tpuslice.errors import InvalidArgumentError, InvalidResourceError

DEFAULT_MEGASCALE_PORT = "8081"
DEFAULT_COORDINATOR_PORT = 8476
"""Port of the ``jax.distributed`` coordinator on rank 0 (JAX's default on Cloud TPU, and
open in GCP's firewall rule for TPU VMs)."""
DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S: float = 100.0
VALID_TPU_TYPES = tuple(topo.GENERATIONS)
RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR = "RAY_TPU_RESOURCE_PER_CHIP"


def get_tpu_resource_per_chip() -> int:
    """Logical Ray ``TPU`` resources per physical chip: ``RAY_TPU_RESOURCE_PER_CHIP`` or 1.

    Returns:
        The variable's value, or 1 when it is not set.

    Raises:
        InvalidArgumentError: the variable is not a positive integer.
    """
    value = os.environ.get(RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR)
    if value is None:
        return 1
    if not value.isdecimal() or int(value) < 1:
        raise InvalidArgumentError(
            f"{RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR} must be a positive integer, got {value!r}"
        )
    return int(value)


def check_positive_int(name: str, value: object) -> int:
    """``value`` if it is an int >= 1 (a bool is not), else InvalidArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


def resolve_resource_per_chip(tpu_resource_per_chip: int | None) -> int:
    """Ray ``TPU`` units per chip: the argument, checked, else the environment's."""
    if tpu_resource_per_chip is None:
        return get_tpu_resource_per_chip()
    return check_positive_int("tpu_resource_per_chip", tpu_resource_per_chip)


def get_tpu_version_from_type(accelerator_type: str) -> str:
    """``"TPU-V6E"`` -> ``"v6e"``; also accepts ``v5e``, ``tpu7x``, ``trillium``.

    Args:
        accelerator_type: Ray's accelerator type, or any accepted generation spelling.

    Returns:
        The generation's canonical name.

    Raises:
        InvalidAcceleratorError: it names no known generation.
    """
    return topo.generation(accelerator_type).name


def get_num_chips_from_topology(topology: str) -> int:
    """``"2x2x2"`` -> 8.

    Args:
        topology: Sides joined by ``x``.

    Returns:
        Chips in the topology.

    Raises:
        InvalidTopologyError: ``topology`` is malformed.
    """
    return topo.chips_in(topology)


def get_chips_per_host(topology: str, accelerator_version: str) -> int:
    """Default chips per VM: the whole slice for v5e/v6e shapes of up to 8 chips, else 4.

    Args:
        topology: The slice's chip grid.
        accelerator_version: Its TPU generation.

    Returns:
        Chips on each VM of such a slice.

    Raises:
        InvalidAcceleratorError: the generation is unknown.
        InvalidTopologyError: the topology is malformed or not offered for it.
    """
    return topo.slice_shape(topology, accelerator_version).chips_per_host


def infer_tpu_pod_type_from_topology(topology: str, accelerator_type: str) -> str | None:
    """``("4x4", "TPU-V6E")`` -> ``"v6e-16"``; ``None`` if either argument is empty.

    Args:
        topology: The slice's chip grid.
        accelerator_type: Ray's accelerator type, or any accepted generation spelling.

    Returns:
        The pod type, or ``None`` (as in Ray).

    Raises:
        InvalidAcceleratorError: the generation is unknown.
        InvalidTopologyError: the topology is malformed or not offered for it.
    """
    if not topology or not accelerator_type:
        return None
    return topo.slice_shape(topology, accelerator_type).pod_type


def get_tpu_worker_resources(
    topology: str,
    accelerator_type: str,
    resources_per_worker: dict[str, float] | None = None,
    num_slices: int = 1,
    chips_per_vm: int | None = None,
    tpu_resource_per_chip: int | None = None,
    *,
    resources_per_unit: dict[str, float] | None = None,
) -> tuple[int, dict[str, float]]:
    """Number of workers and each worker's resources for ``num_slices`` slices.

    Args:
        topology: Chip grid of one slice.
        accelerator_type: Its TPU generation, in any accepted spelling.
        resources_per_worker: One worker's resources (default: one host, ``CPU`` 1).
        num_slices: How many slices.
        chips_per_vm: Chips on each VM; ``None`` for the shape's default.
        tpu_resource_per_chip: ``TPU`` units per chip; ``None`` reads the environment.
        resources_per_unit: Older name of ``resources_per_worker``.

    Returns:
        The number of workers over all slices, and the resources of each.

    Raises:
        InvalidArgumentError: both resource arguments are given, or a count is not positive.
        InvalidAcceleratorError: the generation is unknown.
        InvalidTopologyError: the topology is malformed or not offered for it.
        InvalidResourceError: a worker's ``TPU`` does not divide one slice's evenly.
    """
    if resources_per_unit is not None:
        if resources_per_worker is not None:
            raise InvalidArgumentError(
                "pass resources_per_worker or its older name resources_per_unit, not both"
            )
        resources_per_worker = resources_per_unit
    per_chip = resolve_resource_per_chip(tpu_resource_per_chip)
    check_positive_int("num_slices", num_slices)
    shape = topo.slice_shape(topology, accelerator_type, chips_per_vm)
    per_slice = shape.chips * per_chip
    resources = dict(resources_per_worker or {})
    resources.setdefault("CPU", 1)
    resources.setdefault("TPU", shape.chips_per_host * per_chip)
    tpu = resources["TPU"]
    if not isinstance(tpu, (int, float)) or tpu <= 0:
        raise InvalidResourceError(
            f"TPU per worker must be a positive number, got {tpu!r}; for {shape.pod_type} "
            f"use a divisor of {per_slice}, such as {shape.chips_per_host * per_chip} (one host)"
        )
    if per_slice % tpu:
        divisors = [d for d in range(1, per_slice + 1) if per_slice % d == 0]
        raise InvalidResourceError(
            f"TPU per worker {tpu} does not divide the {per_slice} TPU of one "
            f"{shape.pod_type} slice evenly; valid: {', '.join(map(str, divisors))}"
        )
    return int(per_slice * num_slices // tpu), resources


def get_tpu_num_slices_for_workers(
    topology: str,
    accelerator_type: str,
    num_workers: int,
    resources_per_worker: dict[str, float] | None = None,
    tpu_resource_per_chip: int | None = None,
) -> int:
    """Slices needed to hold ``num_workers`` workers; 1 when the slice inputs are incomplete
    or invalid (as in Ray, which sizes a request with it before validating it).

    Args:
        topology: Chip grid of one slice.
        accelerator_type: Its TPU generation, in any accepted spelling.
        num_workers: Workers to place.
        resources_per_worker: Resources of one worker (default: one whole host).
        tpu_resource_per_chip: ``TPU`` units per chip; ``None`` reads the environment.

    Returns:
        The slice count, at least 1.

    Raises:
        InvalidArgumentError: ``num_workers`` is not a number (Ray returns 1).
    """
    if not isinstance(num_workers, (int, float)):
        raise InvalidArgumentError(f"num_workers must be a number, got {num_workers!r}")
    if not topology or not accelerator_type:
        return 1
    try:
        per_slice, _ = get_tpu_worker_resources(
            topology,
            accelerator_type,
            resources_per_worker=resources_per_worker,
            num_slices=1,
            tpu_resource_per_chip=tpu_resource_per_chip,
        )
    except ValueError:
        return 1
    return max(1, math.ceil(num_workers / per_slice))


def get_tpu_coordinator_env_vars(
    coordinator_address: str,
    num_slices: int,
    slice_id: int,
    coordinator_port: str = DEFAULT_MEGASCALE_PORT,
) -> dict[str, str]:
    """The four ``MEGASCALE_*`` variables multi-slice JAX needs on every host.

    Args:
        coordinator_address: Address of the host that coordinates the slices.
        num_slices: Slices in the job.
        slice_id: This host's slice, ``0 .. num_slices - 1``.
        coordinator_port: The coordinator's port.

    Returns:
        Variable name to value.
    """
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": coordinator_address,
        "MEGASCALE_PORT": str(coordinator_port),
        "MEGASCALE_NUM_SLICES": str(num_slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }


@dataclass(frozen=True)
class Difference:
    """One deliberate difference from Ray 2.60, and the test that shows it."""

    what: str
    ray: str
    ours: str
    shown_by: str
    """``tests/<file>.py::<test>`` that exercises it (checked to exist)."""


SUBSLICE_DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "choosing an idle sub-slice",
        "counts a host whose TPUs are all in use as idle (its available resources have no "
        "'TPU' key left), so it picks a sub-slice someone holds and its group never places",
        "a host is busy when any TPU or its head resource is in use, or its TPU is owned",
        "tests/test_subslice_pure.py::test_rays_pick_counts_a_fully_used_host_as_idle",
    ),
    Difference(
        "a host of the slice replaced (same slice name and worker id, new node)",
        "maps the worker id to whichever node ray.nodes() lists last, which can be the dead "
        "one, so sub-slices with that host are never offered again (RuntimeError)",
        "the live node stands for the worker id; the slice's layout is learned again",
        "tests/test_subslices_pure.py::test_a_slice_whose_host_was_replaced_is_learned_again_before_use",
    ),
    Difference(
        "every sub-slice busy",
        "raises RuntimeError at once",
        "waits up to head_reservation_timeout_s, then raises SubsliceUnavailableError (a "
        "RuntimeError) saying which host of each sub-slice is busy",
        "tests/test_subslices.py::test_a_busy_host_blocks_only_its_own_sub_slice",
    ),
    Difference(
        "rank order within a sub-slice",
        "bundle i is the i-th lowest TPU worker id",
        "bundle i is the i-th host in physical (row-major) order, which is the order of the "
        "TPU_WORKER_ID / TPU_WORKER_HOSTNAMES set for the sub-slice: libtpu reads a "
        "worker's place in the host bounds from them",
        "tests/test_subslices.py::test_every_sub_slice_of_the_4x4_matches_rays_labels",
    ),
    Difference(
        "environment of work on a sub-slice",
        "sets nothing: each host keeps the parent slice's TPU_* values (and the metadata "
        "server describes the parent), so JAX would wait for the parent's other hosts",
        "run_on_slice / SliceActorGroup set the sub-slice's TPU_WORKER_ID, "
        "TPU_WORKER_HOSTNAMES, TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY, bounds, and "
        "TPU_SKIP_MDS_QUERY for each call",
        "tests/test_subslices.py::test_run_on_a_sub_slice_has_its_own_ranks_and_environment",
    ),
    Difference(
        "a layout learned from coordinates that do not fit the parent",
        "raises ValueError out of subslice_placement_group, or (two hosts at one place) "
        "stores labels that make a sub-slice of the wrong size",
        "no labels are stored; the slice is skipped with a warning naming it, and a "
        "timeout names it as not learned (DiscoveryFailedError inside)",
        "tests/test_subslices_pure.py::test_a_layout_that_does_not_fit_is_not_used",
    ),
)


QUEUE_DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "more reservations than idle slices, from several drivers",
        "each waiting reservation polls on its own, claiming the head of any idle slice it "
        "sees: no arrival order, and a request for N slices holds the ones it got while it "
        "waits for the rest (three 2-slice requests on three slices can all time out)",
        "waiting reservations queue in one cluster-wide queue (priority, then arrival) and "
        "are granted all their slices at once; nothing is held while waiting",
        "tests/test_schedule.py::test_three_two_slice_requests_on_three_slices_all_complete",
    ),
    Difference(
        "num_slices=(min, max)",
        "num_slices must be an int",
        "a range: as many idle slices as there are, at least min; the handle, MEGASCALE_* "
        "and the host context say how many",
        "tests/test_elastic.py::test_a_reservation_with_a_range_takes_what_is_idle_and_says_how_many",
    ),
    Difference(
        "a keyword argument named priority to run_on_slice",
        "passed to the function",
        "taken as the one-shot's queue priority (a function's own priority argument must "
        "come another way, e.g. a default or another name)",
        "tests/test_claim_queue.py::test_a_higher_priority_request_is_served_first",
    ),
    Difference(
        "keyword arguments named tenant or preemptible to run_on_slice",
        "passed to the function",
        "taken as the one-shot's tenant (quotas and fair share) and whether the queue may "
        "preempt it (a function's own arguments of those names must come another way)",
        "tests/test_request.py::test_every_run_takes_each_option_of_a_runs_request_with_the_requests_default",
    ),
)
