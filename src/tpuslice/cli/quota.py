"""``tpuslice quota``: the cluster's quotas for tenants, read and set.

``quota`` shows them with what each tenant holds and its decayed use; ``quota set`` and
``quota rm`` change one, and the timeline records who changed it, from which host.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import socket
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tpuslice._reserve.queue.orders import read_usage
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, QUOTAS_KEY
from tpuslice._tpu.topology import parse_pod_type, slice_shape
from tpuslice._view.holders import read_holders
from tpuslice._view.quotas import (
    DEFAULT_GRACE_S,
    DEFAULT_WEIGHT,
    Quotas,
    TenantQuota,
    check_tenant,
    read_quotas,
)
from tpuslice.cli.connect import UsageError, address_option, connected
from tpuslice.errors import AmbiguousPodTypeError, InvalidArgumentError
from tpuslice.record import events

__all__ = ["quota_group", "team_rows"]

console = Console()


def _parse_slices(specs: tuple[str, ...]) -> dict[str, int]:
    """``--slices`` values (``v6e-16=2``, ``v6e-16/4x4=1``) as quota key -> slices."""
    found: dict[str, int] = {}
    for spec in specs:
        key, sep, count = spec.partition("=")
        pod_type, _, topology = key.strip().partition("/")
        if not sep or not count.strip().isdecimal():
            raise UsageError(
                f"--slices {spec!r}: give POD_TYPE=N or POD_TYPE/TOPOLOGY=N, such as v6e-16=2"
            )
        try:
            if topology:
                generation = pod_type.split("-")[0]
                shape = slice_shape(topology, generation)
                if shape.pod_type != pod_type:
                    raise InvalidArgumentError(
                        f"topology {topology} of {generation} is pod type {shape.pod_type}, "
                        f"not {pod_type}"
                    )
            else:
                with contextlib.suppress(AmbiguousPodTypeError):  # any of its topologies
                    parse_pod_type(pod_type)
        except InvalidArgumentError as exc:
            raise UsageError(f"--slices {spec!r}: {exc}") from exc
        found[f"{pod_type} {topology}" if topology else pod_type] = int(count)
    return found


def _borrow_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> object:
    if value is None or value == "none":
        return value
    if not value.isdecimal():
        raise click.BadParameter("give a whole number of slices, or 'none' for no limit")
    return int(value)


@click.group(name="quota", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@address_option
@click.pass_context
def quota_group(ctx: click.Context, as_json: bool, address: str | None) -> None:
    """Show the cluster's quotas: each tenant's slices, borrow limit, weight and grace,
    what it holds now, and its use (decayed slice-seconds) that fair share orders by."""
    if ctx.invoked_subcommand is not None:
        return
    with connected(address):
        quotas = read_quotas()
        holders = read_holders()
        usage = read_usage(quotas).all(time.time())
    rows = team_rows(quotas, Counter(holder.tenant for holder in holders.values()), usage)
    if as_json:
        data = {
            "half_life_s": quotas.half_life_s,
            "tenants": {
                row["tenant"]: {"quota": row["quota"], "held": row["held"], "usage": row["usage"]}
                for row in rows
            },
        }
        click.echo(json.dumps(data, indent=2))
        return
    if not quotas.configured:
        console.print(
            "No quotas set: the queue serves requests by priority, then arrival. "
            "Set one with: tpuslice quota set TENANT --slices v6e-16=2"
        )
    table = Table(title=f"quotas (use halves every {quotas.half_life_s:.0f} s)")
    for column in ("tenant", "quota", "borrow limit", "weight", "grace", "holds", "use (slice-s)"):
        table.add_column(column, justify="left" if column in ("tenant", "quota") else "right")
    for row in rows:
        table.add_row(
            row["tenant"],
            row["slices"],
            row["borrow"],
            f"{row['weight']:g}",
            f"{row['grace_s']:.0f} s",
            str(row["held"]),
            f"{row['usage']:.0f}",
        )
    console.print(table)


def team_rows(
    quotas: Quotas, held: Mapping[str, int], usage: Mapping[str, float]
) -> list[dict[str, Any]]:
    """One row per tenant with a quota or holding slices, in name order: its quota (as
    stored and as text), borrow limit, weight, grace, the slices it holds and its use.

    Args:
        quotas: The cluster's quotas.
        held: Tenant -> slices it holds now.
        usage: Tenant -> decayed slice-seconds.

    Returns:
        The rows, JSON-ready.
    """
    rows = []
    for tenant in sorted(set(quotas.tenants) | set(held)):
        quota = quotas.tenants.get(tenant)
        slices = ", ".join(f"{k}={v}" for k, v in quota.slices.items()) if quota else ""
        limit = None if quota is None else quota.borrow_limit
        rows.append(
            {
                "tenant": tenant,
                "quota": quota.to_dict() if quota else None,
                "slices": slices or "none",
                "borrow": "-" if limit is None else str(limit),
                "weight": quota.weight if quota else DEFAULT_WEIGHT,
                "grace_s": quota.grace_s if quota else DEFAULT_GRACE_S,
                "held": held.get(tenant, 0),
                "usage": usage.get(tenant, 0.0),
            }
        )
    return rows


@quota_group.command(name="set")
@click.argument("tenant")
@click.option(
    "--slices",
    "slices",
    multiple=True,
    metavar="POD_TYPE[/TOPOLOGY]=N",
    help="Nominal quota of a kind of slice (repeat for more kinds), such as v6e-16=2.",
)
@click.option(
    "--borrow-limit",
    default=None,
    callback=_borrow_limit,
    help="Slices of a kind it may run beyond its quota, on idle ones; 'none': no limit "
    "[default: no limit].",
)
@click.option("--weight", type=float, default=None, help="Fair-share weight [default: 1].")
@click.option(
    "--grace",
    "grace_s",
    type=float,
    default=None,
    help="Seconds its preempted work has to leave [default: 30].",
)
@address_option
def set_quota(
    tenant: str,
    slices: tuple[str, ...],
    borrow_limit: object,
    weight: float | None,
    grace_s: float | None,
    address: str | None,
) -> None:
    """Set TENANT's quota. Options not given keep their current value (a new tenant's:
    no slices, no borrow limit, weight 1, grace 30 s)."""
    try:
        check_tenant(tenant)
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from exc
    counts = _parse_slices(slices)
    with connected(address):
        quotas = read_quotas()
        old = quotas.of(tenant) or TenantQuota()
        limit = old.borrow_limit if borrow_limit is None else borrow_limit
        try:
            new = TenantQuota(
                slices={**old.slices, **counts},
                borrow_limit=None if limit == "none" else limit,  # type: ignore[arg-type]
                weight=old.weight if weight is None else weight,
                grace_s=old.grace_s if grace_s is None else grace_s,
            )
        except InvalidArgumentError as exc:
            raise UsageError(str(exc)) from exc
        _store(quotas.with_tenant(tenant, new), f"set {tenant}: {_describe(new)}")
    console.print(f"quota of {tenant}: {_describe(new)}")


@quota_group.command(name="rm")
@click.argument("tenant")
@address_option
def remove_quota(tenant: str, address: str | None) -> None:
    """Remove TENANT's quota (it then shares what is left over, at the lowest standing)."""
    with connected(address):
        quotas = read_quotas()
        if quotas.of(tenant) is None:
            known = ", ".join(sorted(quotas.tenants)) or "none"
            raise UsageError(f"tenant {tenant!r} has no quota (tenants with one: {known})")
        _store(quotas.with_tenant(tenant, None), f"removed {tenant}")
    console.print(f"quota of {tenant} removed")


