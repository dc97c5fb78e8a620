"""`tpuslice dashboard` in a real browser (Playwright driving the OS's Chromium) on the
simulator: every slice and host with its state; another driver's reservation turns its
slice BUSY on the open page within 2 s and its hand-back READY again; a waiting request
shows its tenant and reason; a killed host shows BROKEN and a failed health check SUSPECT
within 10 s; a run's goodput bar appears when it ends and its page opens; the teams view
shows a quota and its use; the timeline filters by slice; and the page logs no error."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

import tpuslice
from clusterutil import wait_for
from tpuslice._run import health
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice.cli.commands import main
from tpuslice.record import goodput
from tpuslice.testing import SimulatedCluster

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
V6E = {"topology": "4x4", "accelerator_version": "v6e"}
SCREENSHOT_ENV = "TPUSLICE_DASHBOARD_SCREENSHOT"
"""Where to save the page's screenshot as well (the docs' picture comes from this test)."""

HOLD_IN_ANOTHER_DRIVER = """
import sys, ray, tpuslice
ray.init(address=sys.argv[1], log_to_driver=False)
shape = {"topology": "4x4", "accelerator_version": "v6e"}
with tpuslice.SlicePlacementGroup(**shape, tenant="research") as spg:
    print("held", spg.slice_names[0], flush=True)
    sys.stdin.readline()
print("handed back", flush=True)
"""

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="no Chromium here (CI installs it: .ci/run)",
)


def first_line(proc: subprocess.Popen[str], timeout: float = 120.0) -> str:
    """The process's first line of output, waited for at most ``timeout`` seconds."""
    assert proc.stdout is not None
    with ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(proc.stdout.readline).result(timeout=timeout)
        except futures.TimeoutError:
            proc.kill()  # ends the read too
            raise


