"""One request type for a reservation: every input, validated once, passed by keyword.
Building a :class:`SliceRequest` validates it and derives its
:class:`~tpuslice._reserve.plan.ReservationPlan`; a new reservation option is a new field
here. Pure: no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from tpuslice._reserve.plan import ReservationPlan, thaw
from tpuslice._tpu.compat import (
    DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    check_positive_int,
    get_tpu_worker_resources,
    resolve_resource_per_chip,
)
from tpuslice._tpu.topology import SliceShape, slice_shape
from tpuslice._view.quotas import check_tenant, default_tenant
from tpuslice.errors import InvalidArgumentError, InvalidResourceError

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
LIFETIMES = (None, "detached")


@dataclass(frozen=True, kw_only=True)
class SliceRequest:
    """What a reservation asks for, checked on creation (an invalid value raises
    :class:`~tpuslice.errors.InvalidArgumentError`). The fields and defaults are those of
    Ray 2.60's ``SlicePlacementGroup`` (see its arguments), and the ones below."""

    topology: str
    accelerator_version: str
    resources_per_bundle: Mapping[str, float] | None = None
    strategy: str = "SPREAD"
    name: str = ""
    lifetime: str | None = None
    num_slices: int | tuple[int, int] = 1
    chips_per_vm: int | None = None
    head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
    bundle_label_selector: Sequence[Mapping[str, str]] | None = None
    pg_per_slice: bool = False
    tpu_resource_per_chip: int | None = None
    subslice: bool = False
    """``topology`` is a sub-slice: some hosts of a bigger slice."""
    subslice_index: int | None = None
    """With ``subslice``: that sub-slice of its parent only."""
    priority: int = 0
    tenant: str | None = None
    preemptible: bool = False
    arrival_ns: int | None = None
    """Its place in the queue's arrival order from an earlier attempt of the same work,
    so a preempted run queues again in its first place."""
    plan: ReservationPlan = field(init=False, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle the fields, read-only mappings as dicts; made again on the way in."""
        return (
            _request_of,
            ({f.name: thaw(getattr(self, f.name)) for f in fields(self) if f.init},),
        )

    def __post_init__(self) -> None:
        """Freeze the mappings, then validate every field and derive :attr:`plan`."""
        if self.resources_per_bundle is not None:
            frozen = MappingProxyType(dict(self.resources_per_bundle))
            object.__setattr__(self, "resources_per_bundle", frozen)
        if self.bundle_label_selector is not None:
            selectors = tuple(MappingProxyType(dict(s or {})) for s in self.bundle_label_selector)
            object.__setattr__(self, "bundle_label_selector", selectors)
        tenant = default_tenant() if self.tenant is None else check_tenant(self.tenant)
        object.__setattr__(self, "tenant", tenant)
        _check_bool("preemptible", self.preemptible)
        object.__setattr__(self, "plan", _plan(self))

    @classmethod
    def for_run(
        cls,
        topology: str,
        accelerator_version: str,
        num_slices: int | tuple[int, int],
        chips_per_vm: int | None,
        head_reservation_timeout_s: float | None,
        priority: int,
        tenant: str | None,
        preemptible: bool,
        /,
    ) -> SliceRequest:
        """The request of a run that reserves its own slices, from the options every run
        takes. Positional and without defaults, so that the type checker names a run that
        does not pass a new option, and a swap fails validation or type-checking."""
        return cls(
            topology=topology,
            accelerator_version=accelerator_version,
            num_slices=num_slices,
            chips_per_vm=chips_per_vm,
            head_reservation_timeout_s=head_reservation_timeout_s,
            priority=priority,
            tenant=tenant,
            preemptible=preemptible,
        )

    @property
    def slice_range(self) -> tuple[int, int]:
        """``(min, max)`` slices: ``(n, n)`` for an int ``num_slices``."""
        return _slice_range(self.num_slices)

    @property
    def elastic(self) -> bool:
        """Whether ``num_slices`` is a range (``min < max``)."""
        low, high = self.slice_range
        return low < high


def _plan(request: SliceRequest) -> ReservationPlan:
    """Validate ``request`` (errors say what is valid, where Ray 2.60 crashes or hangs)
    and derive its plan."""
    low, high = _slice_range(request.num_slices)
    if isinstance(request.priority, bool) or not isinstance(request.priority, int):
        raise InvalidArgumentError(
            f"priority must be an integer (higher is served first), got {request.priority!r}"
        )
    _check_timeout(request.head_reservation_timeout_s)
    _check_bool("pg_per_slice", request.pg_per_slice)
    per_chip = resolve_resource_per_chip(request.tpu_resource_per_chip)
    _check_subslice(request)
    chips_per_vm = request.chips_per_vm
    if request.subslice and chips_per_vm is None:
        chips_per_vm = SUBSLICE_CHIPS_PER_HOST  # the parent's hosts, not the shape's default
    shape = slice_shape(request.topology, request.accelerator_version, chips_per_vm)
    num_bundles, resources = get_tpu_worker_resources(
        shape.topology,
        shape.generation.name,
        dict(request.resources_per_bundle) if request.resources_per_bundle else None,
        high,
        shape.chips_per_host,
        per_chip,
    )
    bundles_per_host = _bundles_per_host(shape, per_chip, resources["TPU"])
    selectors = tuple(request.bundle_label_selector or ())
    if selectors and low < high:
        raise InvalidArgumentError(
            f"num_slices={request.num_slices!r} is a range, so the number of bundles is not "
            "known in advance; bundle_label_selector needs one selector per bundle: give "
            "an int num_slices, or leave the selectors out"
        )
    if selectors and len(selectors) != num_bundles:
        raise InvalidArgumentError(
            f"bundle_label_selector has {len(selectors)} entries but the reservation has "
            f"{num_bundles} bundles ({high} slice(s) x {shape.num_hosts} "
            f"host(s) x {bundles_per_host} bundle(s) per host); give one selector per bundle"
        )
    spread_hint = (
        "; a sub-slice reservation defaults to STRICT_SPREAD, one bundle per host: give "
        f"each bundle the host's {shape.chips_per_host} chips (resources_per_bundle="
        f"{{'TPU': {shape.chips_per_host * per_chip}}}), or pass strategy='SPREAD' for "
        "several bundles per host"
        if request.subslice
        else "; use 'SPREAD' (the default)"
    )
    _check_strategy(request.strategy, shape, bundles_per_host, spread_hint)
    if request.lifetime not in LIFETIMES:
        raise InvalidArgumentError(f"lifetime must be None or 'detached', got {request.lifetime!r}")
    return ReservationPlan(
        shape=shape,
        num_slices=high,
        tpu_resource_per_chip=per_chip,
        bundle_resources=MappingProxyType(resources),
        bundles_per_host=bundles_per_host,
        user_selectors=selectors,
        strategy=request.strategy,
        name=request.name,
        lifetime=request.lifetime,
        pg_per_slice=request.pg_per_slice,
        subslice=request.subslice,
    )


def _slice_range(value: object) -> tuple[int, int]:
    """An int n is ``(n, n)``; a ``(min, max)`` tuple with ``1 <= min <= max``."""
    if isinstance(value, tuple):
        if len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            low, high = value
            if 1 <= low <= high:
                return low, high
        raise InvalidArgumentError(
            f"num_slices must be a positive integer or a (min, max) tuple of integers with "
            f"1 <= min <= max, got {value!r}"
        )
    n = check_positive_int("num_slices", value)
    return n, n


SUBSLICE_CHIPS_PER_HOST = 4
"""Sub-slices are cut from multi-host slices, whose hosts have 4 chips."""


def _check_subslice(request: SliceRequest) -> None:
    """Sub-slice options only with ``subslice``; one sub-slice of 4-chip hosts."""
    if not request.subslice:
        if request.subslice_index is not None:
            raise InvalidArgumentError("subslice_index can only be used with subslice=True")
        return
    if request.num_slices != 1:
        raise InvalidArgumentError(
            f"a sub-slice reservation holds one sub-slice; num_slices={request.num_slices} "
            "given: make one reservation per sub-slice"
        )
    index = request.subslice_index
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        raise InvalidArgumentError(f"subslice_index must be an integer >= 0, got {index!r}")
    if request.chips_per_vm not in (None, SUBSLICE_CHIPS_PER_HOST):
        raise InvalidResourceError(
            f"sub-slices are cut from multi-host slices of {SUBSLICE_CHIPS_PER_HOST}-chip hosts; "
            f"chips_per_vm={request.chips_per_vm} given: leave it out"
        )
    if request.pg_per_slice or request.bundle_label_selector:
        raise InvalidArgumentError(
            "pg_per_slice and bundle_label_selector do not apply to a sub-slice reservation"
        )


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")


def _check_timeout(timeout: object) -> None:
    """None (wait forever, as in Ray) or a number of seconds >= 0."""
    if timeout is None:
        return
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise InvalidArgumentError(
            f"head_reservation_timeout_s must be seconds >= 0, or None to wait without limit; "
            f"got {timeout!r}"
        )


def _bundles_per_host(shape: SliceShape, per_chip: int, tpu_per_bundle: float) -> int:
    """Bundles must tile a host exactly, or some would straddle hosts and never place."""
    per_host = shape.chips_per_host * per_chip
    if tpu_per_bundle > per_host or per_host % tpu_per_bundle:
        valid = [d for d in range(1, per_host + 1) if per_host % d == 0]
        raise InvalidResourceError(
            f"TPU per bundle {tpu_per_bundle:g} does not fit the {per_host} TPU of one "
            f"{shape.pod_type} host; a bundle must hold a divisor of {per_host}: "
            f"{', '.join(map(str, valid))}"
        )
    return int(per_host // tpu_per_bundle)


def _check_strategy(
    strategy: str, shape: SliceShape, bundles_per_host: int, spread_hint: str
) -> None:
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(
            f"strategy {strategy!r} is not valid; valid: {', '.join(STRATEGIES)}"
        )
    if strategy == "STRICT_PACK" and shape.num_hosts > 1:
        raise InvalidArgumentError(
            f"strategy 'STRICT_PACK' puts every bundle on one node, but a {shape.pod_type} "
            f"slice has {shape.num_hosts} hosts; use 'SPREAD' (the default)"
        )
    if strategy == "STRICT_SPREAD" and bundles_per_host > 1:
        raise InvalidArgumentError(
            f"strategy 'STRICT_SPREAD' puts each bundle on its own node, but "
            f"{bundles_per_host} bundles share each host here{spread_hint}"
        )


def _request_of(values: dict[str, Any]) -> SliceRequest:
    return SliceRequest(**values)
