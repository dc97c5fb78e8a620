"""Joining a running Ray cluster from the CLI, and the CLI's error types.

Never starts a cluster; an address nobody answers fails in seconds, not after Ray's minutes
of retries.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import click
import ray

from tpuslice._tpu import _auth, _ray
from tpuslice._tpu._connection import close_connection
from tpuslice.errors import TokenAuthError

__all__ = ["UsageError", "address_option", "connect_or_none", "connected"]

NO_CLUSTER_HINT = "start one with `tpuslice simulate`, or pass --address HOST:PORT"
PROBE_TIMEOUT_S = 3.0

address_option = click.option(
    "--address", default=None, help="Ray cluster (default: RAY_ADDRESS or local)."
)
"""The ``--address`` option every command that joins a cluster takes."""


class UsageError(click.UsageError):
    """Bad input shown as a click usage error (exit code 2)."""


class NoClusterError(click.ClickException):
    """There is no running Ray cluster to connect to (exit code 1)."""


class TokenRefusedError(click.ClickException):
    """The cluster requires a token this process does not present (exit code 1); the
    message is :class:`~tpuslice.errors.TokenAuthError`'s, naming what to set."""


def connect(address: str | None) -> bool:
    """Join a running Ray cluster: ``address``, else ``RAY_ADDRESS``, else the one this
    machine last started. Never starts one.

    Args:
        address: ``HOST:PORT`` (or ``ray://HOST:PORT``), or ``None``.

    Returns:
        Whether this call connected (the caller then owns the shutdown).

    Raises:
        UsageError: ``address`` is malformed, or ``local`` (which would start a cluster).
        NoClusterError: nothing answers at the address (or none is running here).
        TokenRefusedError: the cluster requires a token this process lacks or gets wrong.
    """
    if ray.is_initialized():
        return False
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    if target == "local":
        raise UsageError(
            "address 'local' would start a new Ray cluster; pass HOST:PORT of a running one, "
            "or leave --address out to find the one on this machine"
        )
    checked: str | None = target
    if target != "auto":
        probe(target)
    else:
        checked = _ray.recorded_cluster_address()
        if checked:  # Ray would retry this one for minutes if it is gone
            probe(checked, stale=True)
    try:
        if checked:
            _auth.check_token(checked, found_on_its_own=target == "auto")
        # "auto" (not None): with no cluster found, None would start a new local one.
        ray.init(address=target, log_to_driver=False, logging_level=logging.WARNING)
    except TokenAuthError as exc:
        raise TokenRefusedError(str(exc)) from exc
    except ray.exceptions.AuthenticationError as exc:  # token mode and no token at all
        refusal = _auth.refused(checked or target, str(getattr(exc, "message", "")))
        raise TokenRefusedError(str(refusal)) from exc
    except ConnectionError as exc:  # Ray's "no running instance" / "failed to connect"
        where = "on this machine" if target == "auto" else f"at {target}"
        raise NoClusterError(f"no running Ray cluster {where}; {NO_CLUSTER_HINT}") from exc
    except ValueError as exc:  # a malformed address: the only argument the user gave
        raise UsageError(f"Ray address {target!r} is not valid: {exc}") from exc
    return True


def connect_or_none(address: str | None) -> bool | None:
    """Like :func:`connect`, but ``None`` when no cluster runs and no address was given.

    Args:
        address: ``HOST:PORT``, or ``None``.

    Returns:
        As :func:`connect`, or ``None`` when there is no cluster to join.

    Raises:
        UsageError: a malformed address.
        NoClusterError: an address was given and nothing answers there.
    """
    try:
        return connect(address)
    except NoClusterError:
        if address or os.environ.get("RAY_ADDRESS"):
            raise
        return None


def probe(target: str, *, stale: bool = False) -> None:
    """Fail within :data:`PROBE_TIMEOUT_S` when nothing listens at ``target``.

    Args:
        target: ``HOST:PORT`` or ``ray://HOST:PORT``.
        stale: ``target`` is the address Ray recorded for the last cluster started here.

    Raises:
        UsageError: ``target`` is not ``HOST:PORT``.
        NoClusterError: nothing accepts a connection there.
    """
    host, _, port = target.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"Ray address {target!r} is not valid: expected HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        where = f"at {target} ({exc})"
        if stale:
            where = f"on this machine: the last one started here ({target}, recorded by Ray) "
            where += f"does not answer ({exc})"
        raise NoClusterError(f"no running Ray cluster {where}; {NO_CLUSTER_HINT}") from exc


@contextmanager
def connected(address: str | None) -> Iterator[None]:
    """Be connected for the block; disconnect afterwards only if we connected.

    Args:
        address: As for :func:`connect`.

    Raises:
        UsageError: as :func:`connect`.
        NoClusterError: as :func:`connect`.
    """
    ours = connect(address)
    try:
        yield
    finally:
        if ours:
            close_connection()
            ray.shutdown()
