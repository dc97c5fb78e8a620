"""Differential tests: tpuslice's Ray-compatible helpers against Ray 2.60 itself.

Ray's own ``ray.util.tpu`` / ``ray._private.accelerators.tpu`` functions are the oracle
(imported only; no cluster). For every input, ours returns what Ray returns, or both
raise and ours raises a subclass of Ray's exception type, unless the input is in
``DELIBERATE``: a table of the places where we choose to differ, each with its reason
and the behaviour we promise instead. Tests check that every table entry still differs
from Ray, so the table cannot go stale.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import ray.util.tpu as ray_tpu
from ray._private.accelerators import tpu as ray_accel_tpu
from ray._private.accelerators.tpu import VALID_TPU_TOPOLOGY

import tpuslice
from tpuslice._tpu import compat
from tpuslice.errors import InvalidArgumentError, InvalidResourceError, InvalidTopologyError

GENERATIONS = sorted(VALID_TPU_TOPOLOGY)
CHIPS_PER_VM = (None, 1, 2, 4, 8)
RESOURCES_PER_WORKER: tuple[dict[str, float] | None, ...] = (
    None,
    {"TPU": 1},
    {"TPU": 2},
    {"TPU": 4},
    {"TPU": 3},
    {"CPU": 2},
    {"TPU": 16},
)
NUM_SLICES = (1, 2, 4)
TPU_RESOURCE_PER_CHIP = (None, 1, 2)
NUM_WORKERS = (0, 1, 2, 3, 4, 5, 8, 16, 17, 64, 1000)


@pytest.fixture(autouse=True)
def _no_resource_per_chip_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sides read RAY_TPU_RESOURCE_PER_CHIP; start every test without it."""
    monkeypatch.delenv(compat.RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR, raising=False)


# --- comparing outcomes -------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    try:
        return Outcome(value=fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - the oracle may raise anything
        return Outcome(error=exc)


def agrees(ours: Outcome, ray: Outcome) -> bool:
    """Same value, or both raised and ours is an instance of Ray's exception type."""
    if ray.error is not None:
        return ours.error is not None and isinstance(ours.error, type(ray.error))
    return ours.error is None and ours.value == ray.value


def assert_agrees(name: str, *args: Any, **kwargs: Any) -> None:
    ours = run(getattr(compat, name), *args, **kwargs)
    ray = run(getattr(ray_tpu, name), *args, **kwargs)
    assert agrees(ours, ray), f"{name}{args}{kwargs}: ours {ours}, Ray 2.60 {ray}"


# --- the deliberate differences -----------------------------------------------------------


@dataclass(frozen=True)
class Raises:
    """We raise ``error`` with every fragment in the message."""

    error: type[Exception]
    fragments: tuple[str, ...]

    def check(self, outcome: Outcome) -> None:
        assert isinstance(outcome.error, self.error), outcome
        for fragment in self.fragments:
            assert fragment in str(outcome.error), (fragment, str(outcome.error))


@dataclass(frozen=True)
class Returns:
    """We return ``value`` (Ray returns something else or raises)."""

    value: Any

    def check(self, outcome: Outcome) -> None:
        assert not outcome.raised, outcome
        assert outcome.value == self.value


@dataclass(frozen=True)
class Deliberate:
    function: str
    args: tuple[Any, ...]
    reason: str
    expect: Raises | Returns
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.function}{self.args}{self.kwargs or ''}"


def _bad(error: type[Exception], *fragments: str) -> Raises:
    return Raises(error, fragments)


NOT_DIVIDING = "chips_per_vm must divide the slice's chips; Ray accepts it when TPU is given"
INVALID_TOPOLOGY = "Ray does not validate the topology and computes from any AxB string"
ALIAS = "we accept spellings Ray rejects (v5e, tpu7x, trillium, padding)"
TYPE_NOT_VERSION = "Ray's get_chips_per_host ignores 'TPU-' types and so says 4 for v6e 2x4"

