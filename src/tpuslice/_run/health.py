"""Health checks of whole slices: is each host fit to run SPMD work now? A hang or a lost
host often means hardware, and a retry on the same hosts can hang again. One probe per host
must answer in time, start the TPU backend in a child process (so no process of the check
keeps the TPU) and reach rank 0's coordinator port; then the caller's own check runs.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from tpuslice._host.context import current_host
from tpuslice._host.suspects import Blame, SuspectReason
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import SliceHandle, record_of, reserve_slices, suspect_slices
from tpuslice._reserve.suspects import clear_slice, mark_suspects
from tpuslice._run.run import launch
from tpuslice._tpu import _ray
from tpuslice._tpu.compat import DEFAULT_COORDINATOR_PORT, DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._tpu.keys import HEALTH_KEY_PREFIX, NAMESPACE
from tpuslice._tpu.labels import SLICE_NAME_LABEL
from tpuslice._view.cluster import SliceInfo, read_snapshot
from tpuslice.errors import InvalidArgumentError, first_line

TPU_OPEN_S = 30.0
"""How long a host's TPU backend may take to start in a new process (a wedged chip never does)."""
REACH_S = 10.0
"""How long a rank may take to connect to rank 0's coordinator port."""
ANSWER_MARGIN_S = 15.0
"""What a probe may take beyond its TPU and reach bounds (a worker to start, imports)."""
USER_CHECK_S = 60.0
"""Bound on the caller's own check."""

OPEN_BACKEND = "import jax; jax.devices('tpu')"
"""Starts the TPU backend as a JAX program's first use does."""


@dataclass(frozen=True)
class HostVerdict:
    """One host's result in a health check: ``answered_s`` from the check's start to the
    probe's report (``None``: never); what the ``tpu`` and ``reach`` checks found (``"started
    in 0.41 s"``); the caller's ``check``: ``"passed"``, why it failed, or ``""`` if none ran;
    ``reason``: why the host failed (``""`` when it passed)."""

    worker_id: int
    node_id: str
    ok: bool
    answered_s: float | None
    tpu: str
    reach: str
    check: str
    reason: str

    def describe(self) -> str:
        """One line: the host, its verdict and what each check found.

        Returns:
            The line.
        """
        answered = "-" if self.answered_s is None else f"{self.answered_s:.2f} s"
        verdict = "ok" if self.ok else f"FAILED: {self.reason}"
        parts = [f"host {self.worker_id}: {verdict}", f"answered {answered}"]
        parts += [f"tpu {self.tpu}", f"reach {self.reach}"]
        if self.check:
            parts.append(f"check {self.check}")
        return "; ".join(parts)


@dataclass(frozen=True)
class SliceHealth:
    """A slice's health check: a verdict per host, in worker-id order, and how long it
    took (its reservation included)."""

    slice_name: str
    hosts: tuple[HostVerdict, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether every host passed."""
        return all(h.ok for h in self.hosts)

    @property
    def failed(self) -> tuple[HostVerdict, ...]:
        """The hosts that failed."""
        return tuple(h for h in self.hosts if not h.ok)

    def describe(self) -> str:
        """A few lines: the slice's verdict, then each host's.

        Returns:
            The text.
        """
        head = "healthy" if self.ok else f"{len(self.failed)} host(s) failed"
        lines = [f"{self.slice_name}: {head} (checked in {self.seconds:.1f} s)"]
        return "\n".join([*lines, *(f"  {h.describe()}" for h in self.hosts)])


def probe(check_key: str, tpu_open_s: float, reach_s: float) -> dict[str, Any]:
    """One host's probe, run as a task in rank context: its worker id and what the TPU and
    reach checks found. Rank 0 publishes its address under ``check_key``."""
    host = current_host()
    started = time.monotonic()
    first = host.worker_id == 0
    listener = _Listener(check_key, host.hosts_per_slice - 1, reach_s) if first else None
    try:
        reach_ok, reach = listener.wait() if listener else _reach(check_key, reach_s)
    finally:
        if listener is not None:
            listener.close()
    tpu_ok, tpu = _start_backend(tpu_open_s)
    return {
        "worker_id": host.worker_id,
        "tpu_ok": tpu_ok,
        "tpu": tpu,
        "reach_ok": reach_ok,
        "reach": reach,
        "seconds": time.monotonic() - started,
    }


_remote_probe = ray.remote(num_cpus=0, max_retries=0)(probe)


def _start_backend(bound_s: float) -> tuple[bool, str]:
    """Start the TPU backend in a child process (so no process of the check keeps it)."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", OPEN_BACKEND], capture_output=True, text=True, timeout=bound_s
        )
    except subprocess.TimeoutExpired:
        return False, f"did not start in {bound_s:g} s (a process that opens it hangs)"
    took = time.monotonic() - started
    if done.returncode == 0:
        return True, f"started in {took:.2f} s"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return False, f"refused: {lines[-1] if lines else f'exit code {done.returncode}'}"