@contextmanager
def dashboard(address: str, log: Path) -> Iterator[str]:
    """`tpuslice dashboard` in a process of its own, as a user runs it; yields its URL."""
    with log.open("w") as errors:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpuslice.cli",
                "dashboard",
                "--address",
                address,
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    try:
        line = first_line(proc)  # it names the URL
        assert "http://127.0.0.1:" in line, (line, log.read_text()[-3000:])
        yield line.split()[2]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, how a user stops it
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def held_by_another_driver(address: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A driver process holding the v6e 4x4 slice as tenant ``research`` until it is told
    to hand it back; yields the slice's name and the process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_IN_ANOTHER_DRIVER, address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    try:
        line = first_line(proc)
        assert line.startswith("held "), line
        yield line.split()[1], proc
    finally:
        if proc.poll() is None:
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.wait(timeout=60)


def host(slice_name: str, worker: int, state: str) -> str:
    return f'.host[data-slice="{slice_name}"][data-worker="{worker}"][data-state="{state}"]'


def test_the_dashboard_shows_the_cluster_live_in_a_browser(
    tpu_cluster: SimulatedCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "CI must have Chromium (.ci/run installs it)"
    address = tpu_cluster.address
    snapshot = read_snapshot()
    runner = CliRunner()
    problems: list[str] = []
    quota = runner.invoke(main, ["quota", "set", "research", "--slices", "v6e-16=1"])
    assert quota.exit_code == 0, quota.output
    try:
        with dashboard(address, tmp_path / "dashboard.log") as url, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on(
                "console",
                lambda m: problems.append(m.text) if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url)

            # Every slice and every host, with its state.
            for info in snapshot.slices.values():
                page.wait_for_selector(f'section.slice[data-slice="{info.name}"]', timeout=10_000)
                for worker in info.hosts:
                    page.wait_for_selector(host(info.name, worker, "READY"), timeout=10_000)

            # Another driver's reservation, a request that waits behind it, the hand-back.
            with held_by_another_driver(address) as (name, holder):
                page.wait_for_selector(
                    f'section.slice[data-slice="{name}"][data-state="BUSY"]', timeout=2_000
                )
                team = page.locator('#teams tr.team[data-tenant="research"]')
                wait_for(lambda: "v6e-16=1" in team.inner_text(), 10, "research's quota row")
                held = team.locator("td").nth(4)  # tenant, quota, borrow limit, weight, held
                wait_for(lambda: held.inner_text() == "1", 10, "research's slice held")
                with ThreadPoolExecutor(1) as pool:
                    waiting: Future[list[str]] = pool.submit(wait_and_hand_back)
                    try:
                        request = page.locator('#queue tr.request[data-tenant="research"]')
                        request.wait_for(timeout=10_000)
                        assert "research" in request.inner_text()
                        assert request.locator("td").last.inner_text().strip()  # its reason
                        if os.environ.get(SCREENSHOT_ENV):  # busy, and someone waiting
                            page.screenshot(path=os.environ[SCREENSHOT_ENV], full_page=True)
                    finally:  # the waiting reservation gets the slice only once it goes
                        assert holder.stdin is not None
                        holder.stdin.write("\n")
                        holder.stdin.flush()
                    assert waiting.result(timeout=60) == [name]
            page.wait_for_selector(
                f'section.slice[data-slice="{name}"][data-state="READY"]', timeout=2_000
            )

            # A killed host shows BROKEN within 10 s.
            tpu_cluster.kill_host("v4-16-b", 1)
            page.wait_for_selector(host("v4-16-b", 1, "BROKEN"), timeout=10_000)
            tpu_cluster.restore_slice("v4-16-b")
            wait_for(lambda: read_snapshot().slices["v4-16-b"].state is SliceState.READY, 60)

            # A failed health check shows SUSPECT within 10 s.
            monkeypatch.setattr(health, "TPU_OPEN_S", 3.0)
            tpu_cluster.wedge_tpu("v4-16-a", 1)
            try:
                assert not tpuslice.check_slice("v4-16-a").ok
                page.wait_for_selector(host("v4-16-a", 1, "SUSPECT"), timeout=10_000)
            finally:
                tpu_cluster.repair_host("v4-16-a", 1)
                monkeypatch.undo()

            # A run's goodput bar, and its page.
            before = {a.run_id for a in goodput.read_accounts()}
            ray.get(tpuslice.run_on_slice(one, topology="2x2x2", accelerator_version="v4"))
            new = wait_for(
                lambda: [a.run_id for a in goodput.read_accounts() if a.run_id not in before],
                30,
                "the run's goodput account (kept once its hand-back ends)",
            )
            run_id = new[0]
            run = page.locator(f'div.run[data-run="{run_id}"]')
            run.locator("canvas.goodput-bar").wait_for(timeout=10_000)
            with page.expect_navigation():
                run.locator(f'a[href="/runs/{run_id}"]').click()
            page.wait_for_selector("canvas", timeout=10_000)
            assert run_id in page.content()
            page.go_back()

            # The timeline, filtered by slice.
            page.wait_for_selector("#timeline tr.event", timeout=10_000)
            page.select_option("#filter-slice", name)
            shown = page.locator("#timeline tr.event:visible")
            wait_for(lambda: shown.count() > 0, 10, "events of the chosen slice")
            for index in range(shown.count()):
                assert name in (shown.nth(index).get_attribute("data-slices") or "").split(",")
            hidden = page.locator("#timeline tr.event:not(:visible)")
            assert hidden.count() > 0  # other slices' events are there, filtered out

            page.select_option("#filter-slice", "")
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            browser.close()
    finally:
        removed = runner.invoke(main, ["quota", "rm", "research"])
        assert removed.exit_code == 0, removed.output
    assert problems == []


def wait_and_hand_back() -> list[str]:
    """Reserve the v6e 4x4 slice as tenant ``research`` too (within its quota once the
    other driver hands it back, so it waits until then), then hand it back; the slices."""
    with tpuslice.SlicePlacementGroup(**V6E, tenant="research") as spg:
        return list(spg.slice_names)


@ray.remote
def one() -> int:
    return 1
