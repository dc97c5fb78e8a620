"""Tests for tpuslice._host.node ("this host"): env, a real local HTTP metadata server, fake /dev.

No Ray cluster. The metadata server is http.server on 127.0.0.1 (port 0) in a thread;
device trees are built under tmp_path and passed as ``root``.
"""

from __future__ import annotations

import ast
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tpuslice._host import metadata, node
from tpuslice._host.metadata import MetadataClient
from tpuslice._host.node import HostTPUInfo
from tpuslice.errors import InvalidArgumentError

PREFIX = "/computeMetadata/v1/instance/attributes/"
GCE_ATTRIBUTES = {
    "accelerator-type": "v6e-16",
    "tpu-env": "ACCELERATOR_TYPE: 'v6e-16'\nCHIPS_PER_HOST_BOUNDS: '2,2,1'\n"
    "TOPOLOGY: '4x4'\nWORKER_ID: '2'\n",
    "instance-id": "7458121212",
    "agent-worker-number": "2",
}
GKE_ENV = {
    "TPU_NAME": "gke-slice",
    "TPU_WORKER_ID": "1",
    "TPU_ACCELERATOR_TYPE": "tpu7x-16",
    "TPU_TOPOLOGY": "2x2x2",
}
OFFLINE = MetadataClient(timeout_s=0)  # never touches the network
SLOW_REPLY_S = 10.0  # the slow server's delay; teardown releases it early


# --- a real HTTP server standing in for the GCE metadata server ---------------------------


class FakeMetadataServer(ThreadingHTTPServer):
    """``mode``: good (strict like GCE: 403 without the header), slow, trickle, fail
    (500s), impostor (200s without ``Metadata-Flavor: Google``, like a captive portal)."""

    daemon_threads = True

    def __init__(self, mode: str, attributes: dict[str, str]) -> None:
        super().__init__(("127.0.0.1", 0), MetadataHandler)
        self.mode = mode
        self.attributes = attributes
        self.requests: list[tuple[str, str | None]] = []
        self.release = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}{PREFIX}"


class MetadataHandler(BaseHTTPRequestHandler):
    server: FakeMetadataServer

    def do_GET(self) -> None:
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Metadata-Flavor")))
        if srv.mode == "slow":
            srv.release.wait(SLOW_REPLY_S)
        if srv.mode == "trickle":
            return self.trickle()
        if srv.mode == "fail":
            return self.reply(500, "internal error")
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.reply(403, "Missing Metadata-Flavor:Google header.")
        key = self.path.removeprefix(PREFIX)
        if not self.path.startswith(PREFIX) or key not in srv.attributes:
            return self.reply(404, "not found")
        return self.reply(200, srv.attributes[key], flavor=srv.mode != "impostor")

    def reply(self, code: int, body: str, flavor: bool = True) -> None:
        data = body.encode()
        self.send_response(code)
        if flavor:
            self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def trickle(self) -> None:
        """Headers at once, then a byte every 50 ms: each socket read is quick, the whole
        reply is not (urllib's timeout bounds each read, not the total)."""
        size = int(SLOW_REPLY_S / 0.05)
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        for _ in range(size):
            if self.server.release.wait(0.05):
                return
            try:
                self.wfile.write(b"x")
            except OSError:  # the client gave up
                return

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def serve() -> Iterator[Callable[..., FakeMetadataServer]]:
    servers: list[FakeMetadataServer] = []

    def start(mode: str = "good", attributes: dict[str, str] | None = None) -> FakeMetadataServer:
        server = FakeMetadataServer(mode, GCE_ATTRIBUTES if attributes is None else attributes)
        threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{PREFIX}"


# --- fake device trees -------------------------------------------------------------------


def make_accel(root: Path, count: int) -> Path:
    """``/dev/accel0..`` as plain files: detection only checks "not a directory" (as Ray
    does), since tests cannot create real character devices without root."""
    (root / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / "dev" / f"accel{i}").touch()
    return root


def make_vfio_group(root: Path, group: str, vendor: str | bytes | None) -> None:
    """``/dev/vfio/<group>`` and, unless vendor is None, its PCI device's vendor file."""
    (root / "dev" / "vfio").mkdir(parents=True, exist_ok=True)
    (root / "dev" / "vfio" / group).touch()
    if vendor is None:
        return
    device = root / "sys" / "kernel" / "iommu_groups" / group / "devices" / "0000:00:04.0"
    device.mkdir(parents=True)
    vendor_file = device / "vendor"
    if isinstance(vendor, bytes):
        vendor_file.write_bytes(vendor)
    else:
        vendor_file.write_text(vendor + "\n")


