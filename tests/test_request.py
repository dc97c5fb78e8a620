"""SliceRequest: one frozen, keyword-only request, validated once on creation. Pure."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import ray.util.tpu as ray_tpu

import tpuslice
from tpuslice._reserve.request import SliceRequest
from tpuslice._tpu.labels import SLICE_NAME_LABEL
from tpuslice.errors import InvalidArgumentError, InvalidResourceError, InvalidTopologyError


def test_fields_and_defaults_are_those_of_rays_slice_placement_group() -> None:
    """Every parameter of Ray's constructor is a field, with Ray's default."""
    ray_params = inspect.signature(ray_tpu.SlicePlacementGroup.__init__).parameters
    fields = {f.name: f for f in dataclasses.fields(SliceRequest) if f.init}
    for name, param in ray_params.items():
        if name == "self":
            continue
        assert name in fields, name
        if param.default is not inspect.Parameter.empty:
            assert fields[name].default == param.default, name


def test_positional_arguments_are_refused() -> None:
    """Three of the inputs are strings: a swap must not type-check, so keywords only."""
    with pytest.raises(TypeError):
        SliceRequest("4x4", "v6e")  # type: ignore[misc]


def test_frozen_and_its_mappings_cannot_be_changed_behind_its_back() -> None:
    resources = {"TPU": 4.0}
    request = SliceRequest(
        topology="4x4", accelerator_version="v6e", resources_per_bundle=resources
    )
    resources["TPU"] = 1.0
    assert request.resources_per_bundle == {"TPU": 4.0}
    assert request.plan.bundle_resources["TPU"] == 4.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.num_slices = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        request.resources_per_bundle["TPU"] = 2.0  # type: ignore[index]


def test_the_plan_is_derived_once_on_creation() -> None:
    request = SliceRequest(topology="2x2x2", accelerator_version="v4", num_slices=3)
    plan = request.plan
    assert (plan.shape.num_hosts, plan.num_slices, plan.num_bundles) == (2, 3, 6)
    assert plan.bundle_resources == {"CPU": 1, "TPU": 4}
    assert request.plan is plan


def test_equal_requests_compare_equal_whatever_their_plan_object() -> None:
    a = SliceRequest(topology="4x4", accelerator_version="v6e")
    b = SliceRequest(topology="4x4", accelerator_version="TPU-V6E")
    assert a != b  # the inputs differ in spelling ...
    assert a.plan.shape == b.plan.shape  # ... the shape they ask for does not
    assert a == SliceRequest(topology="4x4", accelerator_version="v6e")


@pytest.mark.parametrize(
    ("changes", "error", "text"),
    [
        ({"num_slices": 0}, InvalidArgumentError, "num_slices must be a positive integer"),
        ({"num_slices": True}, InvalidArgumentError, "num_slices"),
        ({"topology": "3x3"}, InvalidTopologyError, "did you mean '4x4'"),
        ({"strategy": "spread"}, InvalidArgumentError, "valid: PACK, SPREAD"),
        ({"strategy": "STRICT_PACK"}, InvalidArgumentError, "has 4 hosts"),
        ({"lifetime": "forever"}, InvalidArgumentError, "None or 'detached'"),
        ({"resources_per_bundle": {"TPU": 3}}, InvalidResourceError, "valid: 1, 2, 4, 8, 16"),
        ({"head_reservation_timeout_s": -1}, InvalidArgumentError, "seconds >= 0"),
        ({"head_reservation_timeout_s": float("nan")}, InvalidArgumentError, "seconds >= 0"),
        ({"head_reservation_timeout_s": "10"}, InvalidArgumentError, "seconds >= 0"),
        ({"pg_per_slice": "yes"}, InvalidArgumentError, "True or False"),
        ({"bundle_label_selector": [{}]}, InvalidArgumentError, "1 entries but .* 4 bundles"),
        ({"chips_per_vm": 3}, InvalidResourceError, "did you mean 4"),
    ],
)
def test_every_bad_input_is_a_value_error_naming_what_is_valid(
    changes: dict[str, object], error: type[Exception], text: str
) -> None:
    arguments: dict[str, object] = {"topology": "4x4", "accelerator_version": "v6e", **changes}
    with pytest.raises(error, match=text) as info:
        SliceRequest(**arguments)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, tpuslice.TPUSliceError)


def test_strict_spread_with_split_hosts_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="2 bundles share each host"):
        SliceRequest(
            topology="2x2x2",
            accelerator_version="v4",
            resources_per_bundle={"TPU": 2},
            strategy="STRICT_SPREAD",
        )


def test_none_timeout_means_wait_without_limit() -> None:
    assert (
        SliceRequest(
            topology="4x4", accelerator_version="v6e", head_reservation_timeout_s=None
        ).head_reservation_timeout_s
        is None
    )


@pytest.mark.parametrize(("value", "expected"), [(3, (3, 3)), ((1, 4), (1, 4)), ((2, 2), (2, 2))])
def test_num_slices_is_an_int_or_a_min_max_range(
    value: int | tuple[int, int], expected: tuple[int, int]
) -> None:
    request = SliceRequest(topology="4x4", accelerator_version="v6e", num_slices=value)
    assert request.slice_range == expected
    assert request.plan.num_slices == expected[1]  # built for the most
    assert request.elastic is (expected[0] < expected[1])


@pytest.mark.parametrize("value", [(0, 2), (3, 2), (1,), (1, 2, 3), (1.0, 2), (True, 2), [1, 2]])
def test_a_bad_range_is_refused_with_what_is_valid(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="num_slices must be a positive integer"):
        SliceRequest(topology="4x4", accelerator_version="v6e", num_slices=value)  # type: ignore[arg-type]


def test_a_range_cannot_take_per_bundle_selectors() -> None:
    with pytest.raises(InvalidArgumentError, match="is a range"):
        SliceRequest(
            topology="4x4",
            accelerator_version="v6e",
            num_slices=(1, 2),
            bundle_label_selector=[{}] * 4,
        )


@pytest.mark.parametrize("value", [True, 1.5, "high"])
def test_priority_must_be_an_integer(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="priority must be an integer"):
        SliceRequest(topology="4x4", accelerator_version="v6e", priority=value)  # type: ignore[arg-type]


def test_a_runs_request_is_the_request_of_its_options() -> None:
    request = SliceRequest.for_run("4x4", "v6e", (1, 2), None, 30.0, 5, "team-a", True)
    assert request == SliceRequest(
        topology="4x4",
        accelerator_version="v6e",
        num_slices=(1, 2),
        head_reservation_timeout_s=30.0,
        priority=5,
        tenant="team-a",
        preemptible=True,
    )
    with pytest.raises(InvalidArgumentError, match="valid"):
        SliceRequest.for_run("v6e", "4x4", 1, None, 30.0, 0, None, False)  # the two strings swapped


def test_every_run_takes_each_option_of_a_runs_request_with_the_requests_default() -> None:
    """An option added to ``SliceRequest.for_run`` fails here until every run takes it."""
    from tpuslice._run.actors import SliceActorGroup
    from tpuslice._run.resilient import run_resilient
    from tpuslice._run.run import run_on_slice

    options = list(inspect.signature(SliceRequest.for_run).parameters)
    defaults = {f.name: f.default for f in dataclasses.fields(SliceRequest)}
    # A resilient run leaves cleanly and queues again, so it may be preempted by default.
    own = {(run_resilient, "preemptible"): True}
    for run in (run_on_slice, run_resilient, SliceActorGroup.create):
        params = inspect.signature(run).parameters
        for name in options:
            assert name in params, (run.__qualname__, name)
            if name not in ("topology", "accelerator_version"):
                expected = own.get((run, name), defaults[name])
                assert params[name].default == expected, (run.__qualname__, name)


def test_a_request_is_charged_to_the_tenant_named_else_the_environment_else_the_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TPUSLICE_TENANT", "team-b")
    assert SliceRequest(topology="4x4", accelerator_version="v6e").tenant == "team-b"
    named = SliceRequest(topology="4x4", accelerator_version="v6e", tenant="team-a")
    assert named.tenant == "team-a"
    monkeypatch.delenv("TPUSLICE_TENANT")
    monkeypatch.setattr("getpass.getuser", lambda: "Ada Lovelace")
    assert SliceRequest(topology="4x4", accelerator_version="v6e").tenant == "Ada-Lovelace"
    monkeypatch.setenv("TPUSLICE_TENANT", "no spaces")
    with pytest.raises(InvalidArgumentError, match="TPUSLICE_TENANT: tenant 'no spaces'"):
        SliceRequest(topology="4x4", accelerator_version="v6e")


@pytest.mark.parametrize("bad", ["", "-lead", "a b", "x" * 64, 7])
def test_a_bad_tenant_or_preemptible_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="give 1-63 letters"):
        SliceRequest(topology="4x4", accelerator_version="v6e", tenant=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="preemptible must be True or False"):
        SliceRequest(topology="4x4", accelerator_version="v6e", preemptible="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_slices": 0}, "num_slices must be a positive integer"),
        ({"num_slices": -1}, "num_slices must be a positive integer"),
        ({"topology": "3x3"}, "did you mean '4x4'"),
        ({"resources_per_bundle": {"TPU": 8}}, "does not fit the 4 TPU"),
        ({"strategy": "STRICT_PACK"}, "STRICT_PACK"),
        ({"strategy": "BOGUS"}, "valid: PACK, SPREAD"),
        ({"lifetime": "forever"}, "lifetime"),
        ({"chips_per_vm": 3}, "chips_per_vm=3"),
    ],
)
def test_slice_placement_group_refuses_bad_input_before_reserving(
    kwargs: dict[str, object], match: str
) -> None:
    """The public constructor raises before it needs Ray (none runs here)."""
    args: dict[str, object] = {"topology": "4x4", "accelerator_version": "v6e", **kwargs}
    with pytest.raises(ValueError, match=match):
        tpuslice.SlicePlacementGroup(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"subslice_index": 0}, InvalidArgumentError, "subslice_index can only be used with"),
        ({"subslice": True, "num_slices": 2}, InvalidArgumentError, "num_slices=2 given"),
        ({"subslice": True, "subslice_index": -1}, InvalidArgumentError, "got -1"),
        ({"subslice": True, "subslice_index": True}, InvalidArgumentError, "got True"),
        ({"subslice": True, "chips_per_vm": 8}, InvalidResourceError, "chips_per_vm=8 given"),
        ({"subslice": True, "pg_per_slice": True}, InvalidArgumentError, "pg_per_slice and"),
    ],
)
def test_a_sub_slice_request_that_cannot_be_met_as_asked_is_refused_saying_which_option(
    options: dict[str, object], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        SliceRequest(topology="2x2", accelerator_version="v6e", **options)  # type: ignore[arg-type]


def test_the_slices_a_requests_label_selectors_accept() -> None:
    """Bundle k of a slice lands on worker k // bundles_per_host; a slice is accepted when
    some slice index's bundles all find their hosts' labels matching."""
    from tpuslice._reserve.plan import accepted_slices

    def hosts(zone: str, name: str) -> dict[int, dict[str, str]]:
        return {w: {"zone": zone, SLICE_NAME_LABEL: name} for w in range(4)}

    labels = {"s-a": hosts("a", "s-a"), "s-b": hosts("b", "s-b"), "s-c": hosts("c", "s-c")}
    zoned = SliceRequest(
        topology="4x4", accelerator_version="v6e", bundle_label_selector=[{"zone": "in(a,c)"}] * 4
    )
    assert accepted_slices(zoned.plan, labels) == {"s-a", "s-c"}
    pinned = SliceRequest(
        topology="4x4",
        accelerator_version="v6e",
        num_slices=2,
        bundle_label_selector=[{SLICE_NAME_LABEL: "s-b"}] * 4 + [{SLICE_NAME_LABEL: "s-c"}] * 4,
    )
    assert accepted_slices(pinned.plan, labels) == {"s-b", "s-c"}
    negative = SliceRequest(
        topology="4x4", accelerator_version="v6e", bundle_label_selector=[{"zone": "!b"}] * 4
    )
    assert accepted_slices(negative.plan, labels) == {"s-a", "s-c"}
