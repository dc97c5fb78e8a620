"""What the web view costs the cluster: reads per second of each source with 0, 1 and 10
pages open.

Starts a simulated cluster (4 x v6e 4x4: 16 hosts of ``--host-cpus`` CPUs), serves
``tpuslice dashboard``'s application in this process (so its reads can be counted), opens
the pages in Chromium (Playwright, the OS's browser) and counts, over ``--seconds`` with
each number of pages, every call the server makes to each source: the snapshot, the queue
record and the quotas (read within it), the holder records, the tenants' use, the goodput
accounts, the timeline and the physical layouts (one read of tpuslice's records and one
of Ray's sub-slice records for every slice). One slice is held meanwhile, so the
picture changes. The goal: at most one read per second of each source, whatever the
number of pages.

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

from tpuslice import SlicePlacementGroup
from tpuslice._reserve.queue import orders
from tpuslice._view import cluster, layouts
from tpuslice.cli import dashboard
from tpuslice.record import events, goodput
from tpuslice.testing import SimulatedCluster

READS = Counter[str]()
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
        READS[source] += 1
        return original(*args, **kwargs)

    setattr(module, name, wrapper)


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
    READS.clear()
    started = time.monotonic()
    time.sleep(seconds)  # the measurement window
    took = time.monotonic() - started
    counts = dict(READS)
    for page in opened:
        page.close()
    return {
        "pages": pages,
        "seconds": took,
        "per_second": {source: counts.get(source, 0) / took for source in SOURCES},
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


if __name__ == "__main__":
    main()
