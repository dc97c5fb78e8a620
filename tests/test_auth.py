"""Token authentication (Ray's ``RAY_AUTH_MODE=token``): which token a driver presents, the
message of a refusal, the simulator's token, and every tpuslice entry point on a simulated
cluster that requires a token, with the token and without it.

The cluster tests start a cluster of their own, one host, with ``tpuslice simulate
--auth`` in a child process, so they also show that command as a user runs it: what it
prints, and that Ctrl-C stops it leaving nothing behind. Drivers and the CLI are child
processes too, with the environment each case needs."""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpuslice._tpu import _auth, _ray
from tpuslice.errors import TokenAuthError, TPUSliceError

# --- which token a driver presents (pure) ---------------------------------------------------


def test_ray_auth_token_wins_over_the_path_and_the_default_file(tmp_path: Path) -> None:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t1")
    env = {"RAY_AUTH_MODE": "Token", "RAY_AUTH_TOKEN": "t0", "RAY_AUTH_TOKEN_PATH": "/nowhere"}
    assert _auth.token_setting(env, tmp_path) == _auth.TokenSetting("token", "RAY_AUTH_TOKEN")
    del env["RAY_AUTH_TOKEN"]
    setting = _auth.token_setting(env, tmp_path)
    assert setting.source == "RAY_AUTH_TOKEN_PATH=/nowhere"
    assert "/nowhere cannot be read" in setting.problem
    assert setting.unusable
    del env["RAY_AUTH_TOKEN_PATH"]
    found = _auth.token_setting(env, tmp_path)
    assert found == _auth.TokenSetting("token", str(tmp_path / ".ray" / "auth_token"))
    assert not found.unusable


def test_an_empty_token_file_or_none_at_all_is_unusable_only_in_token_mode(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    setting = _auth.token_setting({"RAY_AUTH_TOKEN_PATH": str(empty)}, tmp_path)
    assert setting.problem == f"{empty} is empty"
    assert not setting.unusable  # Ray reads no token outside token mode
    none = _auth.token_setting({"RAY_AUTH_MODE": "token"}, tmp_path)
    assert none.source == ""
    assert "no token was found in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH" in none.problem
    assert none.unusable


@pytest.mark.parametrize(
    ("setting", "found"),
    [
        (_auth.TokenSetting("", ""), "this process sends none (RAY_AUTH_MODE is unset"),
        (_auth.TokenSetting("disabled", ""), "(RAY_AUTH_MODE is 'disabled', not 'token')"),
        (
            _auth.TokenSetting("token", "RAY_AUTH_TOKEN_PATH=/t", "/t is empty"),
            "RAY_AUTH_MODE=token, but /t is empty",
        ),
        (_auth.TokenSetting("token", "RAY_AUTH_TOKEN"), "it refused the token from RAY_AUTH_TOKEN"),
    ],
)
def test_a_refusal_says_what_was_asked_found_and_what_to_set(
    setting: _auth.TokenSetting, found: str
) -> None:
    message = _auth.refused_message("10.0.0.2:6379", setting, "bad token")
    assert message.startswith("connecting to the Ray cluster at 10.0.0.2:6379: ")
    assert found in message
    assert "(Ray: bad token)" in message
    assert message.endswith(
        "set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN (the token "
        "itself) or RAY_AUTH_TOKEN_PATH (a file holding it), then connect again"
    )


def test_the_error_is_a_connection_error_of_tpuslice_and_pickles() -> None:
    error = TokenAuthError("refused", "10.0.0.2:6379")
    assert isinstance(error, TPUSliceError)
    assert isinstance(error, ConnectionError)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.address) == ("refused", "10.0.0.2:6379")


# --- the check before ray.init (Ray's side replaced) ---------------------------------------