class _Listener:
    """Rank 0's side of the reach check: listen on the coordinator's port (or any free
    one), publish the address, count the peers that connect."""

    def __init__(self, key: str, peers: int, bound_s: float) -> None:
        self.key, self.peers, self.bound_s = key, peers, bound_s
        self.sock = socket.socket()
        self.note = ""
        try:
            self.sock.bind(("", DEFAULT_COORDINATOR_PORT))
        except OSError:
            self.sock.bind(("", 0))
            self.note = f" (port {DEFAULT_COORDINATOR_PORT} taken here: a free one)"
        self.sock.listen()
        self.sock.settimeout(0.2)
        port = self.sock.getsockname()[1]
        _ray.kv_put(key, f"{ray.util.get_node_ip_address()}:{port}".encode(), NAMESPACE)

    def wait(self) -> tuple[bool, str]:
        """Accept peers until all came or the bound passed; return whether all came, and
        what was seen."""
        deadline = time.monotonic() + self.bound_s
        came = 0
        while came < self.peers and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.close()
            came += 1
        ok = came == self.peers
        seen = f"{came} of {self.peers} peer(s) reached this coordinator port{self.note}"
        return ok, seen if ok else f"{seen} within {self.bound_s:g} s"

    def close(self) -> None:
        self.sock.close()


def _reach(key: str, bound_s: float) -> tuple[bool, str]:
    """A peer's side: find rank 0's address, then connect within the bound."""
    deadline = time.monotonic() + bound_s
    address = None
    while address is None and time.monotonic() < deadline:
        address = _ray.kv_get(key, NAMESPACE)
        if address is None:
            time.sleep(0.05)
    if address is None:
        return False, f"rank 0 published no address within {bound_s:g} s"
    ip, port = address.decode().rsplit(":", 1)
    started = time.monotonic()
    try:
        with socket.create_connection((ip, int(port)), timeout=max(0.1, deadline - started)):
            pass
    except OSError as exc:
        return False, f"could not reach rank 0 at {ip}:{port}: {exc}"
    return True, f"reached rank 0 in {(time.monotonic() - started) * 1000:.0f} ms"


def _check_held(
    spg: SliceHandle,
    *,
    check: Any = None,
    tpu_open_s: float | None = None,
    reach_s: float | None = None,
) -> list[SliceHealth]:
    """Check every slice of a held, otherwise idle reservation, all at once."""
    tpu_open_s = TPU_OPEN_S if tpu_open_s is None else tpu_open_s
    reach_s = REACH_S if reach_s is None else reach_s
    started = time.monotonic()
    check_id = uuid.uuid4().hex[:12]
    keys = [f"{HEALTH_KEY_PREFIX}{check_id}/{name}" for name in spg.slice_names]
    refs = [
        launch(_remote_probe, spg, (keys[i], tpu_open_s, reach_s), {}, i) for i in range(len(keys))
    ]
    deadline = started + tpu_open_s + reach_s + ANSWER_MARGIN_S
    try:
        reports = [_collect(slice_refs, started, deadline) for slice_refs in refs]
    finally:
        for key in keys:
            with contextlib.suppress(*_ray.kv_errors()):
                _ray.kv_delete(key, NAMESPACE)
    verdicts = [_judge(spg.slices[i], answers) for i, answers in enumerate(reports)]
    if check is not None and all(h.ok for hosts in verdicts for h in hosts):
        verdicts = _user_check(spg, check, verdicts)
    elapsed = time.monotonic() - started
    return [
        SliceHealth(name, tuple(hosts), elapsed)
        for name, hosts in zip(spg.slice_names, verdicts, strict=True)
    ]


Answer = tuple[dict[str, Any] | None, float | None, str]
"""A probe's report and when it came (seconds since the check began), or why there is none."""


