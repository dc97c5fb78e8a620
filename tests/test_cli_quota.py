"""``tpuslice quota``: showing, setting and removing tenants' quotas, through click's
CliRunner with the connection replaced and Ray's KV store kept in a dict. No cluster."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tpuslice._tpu import _ray
from tpuslice._tpu.keys import HOLDER_KEY_PREFIX, NAMESPACE, QUOTAS_KEY, USAGE_KEY
from tpuslice._view.holders import Holder
from tpuslice._view.quotas import Quotas, TenantQuota
from tpuslice.cli import quota as cli_quota
from tpuslice.cli.commands import main
from tpuslice.record import events


class Store:
    """Ray's KV store, in a dict; and the timeline's events, in a list."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kv: dict[str, bytes] = {}
        self.events: list[dict[str, Any]] = []
        monkeypatch.setattr(_ray, "kv_put", self.put)
        monkeypatch.setattr(_ray, "kv_get", lambda key, ns: self.kv.get(f"{ns}/{key}"))
        monkeypatch.setattr(_ray, "kv_list", self.list)
        monkeypatch.setattr(_ray, "kv_get_many", self.get_many)
        monkeypatch.setattr(cli_quota, "connected", self.connected)
        monkeypatch.setattr(
            events, "record", lambda kind, **f: self.events.append({"kind": kind, **f})
        )
        monkeypatch.setattr(events, "flush", lambda timeout_s=2.0: True)

    def put(self, key: str, value: bytes, ns: str | None) -> bool:
        existed = f"{ns}/{key}" in self.kv
        self.kv[f"{ns}/{key}"] = value
        return existed

    def list(self, prefix: str, ns: str | None) -> list[str]:
        return [k.split("/", 1)[1] for k in self.kv if k.startswith(f"{ns}/{prefix}")]

    def get_many(self, keys: list[str], ns: str | None) -> dict[str, bytes]:
        return {k: self.kv[f"{ns}/{k}"] for k in keys if f"{ns}/{k}" in self.kv}

    @contextlib.contextmanager
    def connected(self, address: str | None) -> Iterator[None]:
        yield

    def quotas(self) -> Quotas:
        return Quotas.from_json(self.kv[f"{NAMESPACE}/{QUOTAS_KEY}"])


def run(*args: str) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(main, ["quota", *args])


def test_with_no_quota_set_it_says_the_queue_serves_by_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Store(monkeypatch)
    got = run()
    assert got.exit_code == 0, got.output
    assert "No quotas set" in got.output and "tpuslice quota set TENANT" in got.output


def test_set_stores_the_quota_keeps_what_is_not_given_and_records_who(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    got = run("set", "team-a", "--slices", "v6e-16=2", "--borrow-limit", "1", "--weight", "2")
    assert got.exit_code == 0, got.output
    assert store.quotas().tenants["team-a"] == TenantQuota({"v6e-16": 2}, 1, 2.0, 30.0)
    got = run("set", "team-a", "--slices", "v4-16/2x2x2=1", "--grace", "10")
    assert got.exit_code == 0, got.output
    assert store.quotas().tenants["team-a"] == TenantQuota(
        {"v6e-16": 2, "v4-16 2x2x2": 1}, 1, 2.0, 10.0
    )
    run("set", "team-a", "--borrow-limit", "none")
    assert store.quotas().tenants["team-a"].borrow_limit is None
    kinds = [(e["kind"], e["detail"]) for e in store.events]
    assert kinds[0][0] == "quota"
    assert kinds[0][1].startswith("set team-a: v6e-16=2, borrow limit 1, weight 2, grace 30 s (by ")
    assert "@" in store.events[0]["what"]  # user@host


def test_show_lists_each_tenant_with_what_it_holds_and_its_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    store.put(QUOTAS_KEY, Quotas({"team-a": TenantQuota({"v6e-16": 2})}).to_json(), NAMESPACE)
    holder = Holder("h1", "v6e-16-0", "team-b", 0, True, 0.0, "pid 1 on x")
    store.put(HOLDER_KEY_PREFIX + "v6e-16-0", holder.to_json(), NAMESPACE)
    usage = {"at": 1e12, "usage": {"team-b": 3600.0}}  # stored far in the future: undecayed
    store.put(USAGE_KEY, json.dumps(usage).encode(), NAMESPACE)
    got = run("--json")
    assert got.exit_code == 0, got.output
    data = json.loads(got.output)["tenants"]
    assert data["team-a"]["quota"]["slices"] == {"v6e-16": 2} and data["team-a"]["held"] == 0
    assert data["team-b"] == {"quota": None, "held": 1, "usage": pytest.approx(3600.0)}
    table = run().output
    assert "team-a" in table and "v6e-16=2" in table and "team-b" in table


def test_rm_removes_a_quota_and_refuses_a_tenant_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    run("set", "team-a", "--slices", "v6e-16=2")
    run("set", "team-b", "--slices", "v6e-16=1")
    assert run("rm", "team-a").exit_code == 0
    assert set(store.quotas().tenants) == {"team-b"}
    missing = run("rm", "team-z")
    assert missing.exit_code == 2 and "tenants with one: team-b" in missing.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["set", "team a"], "give 1-63 letters"),
        (["set", "t", "--slices", "v6e-16"], "give POD_TYPE=N or POD_TYPE/TOPOLOGY=N"),
        (["set", "t", "--slices", "v6e-15=1"], "--slices 'v6e-15=1'"),
        (["set", "t", "--slices", "v6e-16/2x4=1"], "not v6e-16"),
        (["set", "t", "--borrow-limit", "lots"], "give a whole number of slices"),
        (["set", "t", "--weight", "0"], "weight 0.0: give a number above 0"),
    ],
)
def test_bad_input_is_refused_saying_what_to_give(
    monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    store = Store(monkeypatch)
    got = run(*args)
    assert got.exit_code == 2, got.output
    assert says in got.output
    assert f"{NAMESPACE}/{QUOTAS_KEY}" not in store.kv


def test_half_life_sets_how_fast_use_is_forgotten_and_keeps_the_quotas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    run("set", "team-a", "--slices", "v6e-16=2")
    got = run("half-life", "7200")
    assert got.exit_code == 0, got.output
    assert store.quotas().half_life_s == 7200.0 and "team-a" in store.quotas().tenants
    assert store.events[-1]["detail"].startswith("half-life of use 7200 s (was 3600 s)")
    bad = run("half-life", "0")
    assert bad.exit_code == 2 and "give seconds above 0" in bad.output
