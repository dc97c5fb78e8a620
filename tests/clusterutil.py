"""Helpers shared by the cluster tests (bounded polling, holding hosts busy)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from tpuslice.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


@contextmanager
def hold_host(slice_name: str, worker_id: int, tpu: float = 1) -> Iterator[PlacementGroup]:
    """Keep ``tpu`` TPUs of one host in use (a placement group), as another user would."""
    pg = placement_group(
        [{"TPU": tpu}],
        bundle_label_selector=[{SLICE_NAME_LABEL: slice_name, WORKER_ID_LABEL: str(worker_id)}],
    )
    try:
        ray.get(pg.ready(), timeout=30)
        yield pg
    finally:
        remove_placement_group(pg)


@ray.remote(num_cpus=0)
def where_am_i() -> dict[str, Any]:
    """What a task sees of its host: TPU env, node labels, pid."""
    context = ray.get_runtime_context()
    return {
        "TPU_NAME": os.environ.get("TPU_NAME"),
        "TPU_WORKER_ID": os.environ.get("TPU_WORKER_ID"),
        "TPU_ACCELERATOR_TYPE": os.environ.get("TPU_ACCELERATOR_TYPE"),
        "TPU_TOPOLOGY": os.environ.get("TPU_TOPOLOGY"),
        "labels": context.get_node_labels(),
        "node_id": context.get_node_id(),
        "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TPUSLICE_", "MEGASCALE_"))},
    }
