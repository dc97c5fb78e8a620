"""What the web view costs the cluster: reads per second of each source with 0, 1 and 10
pages open.

Starts a simulated cluster (4 x v6e 4x4: 16 hosts of ``--host-cpus`` CPUs), serves
``tpuslice dashboard``'s application in this process (so its reads can be counted),
opens the pages in Chromium (Playwright, the OS's browser) and counts, over
``--seconds`` with each number of pages, every call the server makes to each source: the
snapshot, the queue record and the quotas (read within it), the holder records, the
tenants' use, the goodput accounts, the timeline and the physical layouts; and, under
them, every call to Ray's store and resource view (by call, namespace and key family).
Requests for one run's page (``/api/runs/<id>``, an older run's account read on each)
are not part of it. One slice is held meanwhile, so the picture changes. The goal: at
most one read per second of each source, whatever the number of pages.

Usage::

    python benchmarks/bench_dashboard.py [--host-cpus 1] [--seconds 20] [--pages 0,1,10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import ray

from tpuslice import SlicePlacementGroup
from tpuslice._reserve.queue import orders
from tpuslice._tpu import _ray
from tpuslice._view import cluster, layouts
from tpuslice.cli import dashboard
from tpuslice.record import events, goodput
from tpuslice.testing import SimulatedCluster

READS = Counter[str]()
CALLS = Counter[str]()
"""The store calls under those reads, by call and key family (``kv_get tpuslice/holder/``)."""
LOCK = threading.Lock()  # reads run on the server's thread and the snapshot's pool
SOURCES = (
    "snapshot",
    "queue record",
    "quotas",
    "holders",
    "usage",
    "accounts",
    "events",
    "layouts",
)


def counted(module: Any, name: str, source: str) -> None:
    """Count each call of ``module.name`` as a read of ``source``."""
    original: Callable[..., Any] = getattr(module, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with LOCK:
            READS[source] += 1
        return original(*args, **kwargs)

    setattr(module, name, wrapper)


def family(key: str) -> str:
    """A key's family: up to its last ``/`` (``tpuslice-holder/``), else the key."""
    return key[: key.rindex("/") + 1] if "/" in key else key


def counted_calls() -> None:
    """Count every store call Ray's seam makes, by call, namespace and key family."""
    for name in ("kv_get", "kv_get_many", "kv_list", "available_resources_per_node"):
        original: Callable[..., Any] = getattr(_ray, name)

        def wrapper(*args: Any, _original: Any = original, _name: str = name) -> Any:
            first = args[0] if args else ""
            keys = first if isinstance(first, list) else [first]
            namespace = args[1] if len(args) > 1 else ""
            what = ", ".join(sorted({family(k) for k in keys})) or "(no keys)"
            with LOCK:
                CALLS[f"{_name} {namespace or ''} {what}".strip()] += 1
            return _original(*args)

        setattr(_ray, name, wrapper)
    original_nodes = ray.nodes

    def nodes() -> Any:
        with LOCK:
            CALLS["ray.nodes()"] += 1
        return original_nodes()

    ray.nodes = nodes


def count_reads() -> None:
    counted(cluster, "read_snapshot", "snapshot")
    counted(cluster, "read_queue_record", "queue record")
    counted(cluster, "read_quotas", "quotas")
    counted(orders, "read_quotas", "quotas")
    counted(dashboard, "read_holders", "holders")
    counted(dashboard, "read_usage", "usage")
    counted(goodput, "read_accounts", "accounts")
    counted(events, "read_events", "events")
    counted(layouts, "load_all", "layouts")


def serve_in_thread() -> str:
    """The dashboard's application on a free loopback port, in a daemon thread; its URL."""
    urls: list[str] = []
    app = dashboard.make_app(dashboard.Picture(dashboard.read_state))
    thread = threading.Thread(
        target=lambda: asyncio.run(dashboard.serve(app, "127.0.0.1", 0, urls.append)),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not urls:
        if time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not start listening in 30 s")
        time.sleep(0.01)
    return urls[0]


def measure(browser: Any, url: str, pages: int, seconds: float) -> dict[str, Any]:
    """Open ``pages`` pages, wait until each shows the cluster, then count reads."""
    opened = [browser.new_page() for _ in range(pages)]
    for page in opened:
        page.goto(url)
        page.wait_for_selector('#connection[data-state="connected"]', timeout=60_000)
    with LOCK:
        READS.clear()
        CALLS.clear()
    started = time.monotonic()
    time.sleep(seconds)  # the measurement window
    took = time.monotonic() - started
    with LOCK:
        counts, calls = dict(READS), dict(CALLS)
    for page in opened:
        page.close()
    return {
        "pages": pages,
        "seconds": took,
        "per_second": {source: counts.get(source, 0) / took for source in SOURCES},
        "calls_per_second": {call: n / took for call, n in sorted(calls.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host-cpus", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pages", default="0,1,10")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Chromium: apt-get install chromium")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"commit {commit}, load at start {os.getloadavg()[0]:.1f}", flush=True)
    count_reads()
    counted_calls()
    results = []
    with (
        SimulatedCluster([("v6e", "4x4", 4)], cpus_per_host=args.host_cpus, connect=True),
        SlicePlacementGroup(topology="4x4", accelerator_version="v6e"),
        sync_playwright() as playwright,
    ):
        url = serve_in_thread()
        browser = playwright.chromium.launch(executable_path=chromium)
        for pages in (int(p) for p in args.pages.split(",")):
            results.append(measure(browser, url, pages, args.seconds))
        browser.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print("| pages open | " + " | ".join(SOURCES) + " |")
    print("|--:|" + "--:|" * len(SOURCES))
    for result in results:
        rates = " | ".join(f"{result['per_second'][s]:.2f}" for s in SOURCES)
        print(f"| {result['pages']} | {rates} |")
    print("\nstore calls per second (Ray's seam), by call and key family:")
    for result in results:
        calls = result["calls_per_second"]
        print(f"{result['pages']} page(s): " + "; ".join(f"{c}: {n:.2f}" for c, n in calls.items()))


if __name__ == "__main__":
    main()
