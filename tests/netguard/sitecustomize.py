"""Network guard for the test suite: nothing may connect off this machine.

Loaded in the pytest process by ``tests/conftest.py`` and, through ``PYTHONPATH`` (this
directory) as Python's ``sitecustomize``, in every Python process the tests start: CLI
child processes, and the raylets' workers on simulated hosts. A connection to an address
that is neither loopback nor one of this machine's own interface addresses, or a name
lookup of any other host name, is refused with :class:`NetGuardError` (a
``ConnectionRefusedError``, so code under test sees "nothing answers") and written to the
log file named by ``TPUSLICE_NETGUARD_LOG``. The test session fails any test during which
that log grew, whichever process wrote it.

One attempt is refused without being logged: Ray's dashboard always runs its usage-stats
module, which probes cloud metadata addresses once at cluster start (before it checks
whether usage stats are enabled), and no setting of ours turns that off. It is still
refused, so nothing leaves the machine.

A UDP ``connect`` sends nothing (Ray uses one to learn its outward address), so it is
allowed; a datagram sent off the machine is not.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import traceback
import weakref
from typing import Any

LOG_ENV = "TPUSLICE_NETGUARD_LOG"
ALLOWED_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


class NetGuardError(ConnectionRefusedError):
    """A test tried to reach an address off this machine."""


_own: set[str] | None = None
_udp_peers: weakref.WeakKeyDictionary[socket.socket, str] = weakref.WeakKeyDictionary()
_real = {
    "connect": socket.socket.connect,
    "connect_ex": socket.socket.connect_ex,
    "sendto": socket.socket.sendto,
    "send": socket.socket.send,
    "sendall": socket.socket.sendall,
    "getaddrinfo": socket.getaddrinfo,
}


def own_addresses() -> set[str]:
    """Every address of this machine's interfaces (read once, lazily)."""
    global _own
    if _own is None:
        import psutil

        _own = {
            str(ipaddress.ip_address(a.address.split("%", 1)[0]))
            for addrs in psutil.net_if_addrs().values()
            for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)
        }
    return _own


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None


def host_allowed(host: str) -> bool:
    """Loopback, unspecified (which Linux connects to this machine), or our own address;
    a name only if it is localhost or this machine's host name."""
    ip = _literal(host)
    if ip is None:
        return host.lower() in ALLOWED_NAMES or host == socket.gethostname()
    if getattr(ip, "ipv4_mapped", None) is not None:
        ip = ip.ipv4_mapped  # type: ignore[union-attr]
    return ip.is_loopback or ip.is_unspecified or str(ip) in own_addresses()


RAY_CLOUD_PROBE = "get_cloud_from_metadata_requests"
"""Ray's dashboard's cloud-provider probe (ray/_common/usage/usage_lib.py)."""


def refuse(what: str) -> NetGuardError:
    """Log the attempt (pid, what, where from) and return the error to raise."""
    frames = traceback.extract_stack()
    stack = "".join(traceback.format_list(frames[-30:-2]))
    path = os.environ.get(LOG_ENV)
    if path and not any(frame.name == RAY_CLOUD_PROBE for frame in frames):
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"--- pid {os.getpid()}: {what}\n{stack}")
    return NetGuardError(f"netguard: {what} would leave this machine; tests must stay local")


def _check(sock: socket.socket, address: Any, verb: str) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
        host = str(address[0])
        if not host_allowed(host):
            raise refuse(f"{verb} to {host}:{address[1]}")


def _connect(self: socket.socket, address: Any) -> None:
    if self.type == socket.SOCK_DGRAM and isinstance(address, tuple):
        _udp_peers[self] = str(address[0])  # sends nothing yet
    else:
        _check(self, address, "connect")
    _real["connect"](self, address)


def _connect_ex(self: socket.socket, address: Any) -> int:
    if self.type == socket.SOCK_DGRAM and isinstance(address, tuple):
        _udp_peers[self] = str(address[0])
    else:
        _check(self, address, "connect")
    result: int = _real["connect_ex"](self, address)
    return result


def _sendto(self: socket.socket, data: Any, *rest: Any) -> int:
    _check(self, rest[-1], "sendto")
    result: int = _real["sendto"](self, data, *rest)
    return result


def _udp_send_check(sock: socket.socket) -> None:
    peer = _udp_peers.get(sock)
    if peer is not None and not host_allowed(peer):
        raise refuse(f"datagram to {peer}")


def _send(self: socket.socket, *args: Any) -> int:
    _udp_send_check(self)
    result: int = _real["send"](self, *args)
    return result


def _sendall(self: socket.socket, *args: Any) -> None:
    _udp_send_check(self)
    _real["sendall"](self, *args)


def _getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, bytes):
        host = host.decode()
    if host is not None and _literal(str(host)) is None and not host_allowed(str(host)):
        raise refuse(f"name lookup of {host!r}")  # a literal is checked at connect
    return _real["getaddrinfo"](host, *args, **kwargs)


def install() -> None:
    """Patch the socket module in this process (idempotent)."""
    if getattr(socket, "_tpuslice_netguard", False):
        return
    socket.socket.connect = _connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _connect_ex  # type: ignore[method-assign]
    socket.socket.sendto = _sendto  # type: ignore[method-assign,assignment]
    socket.socket.send = _send  # type: ignore[method-assign]
    socket.socket.sendall = _sendall  # type: ignore[method-assign]
    socket.getaddrinfo = _getaddrinfo
    socket._tpuslice_netguard = True  # type: ignore[attr-defined]


if os.environ.get(LOG_ENV):
    install()
