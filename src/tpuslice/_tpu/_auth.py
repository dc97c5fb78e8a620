"""Ray's token authentication as a driver meets it: which token this process presents, a
check before ``ray.init`` that fails at once naming what to set (``ray.init`` retries, then
fails without saying why), :func:`connect`, and a simulated cluster's token file."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from tpuslice._tpu import _ray
from tpuslice.errors import TokenAuthError

logger = logging.getLogger(__name__)

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
AUTH_ENV = (MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV)
DEFAULT_TOKEN_FILE = Path(".ray") / "auth_token"  # under the home directory; Ray looks last
CHECK_TIMEOUT_S = 5.0  # a GCS that runs answers the check at once
WHAT_TO_SET = (
    f"set {MODE_ENV}=token and the cluster's token in {TOKEN_ENV} (the token itself) or "
    f"{TOKEN_PATH_ENV} (a file holding it), then connect again"
)


@dataclass(frozen=True)
class TokenSetting:
    """What this process presents to a cluster that requires a token; ``""`` for none."""

    mode: str
    """``RAY_AUTH_MODE``, lower-cased."""
    source: str
    """Where the token comes from: a variable or a file."""
    problem: str = ""
    """Why that token cannot be used."""

    @property
    def unusable(self) -> bool:
        """Whether Ray, in token mode, has no token it can send."""
        return self.mode == "token" and bool(self.problem)


def token_setting(environ: Mapping[str, str], home: Path) -> TokenSetting:
    """Which token a process with ``environ`` and ``home`` presents, in Ray's order."""
    mode = environ.get(MODE_ENV, "").strip().lower()
    if environ.get(TOKEN_ENV, "").strip():
        return TokenSetting(mode, TOKEN_ENV)
    path = environ.get(TOKEN_PATH_ENV, "").strip()
    if path:
        return TokenSetting(mode, f"{TOKEN_PATH_ENV}={path}", _unreadable(Path(path)))
    default = home / DEFAULT_TOKEN_FILE
    if default.exists():
        return TokenSetting(mode, str(default), _unreadable(default))
    return TokenSetting(
        mode, "", f"no token was found in {TOKEN_ENV}, {TOKEN_PATH_ENV} or ~/{DEFAULT_TOKEN_FILE}"
    )


def _unreadable(path: Path) -> str:
    """Why the token file ``path`` cannot be used, or ``""``."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    return "" if text.strip() else f"{path} is empty"


def refused_message(address: str, setting: TokenSetting, reason: str = "") -> str:
    """A TokenAuthError's message: what was found (and Ray's ``reason``), and what to set."""
    if setting.mode != "token":
        found = (
            f"it requires a token, and this process sends none ({MODE_ENV} is "
            f"{repr(setting.mode) if setting.mode else 'unset'}, not 'token')"
        )
    elif setting.problem:
        found = f"{MODE_ENV}=token, but {setting.problem}"
    else:
        found = f"it refused the token from {setting.source}"
    because = f" (Ray: {reason})" if reason else ""
    return f"connecting to the Ray cluster at {address}: {found}{because}; {WHAT_TO_SET}"


def refused(address: str, reason: str = "") -> TokenAuthError:
    """The error for a cluster at ``address`` that refuses this process's token."""
    setting = token_setting(os.environ, Path.home())
    return TokenAuthError(refused_message(address, setting, reason), address)


def check_token(
    address: str, *, found_on_its_own: bool = False, timeout_s: float = CHECK_TIMEOUT_S
) -> None:
    """Raise TokenAuthError if the GCS at ``address`` will refuse our token (one silent past
    ``timeout_s`` is left to ``ray.init``). For an address not given, a token found turns
    token mode on, as in ``ray.init``."""
    if address.startswith("ray://"):
        return  # the Ray Client server checks the token itself
    if not ray.is_initialized():
        _ray.reload_auth_settings()
        if found_on_its_own:
            _ray.enable_token_auth_if_token_found()
    if token_setting(os.environ, Path.home()).unusable:
        raise refused(address)
    reason = _refusal_within(address, timeout_s)
    if reason is not None:
        raise refused(address, reason)


def _refusal_within(address: str, timeout_s: float) -> str | None:
    """Ray's reason for refusing the token, asked on a thread so a silent GCS holds us
    ``timeout_s`` at most; ``None`` if accepted or not asked."""
    answer: Future[str | None] = Future()

    def ask() -> None:
        try:
            answer.set_result(_ray.gcs_token_refusal(address))
        except _ray.kv_errors() as exc:
            answer.set_exception(exc)

    threading.Thread(target=ask, name="tpuslice token check", daemon=True).start()
    try:
        return answer.result(timeout=timeout_s)
    except FutureTimeout:
        logger.debug("the GCS at %s did not answer the token check in %s s", address, timeout_s)
    except _ray.kv_errors() as exc:
        logger.debug("the token check of %s failed: %r", address, exc)
    return None


def connect(address: str | None = None, **init_kwargs: Any) -> None:
    """``ray.init(address)`` to a running cluster (never starts one), after checking that it
    accepts this process's token, so a refusal fails at once naming what to set.

    Args:
        address: ``HOST:PORT`` or ``ray://HOST:PORT``; default ``RAY_ADDRESS``, else ``"auto"``.
        **init_kwargs: Passed on to ``ray.init``.

    Raises:
        TokenAuthError: the cluster requires a token and this one is missing or wrong.
    """
    given = address or os.environ.get("RAY_ADDRESS")
    target = given or _ray.recorded_cluster_address()
    if target is not None:
        check_token(target, found_on_its_own=not given)
    try:
        ray.init(address=address or "auto", **init_kwargs)
    except ray.exceptions.AuthenticationError as exc:
        raise refused(target or "auto", str(getattr(exc, "message", ""))) from exc


def write_token(path: Path) -> str:
    """A random token, kept in the new file ``path`` only its owner may read."""
    token = secrets.token_hex(32)
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(handle, "w", encoding="utf-8") as f:
        f.write(token)
    return token


def present_token_file(path: Path) -> dict[str, str | None]:
    """This process and its children present the token in ``path`` (``RAY_AUTH_TOKEN``,
    which would win, unset); what :func:`restore_auth_env` puts back. Only when not connected.
    """
    saved = {name: os.environ.get(name) for name in AUTH_ENV}
    _set_env({MODE_ENV: "token", TOKEN_PATH_ENV: str(path), TOKEN_ENV: None})
    return saved


def restore_auth_env(saved: Mapping[str, str | None]) -> None:
    """Put back what :func:`present_token_file` replaced. Only while not connected."""
    _set_env(saved)


def _set_env(values: Mapping[str, str | None]) -> None:
    """Set (None: unset) these variables, and have Ray here read them."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _ray.reload_auth_settings()