# --- chips -------------------------------------------------------------------------------


def test_accel_devices_are_counted(tmp_path: Path) -> None:
    make_accel(tmp_path, 4)
    assert node.count_tpu_chips(tmp_path) == (4, "/dev/accel*")


def test_accel_directory_is_an_nvidia_driver_not_a_tpu(tmp_path: Path) -> None:
    (tmp_path / "dev" / "accel").mkdir(parents=True)
    (tmp_path / "dev" / "accel" / "accel0").touch()
    assert node.count_tpu_chips(tmp_path) == (0, "none")


def test_vfio_groups_count_only_google_devices(tmp_path: Path) -> None:
    make_vfio_group(tmp_path, "0", "0x1ae0")
    make_vfio_group(tmp_path, "1", "0x1AE0")
    make_vfio_group(tmp_path, "96", "0x15b3")  # NVIDIA BlueField bound to vfio-pci
    make_vfio_group(tmp_path, "7", None)  # no sysfs entry: fail closed
    make_vfio_group(tmp_path, "8", b"\xff\xfe")  # unreadable vendor: skipped
    (tmp_path / "dev" / "vfio" / "vfio").touch()  # the VFIO control device
    assert node.count_tpu_chips(tmp_path) == (2, "/dev/vfio")


def test_accel_devices_win_over_vfio(tmp_path: Path) -> None:
    make_accel(tmp_path, 8)
    make_vfio_group(tmp_path, "0", "0x1ae0")
    assert node.count_tpu_chips(tmp_path) == (8, "/dev/accel*")


def test_no_devices_means_zero_chips(tmp_path: Path) -> None:
    assert node.count_tpu_chips(tmp_path) == (0, "none")
    assert node.count_tpu_chips(tmp_path / "missing") == (0, "none")


# --- the metadata client -----------------------------------------------------------------


def test_fake_server_is_as_strict_as_gce(serve: Callable[..., FakeMetadataServer]) -> None:
    server = serve()
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.base_url + "instance-id", timeout=5)
    assert info.value.code == 403
    info.value.close()
    assert MetadataClient(server.base_url, 5).get("instance-id") == "7458121212"
    assert server.requests[-1] == (PREFIX + "instance-id", "Google")


def test_answers_are_cached(serve: Callable[..., FakeMetadataServer]) -> None:
    server = serve()
    client = MetadataClient(server.base_url, 5)
    assert client.get("accelerator-type") == client.get("accelerator-type") == "v6e-16"
    assert client.get("no-such-key") is None
    assert len(server.requests) == 2