DELIBERATE: tuple[Deliberate, ...] = (
    # num_slices: Ray returns 0 or a negative number of workers.
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v6e", None, 0),
        "num_slices=0 gives Ray 0 workers (and a ZeroDivisionError later)",
        _bad(InvalidArgumentError, "num_slices must be a positive integer", "0"),
    ),
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v6e", None, -1),
        "num_slices=-1 gives Ray -4 workers",
        _bad(InvalidArgumentError, "num_slices", "-1"),
    ),
    # chips_per_vm outside 1/2/4/8, or not dividing the slice.
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v6e", {"TPU": 4}, 1, 3),
        "no TPU VM has 3 chips; Ray accepts it when TPU per worker is given",
        _bad(InvalidResourceError, "chips_per_vm=3", "valid here: 1, 2, 4, 8"),
    ),
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v6e", None, 1, 16),
        "no TPU VM has 16 chips; Ray makes one 16-chip worker",
        _bad(InvalidResourceError, "chips_per_vm=16", "did you mean 8"),
    ),
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v6e", None, 1, "4"),
        "a string chips_per_vm: Ray raises TypeError, we raise ValueError",
        _bad(InvalidResourceError, "'4'", "must be an integer"),
    ),
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v6e", None, 1, None, "2"),
        "a string tpu_resource_per_chip: Ray raises TypeError, we raise ValueError",
        _bad(InvalidArgumentError, "tpu_resource_per_chip", "'2'"),
    ),
    # Topologies: ours are validated against the generation's table.
    Deliberate(
        "get_tpu_worker_resources",
        ("3x3", "v6e", {"TPU": 1}),
        "3x3 is no v6e slice; Ray makes 9 one-chip workers (and with no TPU given, fails"
        " only on divisibility, with no hint)",
        _bad(InvalidTopologyError, "'3x3'", "did you mean '4x4'"),
    ),
    Deliberate(
        "get_tpu_worker_resources",
        ("2x2", "v4"),
        "a 2D topology for a 3D generation; Ray returns 1 worker",
        _bad(InvalidTopologyError, "'2x2'", "3D (AxBxC)"),
    ),
    Deliberate(
        "get_tpu_worker_resources",
        ("4x4", "v5e"),
        ALIAS,
        Returns((4, {"CPU": 1, "TPU": 4})),
    ),
    Deliberate(
        "get_tpu_version_from_type",
        ("v5e",),
        ALIAS,
        Returns("v5litepod"),
    ),
    Deliberate("get_tpu_version_from_type", ("v5lite",), ALIAS, Returns("v5litepod")),
    Deliberate("get_tpu_version_from_type", ("trillium",), ALIAS, Returns("v6e")),
    Deliberate("get_tpu_version_from_type", ("ironwood",), ALIAS, Returns("v7x")),
    Deliberate("get_tpu_version_from_type", ("TPU-TPU7X",), ALIAS, Returns("v7x")),
    Deliberate("get_tpu_version_from_type", (" v6e",), ALIAS, Returns("v6e")),
    Deliberate("get_tpu_version_from_type", ("v6e ",), ALIAS, Returns("v6e")),
    Deliberate("get_chips_per_host", ("2x4", "TPU-V6E"), TYPE_NOT_VERSION, Returns(8)),
    Deliberate("get_chips_per_host", ("1x1", "TPU-V6E"), TYPE_NOT_VERSION, Returns(1)),
    Deliberate("get_chips_per_host", ("2x4", "tpu-v5litepod"), TYPE_NOT_VERSION, Returns(8)),
    Deliberate("get_chips_per_host", ("2x4", "v5e"), ALIAS, Returns(8)),
    Deliberate(
        "get_chips_per_host",
        ("3x3", "v6e"),
        INVALID_TOPOLOGY,
        _bad(InvalidTopologyError, "'3x3'", "did you mean '4x4'"),
    ),
    Deliberate(
        "get_chips_per_host",
        ("2x2x2", "v6e"),
        INVALID_TOPOLOGY,
        _bad(InvalidTopologyError, "'2x2x2'", "2D (AxB)"),
    ),
    Deliberate(
        "get_num_chips_from_topology",
        ("0x4",),
        "a zero side: Ray says 0 chips",
        _bad(InvalidTopologyError, "'0x4'", "malformed"),
    ),
    Deliberate(
        "get_num_chips_from_topology",
        ("-2x2",),
        "a negative side: Ray says -4 chips",
        _bad(InvalidTopologyError, "'-2x2'", "malformed"),
    ),
    Deliberate(
        "get_num_chips_from_topology",
        ("8",),
        "one side is no topology: Ray says 8 chips",
        _bad(InvalidTopologyError, "'8'", "malformed"),
    ),
    Deliberate(
        "get_num_chips_from_topology",
        ("2x2x2x2",),
        "four sides: Ray says 16 chips",
        _bad(InvalidTopologyError, "'2x2x2x2'", "malformed"),
    ),
    Deliberate(
        "infer_tpu_pod_type_from_topology",
        ("3x3", "v6e"),
        "Ray returns the nonexistent pod type v6e-9",
        _bad(InvalidTopologyError, "'3x3'", "did you mean '4x4'"),
    ),
    Deliberate(
        "infer_tpu_pod_type_from_topology",
        ("2x2x2", "tpu7x"),
        ALIAS + "; GKE's spelling, which Ray's own labels normalise to v7x",
        Returns("v7x-16"),
    ),
    Deliberate("infer_tpu_pod_type_from_topology", ("4x4", "v5e"), ALIAS, Returns("v5litepod-16")),
    Deliberate(
        "infer_tpu_pod_type_from_topology",
        ("4x4", "V6E "),
        "Ray keeps the padding and returns 'v6e -16'",
        Returns("v6e-16"),
    ),
    Deliberate(
        "get_tpu_num_slices_for_workers",
        ("2x2x2", "v6e", 4),
        INVALID_TOPOLOGY + "; as Ray documents for invalid input, we return 1",
        Returns(1),
    ),
    Deliberate(
        "get_tpu_num_slices_for_workers",
        ("8", "v6e", 4),
        INVALID_TOPOLOGY + "; as Ray documents for invalid input, we return 1",
        Returns(1),
    ),
    Deliberate(
        "get_tpu_num_slices_for_workers",
        ("4x4", "v6e", "8"),
        "a non-numeric num_workers: Ray swallows the TypeError and answers 1 slice",
        _bad(InvalidArgumentError, "num_workers must be a number", "'8'"),
    ),
    Deliberate(
        "get_tpu_num_slices_for_workers",
        ("4x4", "v6e", None),
        "a missing num_workers: Ray swallows the TypeError and answers 1 slice",
        _bad(InvalidArgumentError, "num_workers", "None"),
    ),
    Deliberate(
        "get_tpu_coordinator_env_vars",
        ("10.0.0.1", 2, 1, 9000),
        "an int port: Ray puts the int in an env var mapping, which must hold strings",
        Returns(
            {
                "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1",
                "MEGASCALE_PORT": "9000",
                "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": "1",
            }
        ),
    ),
)

