"""The simulator's GCE metadata server and the client's long-poll, on loopback. No Ray.

The server is as strict as GCE (403 without the header, 404 for unknown paths), gives
each value an ETag, and holds ``wait_for_change`` requests until the value changes or
``timeout_sec`` passes; :func:`tpuslice._host.metadata.watch` and node detection read it
through ``GCE_METADATA_HOST``, as Google's client libraries do.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from clusterutil import wait_for
from tpuslice._host import metadata, node
from tpuslice._host.metadata import MetadataClient, metadata_root, watch
from tpuslice._sim.metadata_server import (
    MAINTENANCE_EVENT,
    PREEMPTED,
    MetadataServer,
    host_values,
)


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    running = MetadataServer(host_values("v6e-16-a", 2, "v6e-16", "4x4")).start()
    try:
        yield running
    finally:
        running.close()


def root_of(server: MetadataServer) -> str:
    return f"http://{server.host}/computeMetadata/v1/"


def test_the_root_honours_gce_metadata_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metadata.METADATA_HOST_ENV, raising=False)
    assert metadata_root() == "http://metadata.google.internal/computeMetadata/v1/"
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:8080")
    assert metadata_root() == "http://127.0.0.1:8080/computeMetadata/v1/"


def test_it_is_as_strict_as_gce(server: MetadataServer) -> None:
    url = root_of(server) + "instance/attributes/instance-id"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 403
    refused.value.close()
    request = urllib.request.Request(url + "-nope", headers={"Metadata-Flavor": "Google"})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=5)
    assert missing.value.code == 404
    missing.value.close()


def test_detection_reads_this_host_from_it(
    server: MetadataServer, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """With no TPU_* variables (a GCE TPU VM), the default client finds the server
    through GCE_METADATA_HOST."""
    monkeypatch.setenv("GCE_METADATA_HOST", server.host)
    info = node.detect(env={}, metadata=MetadataClient(timeout_s=5), root=str(tmp_path))
    assert (info.slice_name, info.worker_id, info.pod_type, info.topology) == (
        "v6e-16-a",
        2,
        "v6e-16",
        "4x4",
    )
    assert info.sources["slice_name"] == "metadata:instance-id"


def test_a_watch_answers_at_once_then_waits_for_the_change(server: MetadataServer) -> None:
    root = root_of(server)
    first = watch(PREEMPTED, root=root)
    assert (first.value, first.reachable) == ("FALSE", True) and first.etag
    answers: list[metadata.Watched] = []
    waiter = threading.Thread(
        target=lambda: answers.append(watch(PREEMPTED, first.etag, 30, root=root))
    )
    waiter.start()
    wait_for(lambda: server.held() == 1, 10, "the watch to be held")
    assert not answers  # held: nothing changed yet
    server.set(PREEMPTED, "TRUE")
    waiter.join(10)
    assert answers[0].value == "TRUE" and answers[0].etag != first.etag


def test_a_watch_with_an_old_etag_answers_at_once(server: MetadataServer) -> None:
    root = root_of(server)
    first = watch(MAINTENANCE_EVENT, root=root)
    server.set(MAINTENANCE_EVENT, "TERMINATE_ON_HOST_MAINTENANCE")
    asked = time.monotonic()
    now = watch(MAINTENANCE_EVENT, first.etag, 30, root=root)
    assert now.value == "TERMINATE_ON_HOST_MAINTENANCE"
    assert time.monotonic() - asked < 5


def test_a_watch_times_out_with_the_value_unchanged(server: MetadataServer) -> None:
    root = root_of(server)
    first = watch(PREEMPTED, root=root)
    again = watch(PREEMPTED, first.etag, 1, root=root)
    assert (again.value, again.etag) == ("FALSE", first.etag)


def test_closing_the_server_answers_held_watches(server: MetadataServer) -> None:
    root = root_of(server)
    first = watch(PREEMPTED, root=root)
    answers: list[metadata.Watched] = []
    waiter = threading.Thread(
        target=lambda: answers.append(watch(PREEMPTED, first.etag, 60, root=root))
    )
    waiter.start()
    wait_for(lambda: server.held() == 1, 10, "the watch to be held")
    server.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert answers and answers[0].value == "FALSE"


def test_nothing_listening_is_unreachable() -> None:
    gone = MetadataServer(host_values("s", 0, "v6e-8", "2x4"))
    host = gone.host
    gone.server_close()
    answer = watch(PREEMPTED, root=f"http://{host}/computeMetadata/v1/")
    assert answer == metadata.Watched(None, "", False)