@pytest.fixture
def ray_side(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Ray's settings are not reloaded in this process; the GCS is asked nothing unless a
    test says what it answers. Returns the addresses asked."""
    asked: list[str] = []
    monkeypatch.setattr(_ray, "reload_auth_settings", lambda: None)
    monkeypatch.setattr(_ray, "enable_token_auth_if_token_found", lambda: None)

    def not_asked(address: str) -> str | None:
        asked.append(address)
        raise AssertionError("the cluster was asked")

    monkeypatch.setattr(_ray, "gcs_token_refusal", not_asked)
    for name in _auth.AUTH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    return asked


def test_an_unreadable_token_fails_without_asking_the_cluster(
    ray_side: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/nonexistent/token")
    with pytest.raises(TokenAuthError, match="/nonexistent/token cannot be read") as caught:
        _auth.check_token("127.0.0.1:6379")
    assert caught.value.address == "127.0.0.1:6379"
    assert ray_side == []


def test_a_refused_token_fails_with_rays_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ray, "reload_auth_settings", lambda: None)
    monkeypatch.setattr(_ray, "gcs_token_refusal", lambda address: "InvalidAuthToken")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    with pytest.raises(TokenAuthError) as caught:
        _auth.check_token("127.0.0.1:6379")
    assert "refused the token from RAY_AUTH_TOKEN (Ray: InvalidAuthToken)" in str(caught.value)


def test_a_cluster_that_does_not_answer_holds_the_check_no_longer_than_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released = threading.Event()
    monkeypatch.setattr(_ray, "reload_auth_settings", lambda: None)
    monkeypatch.setattr(_ray, "gcs_token_refusal", lambda address: released.wait(30) and None)
    started = time.monotonic()
    try:
        _auth.check_token("127.0.0.1:6379", timeout_s=0.2)  # left to ray.init
    finally:
        released.set()
    assert time.monotonic() - started < 5


def test_a_ray_client_address_is_left_to_its_server(ray_side: list[str]) -> None:
    _auth.check_token("ray://127.0.0.1:10001")
    assert ray_side == []


def test_the_cli_shows_a_refusal_as_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuslice.cli import connect as cli_connect

    def refuse(address: str, *, found_on_its_own: bool = False) -> None:
        raise TokenAuthError(f"refused at {address}; set RAY_AUTH_TOKEN", address)

    monkeypatch.setattr(cli_connect, "probe", lambda *args, **kwargs: None)
    monkeypatch.setattr(_auth, "check_token", refuse)
    with pytest.raises(cli_connect.TokenRefusedError) as caught:
        cli_connect.connect("127.0.0.1:6379")
    assert caught.value.exit_code == 1
    assert caught.value.message == "refused at 127.0.0.1:6379; set RAY_AUTH_TOKEN"


# --- the simulator's token (pure) ----------------------------------------------------------


def test_a_token_file_is_fresh_random_and_only_its_owner_may_read_it(tmp_path: Path) -> None:
    first = _auth.write_token(tmp_path / "a")
    second = _auth.write_token(tmp_path / "b")
    assert len(first) == 64 and int(first, 16) >= 0
    assert first != second
    assert (tmp_path / "a").read_text() == first
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        _auth.write_token(tmp_path / "a")


def test_presenting_a_token_file_sets_the_mode_and_path_and_is_put_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reloads: list[dict[str, str | None]] = []
    monkeypatch.setattr(
        _ray,
        "reload_auth_settings",
        lambda: reloads.append({name: os.environ.get(name) for name in _auth.AUTH_ENV}),
    )
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the user's own")
    saved = _auth.present_token_file(tmp_path / "token")
    presented = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": None}
    assert reloads[-1] == {**presented, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")}
    _auth.restore_auth_env(saved)
    assert reloads[-1] == {
        "RAY_AUTH_MODE": None,
        "RAY_AUTH_TOKEN": "the user's own",
        "RAY_AUTH_TOKEN_PATH": None,
    }


def test_a_cluster_not_started_hands_drivers_no_token() -> None:
    from tpuslice.testing import SimulatedCluster

    sim = SimulatedCluster([("v4", "2x2x1", 1)], auth=True)  # not started: no token yet
    assert (sim.token, sim.token_path, sim.auth_env) == (None, None, {})


# --- on a simulated cluster that requires a token ------------------------------------------

DRIVER = textwrap.dedent(
    """
    import json, logging, sys, time
    import ray
    import tpuslice
    from tpuslice.testing import live_placement_groups

    @ray.remote
    def where():
        host = tpuslice.current_host()
        return host.rank, host.slice_name

    started = time.monotonic()
    try:
        tpuslice.connect(sys.argv[1], log_to_driver=False, logging_level=logging.WARNING)
    except tpuslice.TokenAuthError as exc:
        print(json.dumps({"error": str(exc), "seconds": time.monotonic() - started}))
        sys.exit()
    with tpuslice.SlicePlacementGroup("2x2x1", "v4") as spg:
        reserved = ray.get(tpuslice.run_on_slice(where, tpu_slice=spg), timeout=120)
    refs = tpuslice.run_on_slice(where, topology="2x2x1", accelerator_version="v4")
    one_shot = ray.get(refs, timeout=120)
    deadline = time.monotonic() + 30  # a one-shot hands its slice back in the background
    while live_placement_groups() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"reserved": reserved, "one_shot": one_shot,
                      "groups_left": len(live_placement_groups())}))
    """
)


@dataclass
class AuthCluster:
    """``tpuslice simulate --auth`` running in a child process, and what it printed."""

    process: subprocess.Popen[str]
    address: str
    env: dict[str, str]
    """What its ``token:`` line says a driver must export."""
    pids: set[int]
    """Every process of the cluster once it was up (the CLI's own included)."""


def driver_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without Ray's address or any token setting."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "RAY_ADDRESS" and k not in _auth.AUTH_ENV and not k.startswith("TPU")
    }
    return {**env, "COLUMNS": "80", **(extra or {})}


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthCluster]:
    """A one-host simulated cluster with token auth, started as a user would, with
    ``tpuslice simulate --auth`` (a child process: token mode would stay on in this
    process's Ray, and these tests run before the session's cluster starts). On the way
    out, Ctrl-C stops it, and no process it had and no token file is left."""
    from tpuslice._sim.procs import descendants, pid_alive

    err = tmp_path_factory.mktemp("simulate") / "stderr"  # a pipe nobody reads fills up
    with err.open("w") as err_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "tpuslice.cli", "simulate", "--auth", "--slices", "v4:2x2x1:1"],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            env=driver_env(),
        )
    try:
        printed = _lines_until_status(process, 120, err)
        address = re.search(r"^address: (\S+:\d+)$", printed, re.M)
        token = re.search(r"^token: +export (.+)$", printed, re.M)
        assert address and token and 'ray.init(address="' in printed, printed
        env = dict(word.split("=", 1) for word in shlex.split(token.group(1)))
        pids = descendants([process.pid])
        yield AuthCluster(process, address.group(1), env, pids)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, err.read_text()[-3000:]
        assert "stopped" in err.read_text()
        assert len(pids) >= 3  # the CLI, the head's processes, the host's raylet at least
        assert sorted(pid for pid in pids if pid_alive(pid)) == []
        assert not Path(env["RAY_AUTH_TOKEN_PATH"]).exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _lines_until_status(process: subprocess.Popen[str], timeout: float, err: Path) -> str:
    """What the child printed up to its ``status:`` line, waited for ``timeout`` at most."""
    stdout = process.stdout
    assert stdout is not None
    lines: list[str] = []

    def read() -> None:
        while line := stdout.readline():
            lines.append(line)
            if line.startswith("status:"):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines or not lines[-1].startswith("status:"):
        process.kill()
        process.wait(timeout=30)
        raise AssertionError(
            f"`tpuslice simulate --auth` did not say it was ready in {timeout} s:\n"
            f"{''.join(lines)}\n{err.read_text()[-3000:]}"
        )
    return "".join(lines)


