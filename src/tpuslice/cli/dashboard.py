"""``tpuslice dashboard``: a read-only web page of the connected cluster, updated live.

One reader serves every open page: it reads the cluster at most once a second, through the
same library functions the other commands use, and each page gets the same JSON pushed as
server-sent events. The pages under ``web/`` draw that JSON in the browser. The server is
``aiohttp`` (installed with ``ray[default]``; the ``dashboard`` extra names it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tpuslice._reserve.queue.orders import read_usage
from tpuslice._view import cluster, layouts
from tpuslice._view.cluster import ClusterSnapshot, HostState, SliceInfo
from tpuslice._view.holders import Holder, read_holders
from tpuslice.cli import status
from tpuslice.cli.connect import UsageError, address_option, connected
from tpuslice.cli.quota import team_rows
from tpuslice.errors import first_line
from tpuslice.record import events, goodput
from tpuslice.record.events import SliceEvent
from tpuslice.record.goodput import Account

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["Picture", "dashboard_command", "state_dict"]

WEB = Path(__file__).with_name("web")
READ_EVERY_S = 1.0
"""How often the reader reads the cluster while a page is open."""
READ_BOUND_S = 10.0
"""A read that takes longer shows the cluster as disconnected until one answers."""
RUNS_SHOWN = 20
EVENTS_SHOWN = 200
DEFAULT_PORT = 8266
"""Beside Ray's own dashboard (8265)."""
RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")
FILTERS = ("slice", "tenant")
"""The query parameters the cluster page takes (they preset the timeline's filters)."""
MAX_FILTER_CHARS = 200
PROMPT = "tpuslice dashboard:"
EXTRA_HINT = "the dashboard needs aiohttp: pip install 'tpuslice[dashboard]'"


# --- the picture (pure) ------------------------------------------------------------------


def _host_cell(info: SliceInfo, worker: int) -> dict[str, Any]:
    """One host as the page draws it: its label (READY, BUSY, SUSPECT, PREEMPTING,
    MAINTENANCE or BROKEN), why, and its node's short id."""
    host = info.hosts.get(worker)
    if host is None:
        return {"worker_id": worker, "label": "BROKEN", "reason": "missing", "node": ""}
    if not host.alive or host.state is HostState.DEAD:
        label, reason = "BROKEN", "dead"
    elif host.notice is not None:
        label, reason = host.notice.state, host.notice.event
    elif host.suspect is not None:
        label, reason = "SUSPECT", f"{host.suspect.reason.value}: {host.suspect.evidence}"
    elif host.state is HostState.BUSY:
        label, reason = "BUSY", host.tpu_owner or "TPU in use"
    else:
        label, reason = "READY", ""
    return {"worker_id": worker, "label": label, "reason": reason, "node": host.node_id[:12]}


def _subslices_in_use(info: SliceInfo, physical: Mapping[int, int] | None) -> list[dict[str, Any]]:
    """The sub-slices whose hosts are all busy, on a slice not held whole."""
    if physical is None:
        return []
    found = status.subslice_dict(info, physical)["topologies"]
    used = []
    for topology, entry in found.items():
        for index, workers in entry["members"].items():
            if int(index) not in entry["free"] and all(
                info.hosts.get(w) is not None and info.hosts[w].state is HostState.BUSY
                for w in workers
            ):
                used.append({"topology": topology, "index": int(index), "workers": workers})
    return used


def _slice_entry(
    info: SliceInfo, physical: Mapping[int, int] | None, holder: Holder | None, now: float
) -> dict[str, Any]:
    rows = status.grid_rows(info, physical)
    return {
        "name": info.name,
        "label": status.state_label(info).upper(),
        "reason": info.reason,
        "shape": status.shape_label(info),
        "hosts_text": f"{info.alive_hosts}/{info.expected_hosts}",
        "tpu_text": f"{info.chips_free:g}/{info.chips_total:g}",
        "grid": [[_host_cell(info, w) for w in row] for row in rows],
        "holder": None
        if holder is None
        else {
            **{k: getattr(holder, k) for k in ("tenant", "who", "job", "priority", "preemptible")},
            "held_s": max(0.0, now - holder.since),
        },
        "subslices": [] if holder is not None else _subslices_in_use(info, physical),
    }