def _collect(refs: Sequence[Any], started: float, deadline: float) -> list[Answer]:
    out: list[Answer] = []
    for ref in refs:
        try:
            report = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            out.append((None, None, "did not answer in time"))
        except ray.exceptions.RayError as exc:
            out.append((None, None, f"its probe failed: {first_line(str(exc))}"))
        else:
            out.append((report, time.monotonic() - started, ""))
    return out


def _judge(info: SliceInfo, answers: list[Answer]) -> list[HostVerdict]:
    """Turn one slice's reports into verdicts, blaming whom the reach results point at."""
    nodes = {w: h.node_id for w, h in info.hosts.items()}
    reports = {w: a for w, a in zip(sorted(nodes), answers, strict=True)}
    unreached = reach_blame(
        [w for w, (r, _, _) in reports.items() if w != 0 and r and not r["reach_ok"]],
        len(nodes) - 1,
    )
    verdicts = []
    for worker, (report, answered, missing) in reports.items():
        if report is None:
            verdicts.append(HostVerdict(worker, nodes[worker], False, None, "-", "-", "", missing))
            continue
        tpu, reach = report["tpu"], report["reach"]
        reasons = [] if report["tpu_ok"] else [f"TPU {tpu}"]
        if worker in unreached:
            reasons.append(unreached[worker] or f"reach: {reach}")
        why = "; ".join(reasons)
        verdicts.append(HostVerdict(worker, nodes[worker], not why, answered, tpu, reach, "", why))
    return verdicts


def reach_blame(unreached: Sequence[int], peers: int) -> dict[int, str]:
    """The worker ids a failed reach check blames, each with a reason (``""``: its own
    reach result says it): the peers in ``unreached`` while others reached rank 0; rank 0
    if none of two or more did; both ends of a lone link."""
    if not unreached:
        return {}
    if peers == 1:
        both = (
            "rank 0 and its only peer could not reach each other (which end is at fault "
            "cannot be told with two hosts)"
        )
        return {0: both, unreached[0]: both}
    if len(unreached) == peers:
        return {0: f"none of its {peers} peers reached rank 0's coordinator port"}
    return dict.fromkeys(unreached, "")


def _user_check(
    spg: SliceHandle, check: Any, verdicts: list[list[HostVerdict]]
) -> list[list[HostVerdict]]:
    """Run the caller's check on every host; each host's verdict gets its result."""
    refs = iter(launch(check, spg, (), {}))
    deadline = time.monotonic() + USER_CHECK_S
    return [[_with_check(host, next(refs), deadline) for host in hosts] for hosts in verdicts]


def _with_check(host: HostVerdict, ref: Any, deadline: float) -> HostVerdict:
    try:
        ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        result = f"did not finish in {USER_CHECK_S:g} s"
    except ray.exceptions.RayError as exc:
        result = f"failed: {first_line(str(exc))}"
    else:
        return replace(host, check="passed")
    reason = "; ".join(filter(None, [host.reason, f"own check {result}"]))
    return replace(host, ok=False, check=result, reason=reason)


def check_slice(
    slice_name: str,
    *,
    timeout_s: float = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    check: Any = None,
    tpu_open_s: float | None = None,
    reach_s: float | None = None,
) -> SliceHealth:
    """Reserve one idle slice, probe every host, give it back, and record the verdict:
    a slice that passes is trusted again, a host that fails is marked suspect.

    Args:
        slice_name: The slice, as ``tpuslice status`` names it.
        timeout_s: Seconds to wait for the slice to be idle.
        check: Your own ``@ray.remote`` check, run on every host after the probes pass.
        tpu_open_s: Bound on starting each host's TPU backend (default 30 s).
        reach_s: Bound on each rank's connection to rank 0 (default 10 s).

    Returns:
        The verdict per host, with timings.

    Raises:
        InvalidArgumentError: no such slice with a valid shape, or a bound is not positive.
        NotConnectedError: Ray is not initialised.
        ReservationTimeoutError: the slice was not idle within ``timeout_s``.
    """
    for name, value in (("tpu_open_s", tpu_open_s), ("reach_s", reach_s)):
        if value is not None and not value > 0:
            raise InvalidArgumentError(f"{name} must be seconds > 0, got {value!r}")
    started = time.monotonic()
    with reserve_slices(whole_slice_request(_slice_named(slice_name), timeout_s)) as spg:
        health = _check_held(spg, check=check, tpu_open_s=tpu_open_s, reach_s=reach_s)[0]
    health = replace(health, seconds=time.monotonic() - started)
    record(health, "tpuslice.check_slice")
    return health


