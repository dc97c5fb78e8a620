"""A GCE metadata server for one simulated TPU host, on a loopback port, as strict as GCE:
403 without ``Metadata-Flavor: Google``, 404 for unknown paths, an ``ETag`` on every value,
and ``?wait_for_change=true`` held until the value changes or ``timeout_sec`` passes.
"""

from __future__ import annotations

import hashlib
import select
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

ROOT = "/computeMetadata/v1/"
PREEMPTED = "instance/preempted"
MAINTENANCE_EVENT = "instance/maintenance-event"
MAX_WAIT_S = 3600.0
"""GCE caps ``timeout_sec``; a held request never outlives this."""


def host_values(slice_name: str, worker_id: int, pod_type: str, topology: str) -> dict[str, str]:
    """What a TPU VM's metadata server says about one simulated host: path under
    ``computeMetadata/v1/`` -> value; ``slice_name`` is the ``instance-id`` attribute."""
    digest = hashlib.sha256(f"{slice_name}/{worker_id}".encode()).hexdigest()
    name = f"t1v-n-{digest[:8]}-w-{worker_id}"
    tpu_env = f"ACCELERATOR_TYPE: '{pod_type}'\nTOPOLOGY: '{topology}'\nWORKER_ID: '{worker_id}'\n"
    return {
        "instance/id": str(int(digest[8:24], 16) % 10**19),
        "instance/name": name,
        "instance/hostname": f"{name}.c.simulated.internal",
        "instance/attributes/instance-id": slice_name,
        "instance/attributes/accelerator-type": pod_type,
        "instance/attributes/agent-worker-number": str(worker_id),
        "instance/attributes/tpu-env": tpu_env,
        PREEMPTED: "FALSE",
        MAINTENANCE_EVENT: "NONE",
    }


class MetadataServer(ThreadingHTTPServer):
    """One host's metadata server over ``values`` (path under ``computeMetadata/v1/`` ->
    value): :meth:`start`, change values with :meth:`set`, :meth:`close`."""

    daemon_threads = True

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._values = dict(values)
        self._versions = dict.fromkeys(values, 1)
        self._changed = threading.Condition()
        self._closed = False
        self._held = 0
        self._thread: threading.Thread | None = None
        self._wake = socket.socketpair()

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``, the value for ``GCE_METADATA_HOST``."""
        return f"127.0.0.1:{self.server_port}"

    def start(self) -> MetadataServer:
        """Serve in a daemon thread, asleep in ``select`` so idle servers cost no CPU."""
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving at once; held requests are answered as they stand. Idempotent."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()
        self._wake[1].send(b"x")
        if self._thread is not None:
            self._thread.join(5)
        self.server_close()
        for end in self._wake:
            end.close()

    def _serve(self) -> None:
        while True:
            readable, _, _ = select.select([self.socket, self._wake[0]], [], [])
            if self._wake[0] in readable:
                return
            self.handle_request()  # ready: accept it and hand it to a thread

    def set(self, path: str, value: str) -> None:
        """Change the value at ``path``; requests waiting for its change are answered."""
        with self._changed:
            if self._values.get(path) == value:
                return
            self._values[path] = value
            self._versions[path] = self._versions.get(path, 0) + 1
            self._changed.notify_all()

    def get(self, path: str) -> str | None:
        """The value at ``path`` now; ``None`` if there is no such path."""
        with self._changed:
            return self._values.get(path)

    def held(self) -> int:
        """How many requests wait for a change now (tests synchronise on it)."""
        with self._changed:
            return self._held

    def _answer(self, path: str, last_etag: str | None, wait_s: float) -> tuple[str, str] | None:
        """``(value, etag)`` of ``path`` (``None`` if unknown) once it differs from
        ``last_etag`` (``""``: from now; ``None``: no wait) or ``wait_s`` has passed."""
        deadline = time.monotonic() + min(wait_s, MAX_WAIT_S)
        with self._changed:
            if path not in self._values:
                return None
            if last_etag is not None:
                seen = last_etag or self._etag(path)
                self._held += 1
                while self._etag(path) == seen and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                self._held -= 1
            return self._values[path], self._etag(path)

    def _etag(self, path: str) -> str:
        return f"{hashlib.sha256(path.encode()).hexdigest()[:8]}-{self._versions[path]}"


class _Handler(BaseHTTPRequestHandler):
    server: MetadataServer

    def do_GET(self) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, "Missing Metadata-Flavor:Google header.")
            return
        parts = urlsplit(self.path)
        if not parts.path.startswith(ROOT):
            self._reply(404, "not found")
            return
        query = parse_qs(parts.query)
        waiting = query.get("wait_for_change", ["false"])[0].lower() == "true"
        last = query.get("last_etag", [""])[0] if waiting else None
        try:
            wait_s = float(query.get("timeout_sec", [MAX_WAIT_S])[0])
        except ValueError:
            self._reply(400, "timeout_sec must be a number")
            return
        found = self.server._answer(parts.path.removeprefix(ROOT), last, wait_s)
        if found is None:
            self._reply(404, "not found")
            return
        self._reply(200, found[0], etag=found[1])

    def _reply(self, code: int, body: str, etag: str = "") -> None:
        data = body.encode()
        try:
            self.send_response(code)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away while the request was held
            return

    def log_message(self, format: str, *args: object) -> None:
        return