@quota_group.command(name="half-life")
@click.argument("seconds", type=float)
@address_option
def set_half_life(seconds: float, address: str | None) -> None:
    """Set how fast fair share forgets past use: use SECONDS old counts half [default:
    3600]. Longer follows the weights over longer spans; shorter forgives sooner."""
    with connected(address):
        quotas = read_quotas()
        try:
            changed = Quotas(quotas.tenants, seconds)
        except InvalidArgumentError as exc:
            raise UsageError(str(exc)) from exc
        _store(changed, f"half-life of use {seconds:g} s (was {quotas.half_life_s:g} s)")
    console.print(f"use now halves every {seconds:g} s")


def _describe(quota: TenantQuota) -> str:
    """``v6e-16=2, borrow limit 1, weight 2, grace 30 s``."""
    slices = ", ".join(f"{k}={v}" for k, v in quota.slices.items()) or "no slices"
    limit = (
        "no borrow limit" if quota.borrow_limit is None else f"borrow limit {quota.borrow_limit}"
    )
    return f"{slices}, {limit}, weight {quota.weight:g}, grace {quota.grace_s:g} s"


def _store(quotas: Quotas, change: str) -> None:
    """Write the quotas and record the change in the timeline: what, who, from where."""
    _ray.kv_put(QUOTAS_KEY, quotas.to_json(), NAMESPACE)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    events.record("quota", what=who, outcome="set", detail=f"{change} (by {who})")
    events.flush()
