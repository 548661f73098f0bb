"""Building the TCP transport's authenticated full mesh through the store.

Every rank listens on an ephemeral port and publishes ``host:port`` in the store; each rank dials
every lower rank and accepts every higher one, so nobody waits on a rank that waits on it. The
dialling rank's id travels inside the authenticated handshake.

Accepted connections are authenticated by a ``Gate`` in the accepting rank's own thread, each
as its bytes arrive and within a short deadline of its own: strangers that connect and stay
silent, however many, delay only themselves, never the peers behind them. When set-up ends, by
success or error, every handshake still in flight is cut off.
"""
from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import time
from typing import Optional

from ..rendezvous.auth import check_secret, client_handshake, job_secret
from ..rendezvous.gate import DEADLINE_S, Gate
from ..errors import AuthenticationError, RendezvousError

HELLO = struct.Struct("<II")  # dialling rank, its world size; then the key prefix
# Connections queued before the rank gets to accepting them (it dials the lower ranks first):
# room for strangers and every peer, so that no peer's connection attempt is dropped and
# retried a second later. The kernel caps it at net.core.somaxconn.
_BACKLOG = 4096
_SOCKET_BUFFER = 4 << 20
# A peer on this host: the socket buffers of the loopback path, which has no bandwidth-delay
# product to cover. Small ones keep the data in flight in the cores' caches: a 16 MiB exchange
# took a third of the time it took with the 4 MiB ones (which Linux doubles), and Linux's own
# autotuning grows them as large.
LOCAL_SOCKET_BUFFER = 64 << 10


def address_key(prefix: str, rank: int) -> str:
    """The store key under which ``rank`` publishes its listening ``host:port``."""
    return f"{prefix}/addr/{rank}"


def build_mesh(rank: int, world_size: int, store, timeout: float, secret: Optional[bytes] = None,
               host: Optional[str] = None, prefix: str = "tcp") -> dict[int, socket.socket]:
    """Connect to every other rank within ``timeout`` seconds; returns one tuned, non-blocking,
    authenticated socket per peer rank."""
    deadline = time.monotonic() + timeout
    secret = (job_secret() if secret is None
              else check_secret(secret, "the tcp transport's secret"))
    host = host or getattr(store, "local_address", None) or socket.gethostname()
    socks: dict[int, socket.socket] = {}
    listener = listen(host, world_size)
    try:
        store.set(address_key(prefix, rank), f"{host}:{listener.getsockname()[1]}".encode())
        hello = HELLO.pack(rank, world_size) + prefix.encode()
        for peer in range(rank):
            address = store.get(address_key(prefix, peer),
                                timeout=max(deadline - time.monotonic(), 1e-3)).decode()
            socks[peer] = _dial(rank, peer, address, secret, hello, deadline, timeout)
        _accept_higher(listener, rank, world_size, prefix, secret, deadline, timeout, socks)
        for sock in socks.values():
            tune(sock)
            sock.setblocking(False)
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    finally:
        listener.close()
    return socks


def _dial(rank: int, peer: int, address: str, secret: bytes, hello: bytes, deadline: float,
          timeout: float) -> socket.socket:
    host, _, port = address.rpartition(":")
    last_error = ""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(f"could not connect to {address} within {timeout} s"
                                  + (f" (last error: {last_error})" if last_error else ""),
                                  rank=rank, peer=peer, op="tcp.connect")
        try:
            sock = socket.create_connection((host, int(port)), timeout=remaining)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.EAGAIN, errno.ETIMEDOUT):
                raise RendezvousError(f"could not connect to {address}: {e}", rank=rank,
                                      peer=peer, op="tcp.connect") from None
            last_error = str(e)
            time.sleep(0.05)
            continue
        try:
            client_handshake(sock, secret, remaining, client_info=hello)
        except ConnectionError as e:  # reset or closed under the handshake: dial again
            sock.close()
            last_error = str(e)
            time.sleep(0.05)
            continue
        except AuthenticationError as e:
            sock.close()
            raise AuthenticationError(f"handshake with {address} failed: {e}",
                                      rank=rank, peer=peer, op="tcp.connect") from None
        except BaseException:
            sock.close()
            raise
        return sock


