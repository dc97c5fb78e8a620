"""Recording slice layouts in Ray's KV store, as tpuslice's record and Ray's (read by
:mod:`tpuslice._view.layouts`)."""

from __future__ import annotations

import json
import time

from tpuslice._tpu import _ray, subslice
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import LAYOUT_KEY_PREFIX, NAMESPACE, RAY_SUBSLICE_NAMESPACE
from tpuslice._view import layouts
from tpuslice._view.cluster import SliceInfo
from tpuslice._view.layouts import Layout


def load(info: SliceInfo) -> Layout | None:
    """A slice's recorded layout, with today's nodes (``None``: it must be discovered).
    One found only in Ray's record is recorded as ours."""
    found = layouts.load(info)
    if found is None or found.nodes is not None:
        return found
    nodes = {w: h.node_id for w, h in info.hosts.items() if h.alive}
    layout = Layout(info.name, info.topology, found.physical, nodes)
    save(layout, ray_too=False, source="ray")
    return layout


def save(layout: Layout, *, ray_too: bool = True, source: str = "tpuslice") -> None:
    """Record a layout as tpuslice's and (``ray_too``) as Ray's, so Ray's API reads it;
    ``source`` says who learned it: ``tpuslice`` or ``ray``."""
    data = {
        "topology": layout.topology,
        "physical": {str(w): p for w, p in layout.physical.items()},
        "nodes": {str(w): n for w, n in (layout.nodes or {}).items()},
        "source": source,
        "learned_at": time.time(),
    }
    _ray.kv_put(LAYOUT_KEY_PREFIX + layout.slice_name, json.dumps(data).encode(), NAMESPACE)
    if layout.nodes is not None:
        connection().part(layouts.KnownLayouts).keep(layout)
    if ray_too:
        record = json.dumps(layout.ray_labels()).encode()
        _ray.kv_put(subslice.kv_key(layout.slice_name).decode(), record, RAY_SUBSLICE_NAMESPACE)