# In the grid below, the (generation, topology, chips_per_vm) whose chips_per_vm does not
# divide the slice's chips. Ray accepts these when TPU per worker is given explicitly
# (v5e 1x1 with chips_per_vm=4 and {"TPU": 1} is "1 worker"); we reject them with
# InvalidResourceError naming the chips_per_vm values that do divide.
GRID_CHIPS_PER_VM_NOT_DIVIDING: frozenset[tuple[str, str, int]] = frozenset(
    {
        ("v4", "2x2x1", 8),
        ("v5p", "2x2x1", 8),
        ("v7x", "2x2x1", 8),
        ("v5litepod", "1x1", 2),
        ("v5litepod", "1x1", 4),
        ("v5litepod", "1x1", 8),
        ("v5litepod", "2x2", 8),
        ("v6e", "1x1", 2),
        ("v6e", "1x1", 4),
        ("v6e", "1x1", 8),
        ("v6e", "2x2", 8),
    }
)


@pytest.mark.parametrize("case", DELIBERATE, ids=str)
def test_deliberate_difference_has_our_promised_behaviour(case: Deliberate) -> None:
    case.expect.check(run(getattr(compat, case.function), *case.args, **case.kwargs))


@pytest.mark.parametrize("case", DELIBERATE, ids=str)
def test_deliberate_difference_really_differs_from_ray(case: Deliberate) -> None:
    ours = run(getattr(compat, case.function), *case.args, **case.kwargs)
    ray = run(getattr(ray_tpu, case.function), *case.args, **case.kwargs)
    assert not agrees(ours, ray), f"{case} now agrees with Ray; drop it from DELIBERATE"
    assert case.reason


# Documented shapes that Ray 2.60's VALID_TPU_TOPOLOGY lacks (see the comment on the
# table in tpuslice/topology.py for the sources). Ray's TPU validator rejects them; Ray's
# pure helpers do not validate, so for these the helpers must still agree with ours.
OURS_ONLY_TOPOLOGIES: frozenset[tuple[str, str]] = frozenset(
    {
        ("v2", "2x2"),
        ("v3", "2x2"),
        ("v4", "4x16x16"),
        ("v4", "8x16x16"),
        ("v4", "12x12x24"),
        ("v7x", "16x16x16"),
        ("v7x", "16x16x24"),
        ("v7x", "16x16x32"),
    }
)