def _accept_higher(listener: socket.socket, rank: int, world_size: int, prefix: str,
                   secret: bytes, deadline: float, timeout: float,
                   socks: dict[int, socket.socket]) -> None:
    """Accept until every higher rank is in ``socks``; strangers wait at the gate meanwhile."""
    missing = set(range(rank + 1, world_size))
    rejected = ""
    gate = Gate(listener, secret, min(timeout, DEADLINE_S))
    arrivals: list = []
    try:
        while missing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousError(f"ranks {sorted(missing)} did not connect within "
                                      f"{timeout} s{rejected}", rank=rank, op="tcp.accept")
            arrivals = gate.poll(remaining)
            # One at a time: whatever is left unclaimed when we raise, ``finally`` closes.
            while arrivals:
                arrival = arrivals.pop(0)
                if arrival.error is None:
                    peer = _admit(arrival.conn, arrival.addr, arrival.info, rank, world_size,
                                  prefix, missing)
                    try:
                        arrival.accept()
                    except OSError as e:  # it left before it heard: it will dial again
                        arrival.conn.close()
                        rejected = f" (last rejected connection: {e})"
                        continue
                    socks[peer] = arrival.conn
                    missing.discard(peer)
                else:  # a stranger, or a peer that vanished mid-handshake: keep waiting
                    rejected = f" (last rejected connection: {arrival.error})"
    finally:
        for arrival in arrivals:
            if arrival.conn is not None:
                arrival.conn.close()
        gate.close()


def _admit(conn: socket.socket, addr, info: bytes, rank: int, world_size: int, prefix: str,
           missing: set[int]) -> int:
    """The rank an authenticated connection belongs to; closes it and raises when that rank is
    not one we wait for."""
    peer, world = (-1, -1)
    if len(info) >= HELLO.size:
        peer, world = HELLO.unpack(info[:HELLO.size])
    their_prefix = info[HELLO.size:].decode(errors="replace")
    if world != world_size or their_prefix != prefix or peer not in missing:
        conn.close()
        raise RendezvousError(
            f"{addr} connected as rank {peer} of {world} (prefix {their_prefix!r}); expected one "
            f"of ranks {sorted(missing)} of {world_size} (prefix {prefix!r})",
            rank=rank, peer=peer, op="tcp.accept")
    return peer


def tune(sock: socket.socket) -> None:
    """Low latency, buffers sized for the path (small to a peer on this host, large where the
    kernel allows them to one elsewhere), and keep-alive probes. Called before any payload
    moves: a receive buffer must not shrink below the window it already advertised."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    local = same_host(sock)
    for option, limit_file in ((socket.SO_SNDBUF, "wmem_max"), (socket.SO_RCVBUF, "rmem_max")):
        # A fixed size turns Linux's autotuning off: only worth it when the cap allows it.
        if local:
            sock.setsockopt(socket.SOL_SOCKET, option, LOCAL_SOCKET_BUFFER)
        elif _kernel_limit(limit_file) >= _SOCKET_BUFFER:
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):  # dead hosts (no FIN ever comes) show up within ~25 s idle
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def same_host(sock: socket.socket) -> bool:
    """Whether the connected ``sock`` leads to this host (loopback, or our own address)."""
    try:
        ours, theirs = sock.getsockname()[0], sock.getpeername()[0]
        return ours == theirs or ipaddress.ip_address(theirs.split("%")[0]).is_loopback
    except (OSError, ValueError):
        return False


def _kernel_limit(name: str) -> int:
    try:
        with open(f"/proc/sys/net/core/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def listen(host: str, world_size: int) -> socket.socket:
    """A listening socket on an ephemeral port of ``host`` (any address if it is not ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        try:
            sock.bind((host, 0))
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                raise
            sock.bind(("::" if family == socket.AF_INET6 else "", 0))
        sock.listen(max(_BACKLOG, world_size))
    except OSError as e:
        sock.close()
        raise RendezvousError(f"cannot listen on {host}: {e}", op="tcp.listen") from None
    return sock
