"""``tpuslice release-tpu``: stop a process that owns a host's TPU, on request only.

tpuslice never stops a process it did not start; this command does, after a confirmation,
and only a process of the same user.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape

from tpuslice._reserve.queue.agents import kill_owner, probe_owners
from tpuslice._view import cluster
from tpuslice.cli.connect import UsageError, address_option, connected

__all__ = ["release_tpu"]

console = Console()


def _find_host(snapshot: cluster.ClusterSnapshot, host: str) -> cluster.HostInfo:
    """The live host named ``SLICE/WORKER``; a UsageError listing some if there is none."""
    name, _, worker = host.rpartition("/")
    info = snapshot.slices.get(name)
    found = info.hosts.get(int(worker)) if info and worker.isdecimal() else None
    if found is None or not found.alive:
        known = [
            f"{s.name}/{w}" for s in snapshot.slices.values() for w, h in s.hosts.items() if h.alive
        ]
        listed = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
        raise UsageError(
            f"no live TPU host {host!r}; give SLICE/WORKER, such as {listed or 'v6e-16-a/0'}"
        )
    return found


@click.command(name="release-tpu")
@click.option("--host", "host", required=True, metavar="SLICE/WORKER", help="The TPU host.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@address_option
def release_tpu(host: str, yes: bool, address: str | None) -> None:
    """Stop the process that owns HOST's TPU (your own processes only; asks first)."""
    with connected(address):
        target = _find_host(cluster.read_snapshot(), host)
        found = probe_owners([target.node_id])[target.node_id]
        if isinstance(found, Exception):
            raise click.ClickException(f"the TPU agent of {host} did not answer: {found}")
        if found is None:
            console.print(f"The TPU of {escape(host)} is free; nothing to stop.")
            return
        console.print(f"The TPU of {escape(host)} is owned by {escape(found.describe())}.")
        if not yes and not click.confirm(f"Stop pid {found.pid}?", err=True):
            raise click.ClickException("nothing stopped")
        try:
            left = kill_owner(target.node_id, found.pid)
        except PermissionError as exc:
            raise click.ClickException(str(exc)) from exc
        if left is not None and left.pid == found.pid:
            raise click.ClickException(f"pid {found.pid} still owns the TPU of {host}")
        console.print(
            f"[green]stopped[/green] pid {found.pid}; the TPU of {escape(host)} "
            + ("is free." if left is None else f"is now owned by {left.describe()}.")
        )