def test_ours_only_topologies_are_exactly_the_listed_ones() -> None:
    ours_only = {
        (gen, topology)
        for gen in GENERATIONS
        for topology in tpuslice.GENERATIONS[gen].topologies - set(VALID_TPU_TOPOLOGY[gen])
    }
    assert ours_only == OURS_ONLY_TOPOLOGIES


@pytest.mark.parametrize(("gen", "topology"), sorted(OURS_ONLY_TOPOLOGIES))
def test_ours_only_topologies_are_rejected_by_ray_but_computed_alike(
    gen: str, topology: str
) -> None:
    manager = ray_accel_tpu.TPUAcceleratorManager
    assert not manager.is_valid_tpu_accelerator_topology(gen, topology)
    shape = tpuslice.slice_shape(topology, gen)
    expected = (shape.num_hosts, {"CPU": 1, "TPU": shape.chips_per_host})
    assert compat.get_tpu_worker_resources(topology, gen) == expected
    assert_agrees("get_tpu_worker_resources", topology, gen)
    assert_agrees("get_tpu_worker_resources", topology, gen, {"TPU": 1}, 2)
    assert_agrees("get_chips_per_host", topology, gen)
    assert_agrees("infer_tpu_pod_type_from_topology", topology, gen)


@pytest.mark.parametrize("chips_per_vm", [0, -4])
def test_non_positive_chips_per_vm_raises_like_ray(chips_per_vm: int) -> None:
    assert_agrees("get_tpu_worker_resources", "4x4", "v6e", None, 1, chips_per_vm)
    with pytest.raises(InvalidResourceError, match=f"chips_per_vm={chips_per_vm}"):
        compat.get_tpu_worker_resources("4x4", "v6e", chips_per_vm=chips_per_vm)


# --- get_tpu_worker_resources: the full grid ----------------------------------------------


def grid(gen: str) -> Iterator[tuple[str, int | None, dict[str, float] | None, int, int | None]]:
    for topology in sorted(VALID_TPU_TOPOLOGY[gen]):
        for chips_per_vm in CHIPS_PER_VM:
            for resources in RESOURCES_PER_WORKER:
                for num_slices in NUM_SLICES:
                    for per_chip in TPU_RESOURCE_PER_CHIP:
                        yield topology, chips_per_vm, resources, num_slices, per_chip


@pytest.mark.parametrize("gen", GENERATIONS)
def test_worker_resources_match_ray_over_the_grid(gen: str) -> None:
    differing: set[tuple[str, str, int]] = set()
    checked = 0
    for topology, chips_per_vm, resources, num_slices, per_chip in grid(gen):
        args = (topology, gen, resources, num_slices, chips_per_vm, per_chip)
        ours = run(compat.get_tpu_worker_resources, *args)
        ray = run(ray_tpu.get_tpu_worker_resources, *args)
        if chips_per_vm is not None and (gen, topology, chips_per_vm) in (
            GRID_CHIPS_PER_VM_NOT_DIVIDING
        ):
            Raises(InvalidResourceError, (f"chips_per_vm={chips_per_vm}", "valid here")).check(ours)
            if not ray.raised:
                differing.add((gen, topology, chips_per_vm))
            continue
        assert agrees(ours, ray), f"{args}: ours {ours}, Ray 2.60 {ray}"
        checked += 1
    listed = {entry for entry in GRID_CHIPS_PER_VM_NOT_DIVIDING if entry[0] == gen}
    assert differing == listed, "GRID_CHIPS_PER_VM_NOT_DIVIDING is stale"
    assert checked > 0


@pytest.mark.parametrize("gen", GENERATIONS)
def test_worker_resources_accept_ray_accelerator_type_spellings(gen: str) -> None:
    for accelerator in (f"TPU-{gen.upper()}", gen.upper(), f"tpu-{gen}"):
        for topology in sorted(VALID_TPU_TOPOLOGY[gen]):
            for resources in (None, {"TPU": 1}, {"TPU": 3}):
                assert_agrees("get_tpu_worker_resources", topology, accelerator, resources)


@pytest.mark.parametrize("per_chip_env", ["1", "2"])
def test_resource_per_chip_env_var_is_read_like_ray(
    monkeypatch: pytest.MonkeyPatch, per_chip_env: str
) -> None:
    monkeypatch.setenv(compat.RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR, per_chip_env)
    assert compat.get_tpu_resource_per_chip() == ray_tpu.get_tpu_resource_per_chip()
    for gen in GENERATIONS:
        for topology in sorted(VALID_TPU_TOPOLOGY[gen]):
            assert_agrees("get_tpu_worker_resources", topology, gen)
            assert_agrees("get_tpu_worker_resources", topology, gen, None, 1, None, 1)


