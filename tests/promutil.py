"""A real Prometheus for the tests: Debian's ``prometheus`` binary, listening on loopback
only, scraping what Ray's service-discovery file lists, as Ray's docs set it up; and the
checks that evaluate the shipped Grafana dashboard's queries through its HTTP API."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from clusterutil import free_port, wait_for

SD_FILE = "prom_metrics_service_discovery.json"
"""Ray's file-based service discovery: every live node's metrics export address. Ray's
dashboard head writes it in the session directory (and links it from the temp
directory, ``/tmp/ray/``)."""

INSTALL_HINT = "apt-get install prometheus (.ci/run installs it)"

# Ray's own writer, the one its dashboard head runs, in a process of its own: the
# simulator starts the head without the dashboard modules, so nobody else writes the
# file there. Ray has no public API for it.
SD_WRITER = (
    "import sys\n"
    "from ray._private.metrics_agent import PrometheusServiceDiscoveryWriter\n"
    "PrometheusServiceDiscoveryWriter(*sys.argv[1:4]).run()\n"
)

STOP_S = 10.0
"""Seconds a process has to exit after SIGTERM before it is killed."""


class PrometheusError(AssertionError):
    """Prometheus answered with an error, or not at all."""


class Prometheus:
    """A Prometheus server this test started; its HTTP API.

    Args:
        url: Its base URL, on loopback.
        log: Its log file (for failure messages).
    """

    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log

    def get(self, path: str, **params: str) -> Any:
        """GET an API path; its ``data`` when the answer is ``success``."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # a bad query: the body says why
            answer = json.loads(exc.read() or b"{}")
        return data_of(answer)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar) that ``expr`` evaluates to now."""
        return series_of(self.get("/api/v1/query", query=expr))

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus holds samples of."""
        return set(self.get("/api/v1/label/__name__/values"))

    def targets_up(self) -> list[str]:
        """The scraped targets whose last scrape succeeded."""
        active = self.get("/api/v1/targets", state="active")["activeTargets"]
        return [t["scrapeUrl"] for t in active if t["health"] == "up"]

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def data_of(answer: dict[str, Any]) -> Any:
    """The ``data`` of an API answer; :class:`PrometheusError` naming the error if its
    status is not ``success``."""
    if answer.get("status") != "success":
        raise PrometheusError(f"{answer.get('errorType')}: {answer.get('error')}")
    return answer["data"]


def series_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The series of a query's ``data``: ``{"metric": labels, "value": float}`` each (a
    scalar is one series with no labels)."""
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": float(data["result"][1])}]
    if data["resultType"] != "vector":
        raise PrometheusError(f"an instant query gave a {data['resultType']}")
    return [{"metric": s["metric"], "value": float(s["value"][1])} for s in data["result"]]


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every query of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def substitute(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with the dashboard's template variables (``$name``, ``${name}``)
    replaced; a variable not in ``variables`` fails, so no query is sent half-filled."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise PrometheusError(f"no value for the template variable ${name} in {expr}")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def query_problems(
    query: Callable[[str], list[dict[str, Any]]], known: set[str], expr: str
) -> list[str]:
    """Why ``expr`` shows nothing real: a ``ray_*`` metric it names that Prometheus has
    no samples of, no series at all, or only NaN (a rate of no change, a quantile of
    nothing). Empty when it returns at least one number."""
    missing = sorted(set(re.findall(r"\bray_\w+", expr)) - known)
    problems = [f"names {name}, which Prometheus has no samples of" for name in missing]
    try:
        series = query(expr)
    except PrometheusError as exc:
        return [*problems, f"was refused: {exc}"]
    if not series:
        problems.append("returned no series")
    elif all(math.isnan(s["value"]) for s in series):
        problems.append(f"returned only NaN ({len(series)} series)")
    return problems


def dashboard_problems(
    prometheus: Prometheus, queries: list[tuple[str, str]], variables: dict[str, str]
) -> list[str]:
    """Every problem of every query, as ``panel: expr: problem``."""
    known = prometheus.metric_names()
    found = []
    for title, expr in queries:
        filled = substitute(expr, variables)
        found += [
            f"{title}: {filled}: {p}" for p in query_problems(prometheus.query, known, filled)
        ]
    return found


@contextmanager
def ray_service_discovery(
    session_dir: Path, temp_dir: Path, gcs_address: str, logs: Path
) -> Iterator[Path]:
    """Ray's service-discovery file of the session, once written; if the head writes
    none, Ray's own writer runs in a process of ours until the context ends."""
    path = session_dir / SD_FILE
    if path.exists():
        yield path
        return
    with (logs / "sd_writer.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SD_WRITER, gcs_address, str(temp_dir), str(session_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: path.exists() or proc.poll() is not None, 30, f"Ray to write {path}")
        assert path.exists(), (logs / "sd_writer.log").read_text(errors="replace")[-3000:]
        yield path
    finally:
        stop(proc)
        # Ours, not the head's: gone with the writer, or the next test would read a
        # stale list as the head's.
        path.unlink(missing_ok=True)
        legacy = temp_dir / SD_FILE
        if legacy.is_symlink() and legacy.readlink() == path:
            legacy.unlink()


@contextmanager
def running_prometheus(targets: Path, workdir: Path) -> Iterator[Prometheus]:
    """A Prometheus on a free loopback port, with its own storage under ``workdir``,
    scraping every second what ``targets`` (a file_sd file, which may not exist yet)
    lists; yields once it is ready. Skips the test when there is no ``prometheus``
    binary."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(f"no prometheus binary on PATH: {INSTALL_HINT}")
    config = workdir / "prometheus.yml"  # JSON is YAML: no quoting of the path to get wrong
    config.write_text(json.dumps(scrape_config(targets)))
    address = f"127.0.0.1:{free_port()}"
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address={address}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://{address}", log)
    try:
        wait_for(lambda: proc.poll() is not None or _ready(server), 30, "Prometheus ready")
        assert proc.poll() is None, f"Prometheus exited:\n{server.log_tail()}"
        yield server
    finally:
        stop(proc)


def scrape_config(targets: Path) -> dict[str, Any]:
    """One job, ``ray``, as Ray's own prometheus.yml has it, at 1 s instead of 10 s."""
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "ray",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            }
        ],
    }


def _ready(server: Prometheus) -> bool:
    try:
        with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:  # not listening yet, or 503 while it starts
        return False


def stop(proc: subprocess.Popen[Any]) -> None:
    """End a process we started: SIGTERM, then SIGKILL if it has not exited in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_S)


def wait_for_answer(check: Callable[[], list[str]], timeout: float) -> list[str]:
    """Poll ``check`` (a list of problems) until it finds none or ``timeout`` passes;
    the last problems found (samples reach Prometheus a few seconds late)."""
    deadline = time.monotonic() + timeout
    while True:
        problems = check()
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.5)