def test_slow_server_costs_at_most_the_budget(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server, timeout = serve("slow"), 0.3
    start = time.monotonic()
    info = node.detect(env={}, metadata=MetadataClient(server.base_url, timeout), root=tmp_path)
    elapsed = time.monotonic() - start
    assert info == HostTPUInfo()
    assert elapsed < timeout + 0.5
    assert len(server.requests) <= 1  # the budget is shared: no second slow request


def test_trickling_reply_is_cut_off_at_the_budget(
    serve: Callable[..., FakeMetadataServer],
) -> None:
    server, timeout = serve("trickle"), 0.3
    start = time.monotonic()
    assert MetadataClient(server.base_url, timeout).get("instance-id") is None
    assert time.monotonic() - start < timeout + 0.5


def test_failing_server_yields_nothing(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server = serve("fail")
    info = node.detect(env={}, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert info == HostTPUInfo()
    assert info.sources == {}
    assert len(server.requests) == 4  # a 500 is an answer: the other keys are still asked


def test_closed_port_yields_nothing_quickly(tmp_path: Path) -> None:
    start = time.monotonic()
    info = node.detect(env={}, metadata=MetadataClient(closed_port_url(), 5), root=tmp_path)
    assert info == HostTPUInfo()
    assert time.monotonic() - start < 2.0  # refused at once, not waited out


def test_impostor_without_metadata_flavor_is_ignored(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server = serve("impostor")
    info = node.detect(env={}, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert info == HostTPUInfo()
    assert len(server.requests) == 1  # not a metadata server: stop asking


def test_zero_budget_never_touches_the_network(serve: Callable[..., FakeMetadataServer]) -> None:
    server = serve()
    assert MetadataClient(server.base_url, 0).get("instance-id") is None
    assert server.requests == []


def test_budget_is_total_across_keys(serve: Callable[..., FakeMetadataServer]) -> None:
    server = serve()
    ticks = iter(range(100))
    client = MetadataClient(server.base_url, 1.5, clock=lambda: float(next(ticks)))
    assert client.get("instance-id") == "7458121212"  # t=0, deadline 1.5
    assert client.get("agent-worker-number") == "2"  # t=1, 0.5 s left
    assert client.get("accelerator-type") is None  # t=2, out of budget
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("base_url", "timeout_s"),
    [
        ("metadata.google.internal/computeMetadata", 0.5),
        (metadata.METADATA_URL, -1),
        (metadata.METADATA_URL, math.nan),
        (metadata.METADATA_URL, math.inf),
        (metadata.METADATA_URL, "0.5"),
    ],
)
def test_client_rejects_bad_arguments(base_url: str, timeout_s: float) -> None:
    with pytest.raises(InvalidArgumentError, match=r"base_url|timeout_s"):
        MetadataClient(base_url, timeout_s)


# --- detection ---------------------------------------------------------------------------


def test_gce_host_is_detected_from_metadata_and_devices(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server = serve()
    info = node.detect(
        env={}, metadata=MetadataClient(server.base_url, 5), root=make_accel(tmp_path, 4)
    )
    assert info == HostTPUInfo("7458121212", 2, "v6e-16", "4x4", 4)
    assert dict(info.sources) == {
        "slice_name": "metadata:instance-id",
        "worker_id": "metadata:agent-worker-number",
        "pod_type": "metadata:accelerator-type",
        "topology": "metadata:tpu-env",
        "chips": "/dev/accel*",
    }
    assert info.accelerator_type == "TPU-V6E"
    assert info.worker_count == 4


def test_gke_env_takes_precedence_over_metadata(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server = serve()
    info = node.detect(env=GKE_ENV, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert info == HostTPUInfo("gke-slice", 1, "v7x-16", "2x2x2", 0)
    assert all(source.startswith("env:") for source in info.sources.values())
    assert server.requests == []  # every fact was in the env: metadata never asked


def test_each_fact_falls_back_to_metadata_on_its_own(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server = serve()
    env = {"TPU_NAME": "from-env", "TPU_WORKER_ID": ""}  # empty counts as unset
    info = node.detect(env=env, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert (info.slice_name, info.worker_id, info.pod_type) == ("from-env", 2, "v6e-16")
    assert info.sources["slice_name"] == "env:TPU_NAME"
    assert info.sources["worker_id"] == "metadata:agent-worker-number"


@pytest.mark.parametrize("via", ["env", "metadata"])
def test_tpu7x_is_normalised_and_fixes_the_topology(
    via: str, serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    server = serve(attributes={"accelerator-type": "tpu7x-16"})
    env = {"TPU_ACCELERATOR_TYPE": "tpu7x-16"} if via == "env" else {}
    metadata = MetadataClient(server.base_url, 5)
    info = node.detect(env=env, metadata=metadata, root=make_accel(tmp_path, 4))
    assert (info.pod_type, info.topology, info.accelerator_type) == ("v7x-16", "2x2x2", "TPU-V7X")
    assert info.sources["topology"] == "derived:pod-type"
    assert info.worker_count == 2  # 16 cores / (4 chips x 2 cores)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("v6e-16", "v6e-16"),
        ("TPU-V6E-16", "v6e-16"),
        (" tpu7x-8 ", "v7x-8"),
        ("v5litepod-8", "v5litepod-8"),
        ("v5e-8", "v5litepod-8"),
        ("v4-16", "v4-16"),
    ],
)
def test_pod_type_spellings(given: str, expected: str) -> None:
    info = node.detect(env={"TPU_ACCELERATOR_TYPE": given}, metadata=OFFLINE, root="/nonexistent")
    assert info.pod_type == expected


def test_pod_type_normalisation_agrees_with_ray() -> None:
    tpu = pytest.importorskip("ray._private.accelerators.tpu")  # oracle only; no cluster
    for given in ("v6e-16", "tpu7x-16", "v5litepod-8", "v4-32", "v5p-8", "TPU-V6E-8"):
        ours = node.detect(env={"TPU_ACCELERATOR_TYPE": given}, metadata=OFFLINE, root="/x")
        assert ours.pod_type == tpu.normalize_tpu_accelerator_type(given), given


@pytest.mark.parametrize(
    ("var", "value", "expected"),
    [
        ("TPU_WORKER_ID", "abc", "non-negative integer such as '0'"),
        ("TPU_WORKER_ID", "-1", "non-negative integer"),
        ("TPU_ACCELERATOR_TYPE", "v9z-16", "pod type '<generation>-<size>'"),
        ("TPU_ACCELERATOR_TYPE", "v6e", "such as 'v6e-16'"),
        ("TPU_ACCELERATOR_TYPE", "v4-7", "a positive multiple of 2"),
        ("TPU_TOPOLOGY", "4by4", "sides joined by 'x'"),
    ],
)
def test_bad_env_value_names_variable_value_and_form(var: str, value: str, expected: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        node.detect(env={var: value}, metadata=OFFLINE, root="/nonexistent")
    message = str(info.value)
    assert f"{var}={value!r}" in message
    assert expected in message
    assert isinstance(info.value, ValueError)


def test_bad_metadata_is_logged_at_debug_and_ignored(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attributes = {
        "accelerator-type": "bogus-16",
        "agent-worker-number": "two",
        "tpu-env": "ZONE: 'us-east5-b'\n",
        "instance-id": "slice-a",
    }
    server = serve(attributes=attributes)
    with caplog.at_level(logging.DEBUG, logger="tpuslice._host.node"):
        info = node.detect(env={}, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert info == HostTPUInfo(slice_name="slice-a")
    logged = caplog.text
    assert "accelerator-type='bogus-16'" in logged
    assert "agent-worker-number='two'" in logged
    assert all(record.levelno == logging.DEBUG for record in caplog.records)


def test_ambiguous_pod_type_leaves_topology_to_tpu_env(
    serve: Callable[..., FakeMetadataServer], tmp_path: Path
) -> None:
    bare = {"accelerator-type": "v5litepod-16"}  # 16 chips: 2x8 or 4x4
    server = serve(attributes=bare)
    info = node.detect(env={}, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert (info.pod_type, info.topology) == ("v5litepod-16", None)
    server = serve(attributes={**bare, "tpu-env": "TOPOLOGY: '2x8'"})
    info = node.detect(env={}, metadata=MetadataClient(server.base_url, 5), root=tmp_path)
    assert info.topology == "2x8"


# --- Ray's public functions --------------------------------------------------------------


def test_get_current_pod_name(serve: Callable[..., FakeMetadataServer]) -> None:
    server = serve()
    assert node._pod_name(GKE_ENV, OFFLINE) == "gke-slice"
    metadata = MetadataClient(server.base_url, 5)
    assert node._pod_name({}, metadata) == "7458121212"
    closed = MetadataClient(closed_port_url(), 5)
    assert node._pod_name({}, closed) is None


def test_public_functions_default_to_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TPU_NAME", "from-os-environ")
    assert node.get_current_pod_name() == "from-os-environ"
    monkeypatch.delenv("TPU_NAME")
    assert node._pod_name(metadata=OFFLINE) is None


@pytest.mark.parametrize(
    ("pod_type", "chips", "expected"),
    [
        ("v6e-16", 4, 4),
        ("tpu7x-16", 4, 2),
        ("v6e-8", 8, 1),
        ("v6e-4", 8, 1),  # sub-host: still one host
        ("v4-32", 4, 4),
        ("v6e-16", 0, None),  # no chips visible: Ray returns None too
        (None, 4, None),  # not a TPU pod
    ],
)
def test_get_current_pod_worker_count(
    pod_type: str | None, chips: int, expected: int | None, tmp_path: Path
) -> None:
    env = {} if pod_type is None else {"TPU_ACCELERATOR_TYPE": pod_type}
    root = make_accel(tmp_path, chips)
    assert node._pod_worker_count(env, OFFLINE, root) == expected


def test_get_num_tpu_chips_on_node_reads_only_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_WORKER_ID", "abc")
    assert node.get_num_tpu_chips_on_node() == node.count_tpu_chips()[0]


# --- labels, resources, ray start ----------------------------------------------------------


def test_node_module_does_not_import_ray() -> None:
    tree = ast.parse(Path(node.__file__).read_text())
    imported = {
        alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
    }
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {name for name in imported if name == "ray" or name.startswith("ray.")}
