"""Recording slice layouts in Ray's KV store: tpuslice's record and Ray's (their format
is :mod:`tpuslice._view.layouts`, which reads them). Discovery records what it learned
(:func:`save`), and a sub-slice reservation that finds only Ray's record records it as
tpuslice's, with today's nodes (:func:`load`).
"""

from __future__ import annotations

import json
import time

from tpuslice._tpu import _ray, subslice
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import LAYOUT_KEY_PREFIX as KEY_PREFIX
from tpuslice._tpu.keys import NAMESPACE, RAY_SUBSLICE_NAMESPACE
from tpuslice._view import layouts
from tpuslice._view.cluster import SliceInfo
from tpuslice._view.layouts import Layout


def load(info: SliceInfo) -> Layout | None:
    """The layout of a slice, as :func:`tpuslice._view.layouts.load` finds it; one found
    only in Ray's record is recorded as tpuslice's, with today's nodes.

    Args:
        info: The slice now.

    Returns:
        tpuslice's record if current, else one read from Ray's (recorded now as ours,
        with today's nodes), else ``None``: the slice must be discovered.
    """
    found = layouts.load(info)
    if found is None or found.nodes is not None:
        return found
    nodes = {w: h.node_id for w, h in info.hosts.items() if h.alive}
    layout = Layout(info.name, info.topology, found.physical, nodes)
    save(layout, ray_too=False, source="ray")
    return layout


def save(layout: Layout, *, ray_too: bool = True, source: str = "tpuslice") -> None:
    """Record a layout: tpuslice's record, and Ray's (so Ray's API reads it).

    Args:
        layout: What discovery learned.
        ray_too: Also write Ray's record.
        source: Who learned it: ``tpuslice``, or ``ray`` (read from Ray's record).
    """
    data = {
        "topology": layout.topology,
        "physical": {str(w): p for w, p in layout.physical.items()},
        "nodes": {str(w): n for w, n in (layout.nodes or {}).items()},
        "source": source,
        "learned_at": time.time(),
    }
    _ray.kv_put(KEY_PREFIX + layout.slice_name, json.dumps(data).encode(), NAMESPACE)
    if layout.nodes is not None:
        connection().part(layouts.KnownLayouts).keep(layout)
    if ray_too:
        record = json.dumps(layout.ray_labels()).encode()
        _ray.kv_put(subslice.kv_key(layout.slice_name).decode(), record, RAY_SUBSLICE_NAMESPACE)