def state_dict(
    snapshot: ClusterSnapshot,
    physical: Mapping[str, Mapping[int, int]],
    holders: Mapping[str, Holder],
    usage: Mapping[str, float],
    accounts: Sequence[Account],
    history: Sequence[SliceEvent],
) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (``docs/dashboard.md`` lists it).

    Args:
        snapshot: The cluster as read.
        physical: Each slice's physical layout, where known.
        holders: Slice -> its holder record.
        usage: Tenant -> decayed slice-seconds.
        accounts: Goodput accounts, oldest first.
        history: Timeline events, oldest first.

    Returns:
        ``connected`` (true), ``read_at``, ``slices``, ``counts``, ``queue``, ``teams``,
        ``runs`` (newest first), ``events``, ``tenants`` and ``slice_names``.
    """
    now, quotas = snapshot.taken_at, snapshot.quotas
    infos = sorted(snapshot.slices.values(), key=lambda s: s.name)
    slices = [_slice_entry(s, physical.get(s.name), holders.get(s.name), now) for s in infos]
    queue = [
        {
            "position": r.position,
            "tenant": r.tenant,
            "wants": f"{r.wanted} x {r.kind}",
            "priority": r.priority,
            "waited_s": max(0.0, now - r.since),
            "who": r.who,
            "reason": status.request_reason(r),
            "preemptible": r.preemptible,
        }
        for r in snapshot.queued()
    ]
    held = Counter(h.tenant for h in holders.values())
    by_kind: Counter[tuple[str, str]] = Counter()
    for name, holder in holders.items():
        if (info := snapshot.slices.get(name)) is not None:
            by_kind[holder.tenant, f"{info.pod_type} {info.topology}"] += 1
    borrowed: Counter[str] = Counter()
    for (tenant, kind), count in by_kind.items():  # beyond its quota of that kind (none: 0)
        quota = quotas.tenants.get(tenant)
        borrowed[tenant] += max(0, count - (quota.nominal(kind) if quota else 0))
    preemptions = Counter(e.tenant for e in history if e.kind == "preempted")
    teams = [
        {
            **row,
            "borrowed": borrowed.get(row["tenant"], 0),
            "preemptions": preemptions.get(row["tenant"], 0),
        }
        for row in team_rows(quotas, held, usage)
    ]
    tenants = {t["tenant"] for t in teams} | {r["tenant"] for r in queue}
    tenants |= {e.tenant for e in history}
    return {
        "connected": True,
        "error": None,
        "read_at": now,
        "slices": slices,
        "counts": dict(Counter(s["label"] for s in slices)),
        "queue": queue,
        "teams": {
            "configured": quotas.configured,
            "half_life_s": quotas.half_life_s,
            "tenants": teams,
        },
        "runs": [a.to_dict() for a in reversed(accounts)][:RUNS_SHOWN],
        "events": [{**e.to_dict(), "text": e.describe()} for e in list(history)[-EVENTS_SHOWN:]],
        "tenants": sorted(t for t in tenants if t),
        "slice_names": [s.name for s in infos],
    }


def read_state() -> dict[str, Any]:
    """Read the connected cluster into :func:`state_dict`'s form (blocks on the GCS)."""
    snapshot = cluster.read_snapshot()
    return state_dict(
        snapshot,
        layouts.load_all(snapshot),
        read_holders(),
        read_usage(snapshot.quotas).all(time.time()),
        goodput.read_accounts(RUNS_SHOWN),
        events.read_events(EVENTS_SHOWN),
    )


def in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``fn`` in a daemon thread, not the loop's executor: a read that never returns
    would hold up the exit (Ctrl-C) there.

    Args:
        fn: What to run.

    Returns:
        A future of the running loop with its result or its error.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(), None)
        except Exception as exc:  # noqa: BLE001 - handed to the future
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="tpuslice-dashboard-read", daemon=True).start()
    return future


