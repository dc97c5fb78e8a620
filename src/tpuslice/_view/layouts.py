"""Where each host of a slice physically sits, read from Ray's KV store
(:mod:`tpuslice._run.layout_records` learns and writes it): Ray's record, or tpuslice's,
which also names the nodes it was learned on, so replaced hosts are discovered again.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import ray

from tpuslice._tpu import _ray, subslice
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import LAYOUT_KEY_PREFIX as KEY_PREFIX
from tpuslice._tpu.keys import NAMESPACE, RAY_SUBSLICE_NAMESPACE
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo
from tpuslice.errors import DiscoveryFailedError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """One slice's physical layout: each TPU worker id's physical position, and its node id
    when the layout was learned (``nodes`` is ``None`` for a layout from Ray's record)."""

    slice_name: str
    topology: str
    physical: Mapping[int, int]
    nodes: Mapping[int, str] | None

    def current_for(self, info: SliceInfo) -> bool:
        """Whether this layout still describes the slice now: every worker id known and,
        where recorded, on the same node."""
        if set(self.physical) != set(range(info.expected_hosts)) or info.topology != self.topology:
            return False
        if self.nodes is None:
            return True
        return all(self.nodes.get(w) == h.node_id for w, h in info.hosts.items() if h.alive)

    def ray_labels(self) -> dict[str, dict[str, str]]:
        """Ray's record: ``{worker id (a string): {label key: index}}``."""
        return {
            str(w): subslice.host_labels(p, self.topology) for w, p in sorted(self.physical.items())
        }


def positions_from_coordinates(
    coordinates: Mapping[int, list[list[int]]], topology: str
) -> dict[int, int]:
    """Each TPU worker's physical position from its chips' coordinates. Pure. Raises
    :class:`DiscoveryFailedError` if a worker reported nothing or two share a position."""
    found: dict[int, int] = {}
    for worker, coords in sorted(coordinates.items()):
        if not coords:
            raise DiscoveryFailedError(f"TPU worker {worker} reported no chip coordinates")
        found[worker] = subslice.physical_position(coords, topology)
    if len(set(found.values())) != len(found):
        raise DiscoveryFailedError(
            f"chip coordinates put two workers at one place in {topology}: {found}"
        )
    return found


class KnownLayouts:
    """Layouts this connection has read or learned, by slice name. One tied to node ids
    cannot change while those nodes live, so it is reused while :meth:`Layout.current_for`
    holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layouts: dict[str, Layout] = {}

    def get(self, slice_name: str) -> Layout | None:
        """This process's copy of a slice's layout, if any."""
        with self._lock:
            return self._layouts.get(slice_name)

    def keep(self, layout: Layout) -> None:
        """Keep a layout tied to node ids (replacing the slice's copy)."""
        with self._lock:
            self._layouts[layout.slice_name] = layout

    def forget(self, slice_name: str) -> None:
        with self._lock:
            self._layouts.pop(slice_name, None)


def forget(slice_name: str) -> None:
    """Drop this process's copy of a slice's layout (the records stay)."""
    connection().part(KnownLayouts).forget(slice_name)


def load(info: SliceInfo) -> Layout | None:
    """The layout of a slice: this process's copy if still current, else tpuslice's
    record if current, else Ray's; ``None``: the slice must be discovered."""
    known = connection().part(KnownLayouts)
    cached = known.get(info.name)
    if cached is not None and cached.current_for(info):
        return cached
    found = _read(info)
    if found is not None and found.nodes is not None:
        known.keep(found)
    return found


def load_all(snapshot: ClusterSnapshot) -> dict[str, dict[int, int]]:
    """Each slice's ``{worker id: physical position}`` where learned, for the slices that
    can have sub-slices (4 chips per host, several hosts); read only, in one read of each
    namespace for the slices this process has no current copy of."""
    known = connection().part(KnownLayouts)
    found, missing = {}, []
    for info in snapshot.slices.values():
        if info.shape is None or info.shape.chips_per_host != 4 or info.shape.is_single_host:
            continue
        cached = known.get(info.name)
        if cached is not None and cached.current_for(info):
            found[info.name] = dict(cached.physical)
        else:
            missing.append(info)
    ours = _ray.kv_get_many([KEY_PREFIX + i.name for i in missing], NAMESPACE)
    rays = [subslice.kv_key(i.name).decode() for i in missing]
    theirs = _ray.kv_get_many(rays, RAY_SUBSLICE_NAMESPACE)
    for info, ray_key in zip(missing, rays, strict=True):
        raw = ours.get(KEY_PREFIX + info.name)
        layout = _parse(info, raw, functools.partial(theirs.get, ray_key))
        if layout is not None:
            if layout.nodes is not None:
                known.keep(layout)
            found[info.name] = dict(layout.physical)
    return found


def _read(info: SliceInfo) -> Layout | None:
    """tpuslice's record of the slice if current, else Ray's."""
    raw = _ray.kv_get(KEY_PREFIX + info.name, NAMESPACE)
    key = subslice.kv_key(info.name).decode()
    return _parse(info, raw, functools.partial(_ray.kv_get, key, RAY_SUBSLICE_NAMESPACE))


def _parse(
    info: SliceInfo, raw: bytes | None, ray_raw: Callable[[], bytes | None]
) -> Layout | None:
    """tpuslice's record ``raw`` of the slice if current, else Ray's (``ray_raw()``)."""
    if raw is not None:
        try:
            data = json.loads(raw)
            layout = Layout(
                info.name,
                str(data["topology"]),
                {int(w): int(p) for w, p in data["physical"].items()},
                {int(w): str(n) for w, n in data["nodes"].items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring the unreadable layout record of %s: %s", info.name, exc)
        else:
            return layout if layout.current_for(info) else None
    return _from_ray_record(info, ray_raw())


def _from_ray_record(info: SliceInfo, raw: bytes | None) -> Layout | None:
    if raw is None:
        return None
    try:
        labels = json.loads(raw)
        physical = {
            int(w): subslice.physical_from_labels(ls, info.topology) for w, ls in labels.items()
        }
    except (ValueError, TypeError, AttributeError) as exc:
        logger.warning("ignoring Ray's unreadable sub-slice record of %s: %s", info.name, exc)
        return None
    if any(p is None for p in physical.values()):
        return None
    layout = Layout(
        info.name, info.topology, {w: p for w, p in physical.items() if p is not None}, None
    )
    return layout if layout.current_for(info) else None


def chip_coordinates_here() -> list[list[int]]:
    """This host's chips' coordinates (``[x, y]`` or ``[x, y, z]`` each), from libtpu's
    SDK; runs on the host. ``RuntimeError`` without libtpu."""
    try:
        from libtpu import sdk
    except ImportError as exc:
        raise RuntimeError(
            "libtpu is needed on TPU hosts to learn a slice's physical layout "
            "(pip install libtpu on every TPU host)"
        ) from exc
    return [list(chip.coordinates()) for chip in sdk.slice.get_chip_coordinates()]


coordinates_task = ray.remote(num_cpus=0, max_retries=0)(chip_coordinates_here)