def record(health: SliceHealth, who: str) -> None:
    """Make a check's verdict the cluster's: clear a healthy slice, mark failed hosts
    suspect; ``who`` ran the check (for the log and the timeline)."""
    if health.ok:
        with contextlib.suppress(*_ray.kv_errors()):
            clear_slice(health.slice_name, f"health check passed ({who})")
        return
    mark_suspects(
        [
            Blame(h.node_id, health.slice_name, h.worker_id, SuspectReason.HEALTH_CHECK, h.reason)
            for h in health.failed
        ]
    )


def whole_slice_request(
    info: SliceInfo, timeout_s: float | None, tpu_resource_per_chip: int | None = None
) -> SliceRequest:
    """A request for exactly the slice ``info`` names, whole (its shape must be known)."""
    shape = info.shape
    assert shape is not None
    return SliceRequest(
        topology=shape.topology,
        accelerator_version=shape.generation.name,
        chips_per_vm=shape.chips_per_host,
        tpu_resource_per_chip=tpu_resource_per_chip,
        head_reservation_timeout_s=timeout_s,
        bundle_label_selector=[{SLICE_NAME_LABEL: info.name}] * shape.num_hosts,
    )


def _slice_named(slice_name: str) -> SliceInfo:
    """The slice of that name in a snapshot of the cluster, with a valid shape."""
    snapshot = read_snapshot()
    info = snapshot.slices.get(slice_name)
    if info is None or info.shape is None:
        have = ", ".join(sorted(n for n, s in snapshot.slices.items() if s.shape)) or "none"
        found = "no slice" if info is None else "a slice with no valid shape"
        raise InvalidArgumentError(
            f"cannot check {slice_name!r}: the cluster has {found} of that name; "
            f"slices: {have} (tpuslice status lists them)"
        )
    return info


class UnfitSlices(Exception):
    """A reservation's slices failed their health check before a retry ran on them;
    ``again``: they had failed before in this run, so nothing else could serve it."""

    def __init__(self, failed: Sequence[SliceHealth], again: bool) -> None:
        self.failed = tuple(failed)
        self.again = again
        super().__init__(self.cause)

    @property
    def cause(self) -> str:
        """What failed, host by host, in one line."""
        return "; ".join(
            f"{r.slice_name} host {h.worker_id}: {h.reason}" for r in self.failed for h in r.failed
        )


def _suspect_names(spg: SliceHandle) -> set[str]:
    return {info.name for info in suspect_slices(record_of(spg))}


@dataclass
class Vetting:
    """A resilient run's health checks (``health_check=True``): a retry's reservation is
    checked when a slice is suspect or the last attempt hung or lost a host on it.
    ``failed_checks`` are not checked again: landing on one, the run gives up.
    """

    check: Callable[[SliceHandle], list[SliceHealth]] = _check_held
    suspects_of: Callable[[SliceHandle], set[str]] = _suspect_names
    record: Callable[[SliceHealth, str], None] = record
    doubted: set[str] = field(default_factory=set)
    failed_checks: dict[str, SliceHealth] = field(default_factory=dict)

    def attempt_failed(self, slice_names: Sequence[str], on_the_hosts: bool) -> None:
        """Remember the slices of a failed attempt if the failure points at the hosts (a
        hang or a lost host; not the user's error, not a notice)."""
        self.doubted = set(slice_names) if on_the_hosts else set()

    def vet(self, spg: SliceHandle) -> str:
        """Check a retry's reservation if one of its slices is in doubt; return what was
        checked, for the ``started`` event (``""``: nothing). Raises :class:`UnfitSlices`
        if a slice failed (its hosts are now suspect)."""
        known = [self.failed_checks[n] for n in spg.slice_names if n in self.failed_checks]
        if known:  # checked and failed in this run: not worth another check's wait
            raise UnfitSlices(known, again=True)
        suspect = self.suspects_of(spg)
        doubtful = [n for n in spg.slice_names if n in suspect or n in self.doubted]
        if not doubtful:
            return ""
        results = self.check(spg)
        for result in results:
            self.record(result, "run_resilient")
        failed = [r for r in results if not r.ok]
        if failed:
            self.failed_checks.update((r.slice_name, r) for r in failed)
            raise UnfitSlices(failed, again=False)
        why = ", ".join(f"{n} ({'suspect' if n in suspect else 'failed last'})" for n in doubtful)
        took = max(r.seconds for r in results)
        return f"health check passed in {took:.1f} s on {why}"