@pytest.mark.parametrize("per_chip_env", ["0", "-1", "two", "1.5", ""])
def test_bad_resource_per_chip_env_var_raises_like_ray(
    monkeypatch: pytest.MonkeyPatch, per_chip_env: str
) -> None:
    monkeypatch.setenv(compat.RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR, per_chip_env)
    with pytest.raises(ValueError):
        ray_tpu.get_tpu_resource_per_chip()
    with pytest.raises(InvalidArgumentError) as info:
        compat.get_tpu_resource_per_chip()
    assert repr(per_chip_env) in str(info.value)
    assert_agrees("get_tpu_worker_resources", "4x4", "v6e")


@pytest.mark.parametrize("per_chip", [0, -1])
def test_non_positive_tpu_resource_per_chip_raises_like_ray(per_chip: int) -> None:
    assert_agrees("get_tpu_worker_resources", "4x4", "v6e", None, 1, None, per_chip)
    with pytest.raises(InvalidArgumentError, match="tpu_resource_per_chip"):
        compat.get_tpu_worker_resources("4x4", "v6e", tpu_resource_per_chip=per_chip)


@pytest.mark.parametrize(
    "resources", [{"TPU": 0}, {"TPU": -2}, {"TPU": 0.5}, {"TPU": 2.0}, {"TPU": 5}]
)
def test_unusual_tpu_per_worker_matches_ray(resources: dict[str, float]) -> None:
    assert_agrees("get_tpu_worker_resources", "4x4", "v6e", resources)
    assert_agrees("get_tpu_worker_resources", "4x4", "v6e", resources, 2)


def test_worker_resources_do_not_mutate_the_callers_dict() -> None:
    resources = {"TPU": 2.0}
    compat.get_tpu_worker_resources("4x4", "v6e", resources)
    assert resources == {"TPU": 2.0}


def test_bad_tpu_per_worker_message_lists_valid_divisors() -> None:
    with pytest.raises(InvalidResourceError) as info:
        compat.get_tpu_worker_resources("4x4", "v6e", {"TPU": 3})
    message = str(info.value)
    assert "TPU per worker 3" in message
    assert "v6e-16" in message
    assert "1, 2, 4, 8, 16" in message


# --- resources_per_unit (older keyword) ---------------------------------------------------


@pytest.mark.parametrize(
    ("topology", "gen", "resources"),
    [("4x4", "v6e", {"TPU": 2}), ("2x2x2", "v4", {"TPU": 4, "CPU": 8}), ("2x4", "v6e", None)],
)
def test_resources_per_unit_is_the_older_name_of_resources_per_worker(
    topology: str, gen: str, resources: dict[str, float] | None
) -> None:
    new = compat.get_tpu_worker_resources(topology, gen, resources_per_worker=resources)
    old = compat.get_tpu_worker_resources(topology, gen, resources_per_unit=resources)
    assert old == new
    assert new == ray_tpu.get_tpu_worker_resources(topology, gen, resources_per_worker=resources)


def test_resources_per_unit_and_resources_per_worker_together_raise() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        compat.get_tpu_worker_resources(
            "4x4", "v6e", resources_per_worker={"TPU": 4}, resources_per_unit={"TPU": 4}
        )
    assert "resources_per_worker" in str(info.value)
    assert "resources_per_unit" in str(info.value)
    assert isinstance(info.value, ValueError)


# --- the other helpers --------------------------------------------------------------------

VERSION_SPELLINGS = (
    "TPU-V6E",
    "tpu-v6e",
    "V6E",
    "TPU-V5LITEPOD",
    "tpu7x",
    "TPU7X",
    "TPU-V7X",
    "TPU-V4",
    "v8",
    "",
    "tpu",
    "tpu-",
    "v6e-16",
    "v5",
    "tpuv4",
    "TPUv6e",
    "tpu-7x",
    "gpu",
    "TPU-GPU",
)


@pytest.mark.parametrize("spelling", [*GENERATIONS, *VERSION_SPELLINGS])
def test_tpu_version_from_type_matches_ray(spelling: str) -> None:
    assert_agrees("get_tpu_version_from_type", spelling)


