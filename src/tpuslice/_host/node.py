"""Which TPU this machine has, found without Ray: each fact from the ``TPU_*`` environment
(GKE, KubeRay), else the GCE metadata server; chips from ``/dev``. Sources are injectable,
except in Ray 2.60's public functions, which keep Ray's signatures."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeAlias, TypeVar

from tpuslice._host.metadata import MetadataClient
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

_TPU_ENV_TOPOLOGY_RE = re.compile(r"^\s*TOPOLOGY:\s*['\"]?([^'\"\s]+)['\"]?", re.MULTILINE)


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
    A bad env value is the user's to fix, so it raises; bad metadata is ignored."""
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


def count_tpu_chips(root: StrPath = "/") -> tuple[int, str]:
    """Chips under ``root`` and where seen: ``/dev/accel*``, ``/dev/vfio``, or ``none``."""
    devices = tpu_devices(Path(root))
    if not devices:
        return 0, "none"
    return len(devices), "/dev/accel*" if devices[0].name.startswith("accel") else "/dev/vfio"


@dataclass(frozen=True)
class HostTPUInfo:
    """The TPU facts of this host; None (chips 0) where a fact was not found."""

    slice_name: str | None = None
    worker_id: int | None = None
    pod_type: str | None = None
    """Canonical spelling, as in Ray's labels: ``v7x-16`` (GKE's ``tpu7x-16``)."""
    topology: str | None = None
    chips: int = 0
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    """Where each found fact came from (``env:TPU_NAME``)."""

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
        """Hosts in the slice as Ray counts them: pod cores over this host's, rounded up."""
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
    """This host's TPU facts; a malformed ``TPU_*`` variable raises, bad metadata is unused."""
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


def get_current_pod_name() -> str | None:
    """The name of the TPU slice this host belongs to; None if not on a TPU pod.

    Returns:
        ``TPU_NAME``, else the metadata ``instance-id``, else None.
    """
    return _pod_name()


def _pod_name(env: Environ | None = None, metadata: MetadataClient | None = None) -> str | None:
    found = _lookup(*_resolve(env, metadata), _SLICE_NAME, str.strip)
    return found[0] if found else None


def get_current_pod_worker_count() -> int | None:
    """Hosts in this host's TPU slice; None if not on a TPU pod or no chips are visible.

    Returns:
        Pod cores over this host's cores, rounded up; None without a pod type or chips.

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
    """TPU chips on this host, from ``/dev`` and ``/sys``.

    Returns:
        The chip count; 0 when none is seen.
    """
    return count_tpu_chips()[0]
