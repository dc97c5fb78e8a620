"""The GCE metadata server, asked within one short time budget so it never hangs off GCP.
A reply without ``Metadata-Flavor: Google`` (a captive portal's) is not believed."""

from __future__ import annotations

import http.client
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from tpuslice.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

METADATA_HOST_ENV = "GCE_METADATA_HOST"  # the server's host[:port], as Google's libraries
METADATA_HOST = "metadata.google.internal"
METADATA_URL = f"http://{METADATA_HOST}/computeMetadata/v1/instance/attributes/"
METADATA_FLAVOR = ("Metadata-Flavor", "Google")
DEFAULT_METADATA_TIMEOUT_S = 0.5
_MAX_METADATA_BYTES = 1 << 16

# The metadata server is link-local: never send its requests through an HTTP(S)_PROXY.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def metadata_root() -> str:
    """The metadata server's ``http://<host>/computeMetadata/v1/`` URL."""
    host = os.environ.get(METADATA_HOST_ENV, "").strip() or METADATA_HOST
    return f"http://{host}/computeMetadata/v1/"


class MetadataClient:
    """Cached GCE instance attributes, all within one budget of ``timeout_s``; after it, or
    once unreachable, every ``get`` is None at once. Each request runs in a daemon thread,
    since urllib's timeout does not bound slow DNS."""

    def __init__(
        self,
        base_url: str | None = None,
        timeout_s: float = DEFAULT_METADATA_TIMEOUT_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if base_url is None:
            base_url = metadata_root() + "instance/attributes/"
        if not str(base_url).startswith(("http://", "https://")):
            raise InvalidArgumentError(
                f"metadata base_url must be an http(s) URL such as {METADATA_URL!r}, "
                f"got {base_url!r}"
            )
        if not isinstance(timeout_s, (int, float)) or not 0 <= timeout_s < math.inf:
            raise InvalidArgumentError(f"timeout_s must be finite seconds >= 0, got {timeout_s!r}")
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._deadline: float | None = None
        self._reachable = True
        self._answers: dict[str, str | None] = {}

    def get(self, key: str) -> str | None:
        """Attribute ``key``'s text, stripped; None if missing, unreadable or out of time."""
        if key not in self._answers:
            self._answers[key] = self._fetch(key)
        return self._answers[key]

    def _fetch(self, key: str) -> str | None:
        """One GET in a daemon thread, waited on for what is left of the budget."""
        now = self._clock()
        if self._deadline is None:
            self._deadline = now + self.timeout_s
        remaining = self._deadline - now
        if not self._reachable or remaining <= 0:
            return None
        url = self.base_url + key
        replies: list[tuple[str | None, str, bool]] = []
        worker = threading.Thread(
            target=lambda: replies.append(_http_get(url, remaining)), daemon=True
        )
        worker.start()
        worker.join(remaining)
        if not replies:
            logger.debug("metadata %s: no answer within the %.2fs budget", url, self.timeout_s)
            self._reachable = False
            return None
        text, _, self._reachable = replies[0]
        return text


@dataclass(frozen=True)
class Watched:
    """One answer of :func:`watch`; ``value`` is None if missing or unreadable."""

    value: str | None
    etag: str
    reachable: bool


def watch(
    path: str, etag: str = "", timeout_s: float = 60.0, *, root: str | None = None
) -> Watched:
    """Long-poll the value at ``path`` under ``computeMetadata/v1/``: answer when it differs
    from version ``etag`` (at once if empty), or after ``timeout_s`` (whole seconds) as is."""
    url = (root or metadata_root()) + path
    wait = 0.0
    if etag:
        wait = max(1, int(timeout_s))
        query = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": str(wait)}
        url += "?" + urlencode(query)
    text, found, reachable = _http_get(url, wait + 5.0)
    return Watched(text, found, reachable)


def _http_get(url: str, timeout: float) -> tuple[str | None, str, bool]:
    """GET one metadata URL: (text or None, ETag, whether a metadata server answered)."""
    request = urllib.request.Request(url, headers=dict([METADATA_FLAVOR]))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            if response.headers.get(METADATA_FLAVOR[0]) != METADATA_FLAVOR[1]:
                logger.debug("metadata %s: reply lacks Metadata-Flavor: Google", url)
                return None, "", False
            etag = response.headers.get("ETag", "")
            text = response.read(_MAX_METADATA_BYTES).decode("utf-8").strip()
    except urllib.error.HTTPError as exc:  # 404 for a missing attribute, 5xx, 403
        logger.debug("metadata %s: HTTP %s", url, exc.code)
        exc.close()
        return None, "", True
    except (OSError, http.client.HTTPException) as exc:  # URLError, TimeoutError, refused
        logger.debug("metadata %s unreachable: %s", url, exc)
        return None, "", False
    except ValueError as exc:  # UnicodeDecodeError
        logger.debug("metadata %s: unreadable reply: %s", url, exc)
        return None, "", True
    return text or None, etag, True
