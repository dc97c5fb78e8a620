"""This host: which TPU the current machine has, found without Ray.

Each fact comes from the first source that has it: the GKE/KubeRay environment
(``TPU_NAME``, ``TPU_WORKER_ID``, ``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``), then the GCE
metadata server (one short time budget, so it never hangs off GCP), and chips from ``/dev``.
The functions here take every source (``env``, ``metadata``, ``root``) so tests are
deterministic, but for Ray 2.60's public ones, which keep its names, signatures and results.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeAlias, TypeVar

from tpuslice._host.metadata import (
    MetadataClient,
)
from tpuslice._host.tpu_lock import tpu_devices
from tpuslice._tpu import labels as ray_names
from tpuslice._tpu import topology as topo
from tpuslice.errors import InvalidAcceleratorError, InvalidArgumentError

logger = logging.getLogger(__name__)

T = TypeVar("T")
Environ: TypeAlias = "Mapping[str, str]"
StrPath: TypeAlias = "str | os.PathLike[str]"

# Each fact: (GKE env var, GCE metadata attribute).
_SLICE_NAME = (ray_names.ENV_TPU_NAME, "instance-id")
_WORKER_ID = (ray_names.ENV_TPU_WORKER_ID, "agent-worker-number")
_POD_TYPE = (ray_names.ENV_TPU_ACCELERATOR_TYPE, "accelerator-type")
_TOPOLOGY = (ray_names.ENV_TPU_TOPOLOGY, "tpu-env")

# Kubernetes label value syntax, which `ray start --labels` enforces.
_TPU_ENV_TOPOLOGY_RE = re.compile(r"^\s*TOPOLOGY:\s*['\"]?([^'\"\s]+)['\"]?", re.MULTILINE)


# --- parsing one fact --------------------------------------------------------------------


def _parse_worker_id(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError("expected a worker id: a non-negative integer such as '0'")
    return int(text)


def _parse_pod_type(text: str) -> str:
    """``tpu7x-16`` -> ``v7x-16``, ``v5e-8`` -> ``v5litepod-8``: canonical generation spelling."""
    form = (
        "expected a pod type '<generation>-<size>' such as 'v6e-16' or 'tpu7x-16', "
        f"generation one of {', '.join(topo.GENERATIONS)}"
    )
    match = re.fullmatch(r"(.+)-([0-9]+)", topo.normalize_generation_name(text))
    if not match:
        raise ValueError(form)
    try:
        gen = topo.generation(match.group(1))
    except InvalidAcceleratorError as exc:
        raise ValueError(form) from exc
    size = int(match.group(2))
    if size < 1 or size % gen.cores_per_chip:
        raise ValueError(
            f"{form}; a {gen.name} size counts {gen.pod_type_counts}, "
            f"a positive multiple of {gen.cores_per_chip}"
        )
    return f"{gen.name}-{size}"


def _parse_topology(text: str) -> str:
    """``4X4`` -> ``4x4``; a malformed one raises InvalidTopologyError (a ValueError)."""
    return "x".join(str(side) for side in topo.parse_dims(text))


def _parse_tpu_env(text: str) -> str:
    """The topology in the metadata ``tpu-env`` blob (a line ``TOPOLOGY: '4x4'``)."""
    match = _TPU_ENV_TOPOLOGY_RE.search(text)
    if not match:
        raise ValueError("expected a line TOPOLOGY: '<AxB>' in tpu-env")
    return _parse_topology(match.group(1))


def _lookup(
    env: Environ,
    metadata: MetadataClient,
    names: tuple[str, str],
    parse_env: Callable[[str], T],
    parse_metadata: Callable[[str], T] | None = None,
) -> tuple[T, str] | None:
    """One fact and its source: env var ``names[0]`` if set, else metadata key ``names[1]``.

    A bad env value is the user's to fix, so it raises; bad metadata is logged and ignored.
    """
    var, key = names
    raw = env.get(var, "").strip()
    if raw:
        try:
            return parse_env(raw), f"env:{var}"
        except ValueError as exc:
            raise InvalidArgumentError(
                f"environment variable {var}={raw!r} is not valid: {exc}"
            ) from exc
    text = metadata.get(key)
    if text is None:
        return None
    try:
        return (parse_metadata or parse_env)(text), f"metadata:{key}"
    except ValueError as exc:
        logger.debug("ignoring metadata %s=%r: %s", key, text, exc)
        return None


def _topology(env: Environ, md: MetadataClient, pod_type: str | None) -> tuple[str, str] | None:
    """Env or ``tpu-env``; else the one topology the pod type allows (``v6e-16`` -> 4x4)."""
    found = _lookup(env, md, _TOPOLOGY, _parse_topology, _parse_tpu_env)
    if found or pod_type is None:
        return found
    try:
        return topo.parse_pod_type(pod_type).topology, "derived:pod-type"
    except ValueError as exc:  # ambiguous, or a size we know no shape for
        logger.debug("no topology for pod type %s: %s", pod_type, exc)
        return None


# --- devices -----------------------------------------------------------------------------


def count_tpu_chips(root: StrPath = "/") -> tuple[int, str]:
    """Chips on this host and where they were seen (``/dev/accel*``, ``/dev/vfio``, ``none``).

    Args:
        root: Filesystem root under which ``/dev`` and ``/sys`` are read.

    Returns:
        The chip count and its source; ``(0, "none")``, not an error, when no chip is
        seen or the directories cannot be read.
    """
    devices = tpu_devices(Path(root))
    if not devices:
        return 0, "none"
    return len(devices), "/dev/accel*" if devices[0].name.startswith("accel") else "/dev/vfio"


# --- what this host is -------------------------------------------------------------------


@dataclass(frozen=True)
class HostTPUInfo:
    """The TPU facts of this host; None (chips 0) where a fact was not found.

    ``sources`` maps each found fact to where it came from: ``env:TPU_NAME``,
    ``metadata:tpu-env``, ``derived:pod-type``, ``/dev/accel*``. It is not compared.

    Attributes:
        slice_name: The TPU slice (pod) this host belongs to.
        worker_id: This host's TPU worker id in the slice.
        topology: The slice's chip grid (``4x4``).
        chips: TPU chips on this host.
    """

    slice_name: str | None = None
    worker_id: int | None = None
    pod_type: str | None = None
    """Canonical spelling, as in Ray's labels: ``v6e-16``, ``v7x-16`` (GKE's ``tpu7x-16``)."""
    topology: str | None = None
    chips: int = 0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def generation(self) -> topo.Generation | None:
        """The generation the pod type names; None without a pod type."""
        return None if self.pod_type is None else topo.generation(self.pod_type.rsplit("-", 1)[0])

    @property
    def accelerator_type(self) -> str | None:
        """Ray's accelerator type: ``TPU-V6E``."""
        gen = self.generation
        return None if gen is None else gen.accelerator_type

    @property
    def worker_count(self) -> int | None:
        """Hosts in the slice, as Ray counts them: pod cores over this host's cores,
        rounded up (a sub-host slice is one host). None without a pod type or chips."""
        gen = self.generation
        if gen is None or self.pod_type is None or self.chips <= 0:
            return None
        cores = int(self.pod_type.rsplit("-", 1)[1])
        return -(-cores // (self.chips * gen.cores_per_chip))


def _resolve(
    env: Environ | None, metadata: MetadataClient | None
) -> tuple[Environ, MetadataClient]:
    """The real sources for whatever the caller did not inject."""
    return (os.environ if env is None else env), (metadata or MetadataClient())


def detect(
    *, env: Environ | None = None, metadata: MetadataClient | None = None, root: StrPath = "/"
) -> HostTPUInfo:
    """Everything this host knows about its TPU, each fact from its first source.

    Defaults: ``os.environ``, a fresh :class:`MetadataClient`, and the real ``/``.

    Args:
        env: Environment to read (default: ``os.environ``).
        metadata: GCE metadata client (default: a fresh :class:`MetadataClient`).
        root: Filesystem root under which ``/dev`` and ``/sys`` are read.

    Returns:
        The facts found; missing ones are None (chips 0), not errors, and a malformed
        metadata value counts as missing.

    Raises:
        InvalidArgumentError: a ``TPU_*`` environment variable is set but malformed.
    """
    env, metadata = _resolve(env, metadata)
    name = _lookup(env, metadata, _SLICE_NAME, str.strip)
    worker = _lookup(env, metadata, _WORKER_ID, _parse_worker_id)
    pod = _lookup(env, metadata, _POD_TYPE, _parse_pod_type)
    topology = _topology(env, metadata, pod[0] if pod else None)
    chips, chips_source = count_tpu_chips(root)
    facts = {"slice_name": name, "worker_id": worker, "pod_type": pod, "topology": topology}
    sources = {fact: found[1] for fact, found in facts.items() if found is not None}
    if chips:
        sources["chips"] = chips_source
    return HostTPUInfo(
        slice_name=name[0] if name else None,
        worker_id=worker[0] if worker else None,
        pod_type=pod[0] if pod else None,
        topology=topology[0] if topology else None,
        chips=chips,
        sources=MappingProxyType(sources),
    )


# --- Ray 2.60's public functions (ray.util.tpu), same names, signatures and results --------
# Each reads the real sources; the private function behind it takes them, for tests.


def get_current_pod_name() -> str | None:
    """The name of the TPU slice this host belongs to; None if not on a TPU pod.

    Returns:
        ``TPU_NAME``, else the metadata ``instance-id``; None, not an error, if neither.
    """
    return _pod_name()


def _pod_name(env: Environ | None = None, metadata: MetadataClient | None = None) -> str | None:
    found = _lookup(*_resolve(env, metadata), _SLICE_NAME, str.strip)
    return found[0] if found else None


def get_current_pod_worker_count() -> int | None:
    """Hosts in this host's TPU slice; None if not on a TPU pod or no chips are visible.

    Returns:
        Pod cores over this host's cores, rounded up; None, not an error, without a pod
        type or visible chips (a malformed metadata pod type counts as none).

    Raises:
        InvalidArgumentError: ``TPU_ACCELERATOR_TYPE`` is set but is not a pod type.
    """
    return _pod_worker_count()


def _pod_worker_count(
    env: Environ | None = None, metadata: MetadataClient | None = None, root: StrPath = "/"
) -> int | None:
    pod = _lookup(*_resolve(env, metadata), _POD_TYPE, _parse_pod_type)
    chips = count_tpu_chips(root)[0] if pod else 0
    return HostTPUInfo(pod_type=pod[0] if pod else None, chips=chips).worker_count


def get_num_tpu_chips_on_node() -> int:
    """TPU chips on this host; 0 if none. Reads only ``/dev`` and ``/sys``
    (:func:`count_tpu_chips`).

    Returns:
        The chip count; 0, not an error, when none is seen.
    """
    return count_tpu_chips()[0]