@pytest.mark.parametrize("gen", GENERATIONS)
def test_chips_topology_and_pod_type_helpers_match_ray(gen: str) -> None:
    for topology in sorted(VALID_TPU_TOPOLOGY[gen]):
        for spelling in (topology, topology.upper(), f" {topology} "):
            assert_agrees("get_num_chips_from_topology", spelling)
        for accelerator in (gen, gen.upper(), f" {gen} "):
            assert_agrees("get_chips_per_host", topology, accelerator)
        for accelerator in (gen, f"TPU-{gen.upper()}", gen.upper()):
            assert_agrees("infer_tpu_pod_type_from_topology", topology, accelerator)


@pytest.mark.parametrize("topology", ["4by4", "", "4x", "x4", "axb", "4x4x"])
def test_malformed_topologies_raise_like_ray(topology: str) -> None:
    assert_agrees("get_num_chips_from_topology", topology)
    assert_agrees("get_tpu_num_slices_for_workers", topology, "v6e", 4)


@pytest.mark.parametrize(
    ("topology", "accelerator"), [("", "v6e"), ("4x4", ""), ("", ""), (None, "v6e")]
)
def test_empty_inputs_match_ray(topology: str, accelerator: str) -> None:
    assert_agrees("infer_tpu_pod_type_from_topology", topology, accelerator)
    assert_agrees("get_tpu_num_slices_for_workers", topology, accelerator, 8)


@pytest.mark.parametrize("gen", GENERATIONS)
def test_num_slices_for_workers_matches_ray(gen: str) -> None:
    for topology in sorted(VALID_TPU_TOPOLOGY[gen]):
        for num_workers in NUM_WORKERS:
            for resources in RESOURCES_PER_WORKER:
                for per_chip in TPU_RESOURCE_PER_CHIP:
                    args = (topology, gen, num_workers, resources, per_chip)
                    assert_agrees("get_tpu_num_slices_for_workers", *args)


def test_num_slices_for_workers_examples() -> None:
    assert compat.get_tpu_num_slices_for_workers("4x4", "v6e", 8) == 2
    assert compat.get_tpu_num_slices_for_workers("4x4", "v6e", 9) == 3
    assert compat.get_tpu_num_slices_for_workers("4x4", "v6e", 16, {"TPU": 1}) == 1
    assert compat.get_tpu_num_slices_for_workers("4x4", "v6e", 0) == 1


@pytest.mark.parametrize(
    "args",
    [
        ("10.0.0.1", 2, 1),
        ("host", 1, 0, "9000"),
        ("", 0, 0),
        ("h", 4, 3, compat.DEFAULT_MEGASCALE_PORT),
    ],
)
def test_coordinator_env_vars_match_ray(args: tuple[Any, ...]) -> None:
    assert_agrees("get_tpu_coordinator_env_vars", *args)
    env = compat.get_tpu_coordinator_env_vars(*args)
    assert set(env) == {
        "MEGASCALE_COORDINATOR_ADDRESS",
        "MEGASCALE_PORT",
        "MEGASCALE_NUM_SLICES",
        "MEGASCALE_SLICE_ID",
    }
    assert all(isinstance(value, str) for value in env.values())


def test_constants_match_ray() -> None:
    assert compat.DEFAULT_MEGASCALE_PORT == ray_tpu.DEFAULT_MEGASCALE_PORT
    assert (
        compat.DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
        == ray_tpu.DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
    )
    assert compat.VALID_TPU_TYPES == ray_tpu.VALID_TPU_TYPES
    assert (
        compat.RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR == ray_accel_tpu.RAY_TPU_RESOURCE_PER_CHIP_ENV_VAR
    )


COMPAT_FUNCTIONS = (
    "get_tpu_version_from_type",
    "get_num_chips_from_topology",
    "get_chips_per_host",
    "infer_tpu_pod_type_from_topology",
    "get_tpu_worker_resources",
    "get_tpu_num_slices_for_workers",
    "get_tpu_coordinator_env_vars",
    "get_tpu_resource_per_chip",
)


@pytest.mark.parametrize("name", COMPAT_FUNCTIONS)
def test_signatures_match_ray(name: str) -> None:
    """Same positional/keyword parameters, order and defaults; ours may add keyword-only."""
    ours = inspect.signature(getattr(compat, name)).parameters
    ray = inspect.signature(getattr(ray_tpu, name)).parameters
    shared = [p for p in ours.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert [p.name for p in shared] == list(ray)
    for param in shared:
        assert param.default == ray[param.name].default, param.name
    assert getattr(tpuslice, name) is getattr(compat, name)