def run_driver(cluster: AuthCluster, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, cluster.address],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_status(
    cluster: AuthCluster, env: dict[str, str], *command: str
) -> subprocess.CompletedProcess[str]:
    """``tpuslice status --json`` (or ``command``) against the cluster, in a new process."""
    args = command or ("status", "--json")
    return subprocess.run(
        [sys.executable, "-m", "tpuslice.cli", *args, "--address", cluster.address],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.cluster
def test_the_simulators_token_is_kept_in_its_own_directory(auth_cluster: AuthCluster) -> None:
    path = Path(auth_cluster.env["RAY_AUTH_TOKEN_PATH"])
    assert auth_cluster.env["RAY_AUTH_MODE"] == "token"
    assert path.name == "auth_token" and path.parent.name.startswith("tpuslice-sim-")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert re.fullmatch("[0-9a-f]{64}", path.read_text())


@pytest.mark.cluster
def test_with_the_token_a_reservation_a_one_shot_and_status_work(
    auth_cluster: AuthCluster,
) -> None:
    env = driver_env(auth_cluster.env)
    assert run_driver(auth_cluster, env) == {
        "reserved": [[0, "v4-8-a"]],
        "one_shot": [[0, "v4-8-a"]],
        "groups_left": 0,
    }
    status = run_status(auth_cluster, env)
    assert status.returncode == 0, status.stderr[-3000:]
    assert [s["name"] for s in json.loads(status.stdout)["slices"]] == ["v4-8-a"]


@pytest.mark.cluster
def test_without_the_token_a_driver_and_the_cli_are_refused_at_once_naming_what_to_set(
    auth_cluster: AuthCluster,
) -> None:
    """A driver sends no token and the CLI a wrong one: Ray's two refusals, each checked
    before ray.init by the same function, so each entry point is shown once; the web view,
    a driver too, is refused with no token before it serves anything."""
    what_to_set = "set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN"
    refused = run_driver(auth_cluster, driver_env())
    assert "this process sends none (RAY_AUTH_MODE is unset, not 'token')" in refused.get(
        "error", ""
    ), refused
    assert what_to_set in refused["error"] and "RAY_AUTH_TOKEN_PATH" in refused["error"]
    assert refused["seconds"] < 10  # Ray alone retries for about 20 s
    wrong = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
    started = time.monotonic()
    status = run_status(auth_cluster, driver_env(wrong))
    assert status.returncode == 1
    assert "refused the token from RAY_AUTH_TOKEN" in status.stderr, status.stderr[-3000:]
    assert what_to_set in status.stderr and "Traceback" not in status.stderr
    assert time.monotonic() - started < 15  # its own start included
    web = run_status(auth_cluster, driver_env(), "dashboard", "--port", "0")
    assert web.returncode == 1 and "http://" not in web.stdout  # never started serving
    assert what_to_set in web.stderr and "Traceback" not in web.stderr, web.stderr[-3000:]