class Picture:
    """The one cache every open page reads: the last state, encoded, read again once it
    is ``every_s`` old and someone asks. A read that fails, or takes longer than
    ``bound_s``, is served as disconnected; the next due ask retries (or, for a late read,
    waits for it again).

    Args:
        read: Reads the state (blocking; run in a thread of its own).
        every_s: How long a picture stays fresh.
        bound_s: How long an ask waits for a read.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        read: Callable[[], dict[str, Any]],
        *,
        every_s: float = READ_EVERY_S,
        bound_s: float = READ_BOUND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.every_s = every_s
        self.bound_s = bound_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._taken = -math.inf
        self._pending: asyncio.Future[dict[str, Any]] | None = None
        self.data = b""

    def due_in(self) -> float:
        """How long the picture stays fresh.

        Returns:
            Seconds until it is due to be read again (0: now).
        """
        return max(0.0, self._taken + self.every_s - self._clock())

    async def current(self) -> bytes:
        """The picture, read again first if it is due (one read for every asker).

        Returns:
            The state as encoded JSON; a failed or late read gives a disconnected one.
        """
        async with self._lock:
            if self.due_in() <= 0:
                self._taken = self._clock()  # from the read's start: a change shows in a period
                self.data = json.dumps(await self._read_bounded()).encode()
        return self.data

    async def _read_bounded(self) -> dict[str, Any]:
        if self._pending is None:  # a read that outlived its bound is waited for again
            self._pending = in_daemon_thread(self._read)
        pending = self._pending
        # Waited for apart from its result: the read's own errors may be TimeoutErrors too.
        await asyncio.wait([pending], timeout=self.bound_s)
        if not pending.done():
            return _disconnected(f"the cluster did not answer in {self.bound_s:g} s")
        self._pending = None
        error = pending.exception()
        if error is not None:  # any failed read is a lost connection here
            return _disconnected(first_line(error) or type(error).__name__)
        return pending.result()


def _disconnected(error: str) -> dict[str, Any]:
    return {"connected": False, "error": error, "read_at": time.time()}


# --- the server --------------------------------------------------------------------------


def _bad_request(message: str) -> web.Response:
    from aiohttp import web

    return web.json_response({"error": message}, status=400)


def check_filters(query: Mapping[str, str]) -> str | None:
    """What is wrong with a page's query parameters, or ``None``.

    Args:
        query: The parameters given.

    Returns:
        A message naming the parameter, or ``None`` if they are usable.
    """
    for name, value in query.items():
        if name not in FILTERS:
            return f"unknown parameter {name!r}: the page takes {', '.join(FILTERS)}"
        if len(value) > MAX_FILTER_CHARS or not value.isprintable():
            return f"parameter {name!r} must be printable text of at most {MAX_FILTER_CHARS} chars"
    return None


def make_app(picture: Picture) -> web.Application:
    """The dashboard's routes, serving ``picture``.

    Args:
        picture: The cache the pages read.

    Returns:
        The aiohttp application (GET only).
    """
    from aiohttp import web

    stopping = asyncio.Event()

    async def index(request: web.Request) -> web.StreamResponse:
        problem = check_filters(request.query)
        if problem is not None:
            return web.Response(text=problem + "\n", status=400)
        return web.FileResponse(WEB / "index.html")

    async def state(request: web.Request) -> web.StreamResponse:
        if request.query:
            return _bad_request("/api/state takes no parameters")
        return web.Response(body=await picture.current(), content_type="application/json")

    async def stream(request: web.Request) -> web.StreamResponse:
        if request.query:
            return _bad_request("/api/stream takes no parameters")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        sent = b""
        with contextlib.suppress(ConnectionResetError):  # the page closed: nothing to send
            while not stopping.is_set():
                data = await picture.current()
                if data != sent:
                    await response.write(b"data: " + data + b"\n\n")
                    sent = data
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), picture.due_in() or picture.every_s)
        return response

    async def stop_streams(app: web.Application) -> None:
        stopping.set()  # the server is shutting down: open pages reconnect to the next one

    async def run(request: web.Request) -> web.StreamResponse:
        run_id = request.match_info["run_id"]
        if not RUN_ID.match(run_id):
            return _bad_request(f"run id {run_id[:80]!r} is not one: letters, digits, . _ -")
        for shown in json.loads(picture.data or b"{}").get("runs", []):
            if shown["run_id"] == run_id:
                return web.json_response({"run": shown})
        read = in_daemon_thread(goodput.read_accounts)  # an older run than the picture's
        await asyncio.wait([read], timeout=picture.bound_s)
        error = read.exception() if read.done() else TimeoutError("no answer")
        if error is not None:
            message = f"could not read the run's account: {first_line(error)}"
            return web.json_response({"error": message}, status=503)
        for account in reversed(read.result()):
            if account.run_id == run_id:
                return web.json_response({"run": account.to_dict()})
        return web.json_response({"error": f"no run {run_id!r} has an account"}, status=404)

    async def run_page(request: web.Request) -> web.StreamResponse:
        if not RUN_ID.match(request.match_info["run_id"]):
            return web.Response(text="not a run id: letters, digits, . _ -\n", status=400)
        return web.FileResponse(WEB / "run.html")

    app = web.Application()
    app.on_shutdown.append(stop_streams)
    app.router.add_get("/", index)
    app.router.add_get("/runs/{run_id}", run_page)
    app.router.add_get("/api/state", state)
    app.router.add_get("/api/stream", stream)
    app.router.add_get("/api/runs/{run_id}", run)
    app.router.add_static("/static/", WEB)
    return app


async def serve(app: web.Application, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Serve ``app`` until cancelled, calling ``ready`` with its URL once it listens.

    Args:
        app: The application.
        host: Address to listen on.
        port: Port (0: any free one).
        ready: Told the URL.
    """
    from aiohttp import web

    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        ready(f"http://{shown}:{bound_port}/")
        await asyncio.Event().wait()  # until Ctrl-C cancels it
    finally:
        await runner.cleanup()


@click.command(name="dashboard")
@address_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (the default is reachable from this machine only).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True)
def dashboard_command(address: str | None, host: str, port: int) -> None:
    """Serve a live, read-only web page of the cluster: slices, the queue, teams, runs
    and the timeline. Ctrl-C stops it."""
    try:
        import aiohttp  # noqa: F401 - only checked here, used by make_app
    except ImportError as exc:
        raise click.ClickException(EXTRA_HINT) from exc
    with connected(address):
        app = make_app(Picture(read_state))
        try:
            asyncio.run(
                serve(app, host, port, lambda url: click.echo(f"{PROMPT} {url}  (Ctrl-C stops it)"))
            )
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        except KeyboardInterrupt:
            pass  # Ctrl-C is how it ends
