"""Building the TCP transport's authenticated full mesh through the store.

Every rank listens on an ephemeral port and publishes ``host:port`` in the store; each rank dials
every lower rank and accepts every higher one, so nobody waits on a rank that waits on it. The
dialling rank's id travels inside the authenticated handshake.

Accepted connections are authenticated concurrently, each on its own short-lived daemon thread:
a stranger that connects and stays silent delays only itself, never the peers queued behind it.
When set-up ends, by success or error, every handshake still in flight is cut off and joined.
"""
from __future__ import annotations

import errno
import socket
import struct
import threading
import time
from typing import Optional

from ..rendezvous.auth import client_handshake, job_secret, server_handshake
from ..errors import AuthenticationError, RendezvousError

HELLO = struct.Struct("<II")  # dialling rank, its world size; then the key prefix
HANDSHAKE_LIMIT_S = 30.0  # the longest any one accepted connection may take to authenticate
MAX_CONCURRENT_HANDSHAKES = 64  # beyond this, new connections wait in the listen backlog
_ACCEPT_SLICE_S = 0.05  # how often the accept loop looks at handshakes that finished
_SOCKET_BUFFER = 4 << 20


def address_key(prefix: str, rank: int) -> str:
    """The store key under which ``rank`` publishes its listening ``host:port``."""
    return f"{prefix}/addr/{rank}"


def build_mesh(rank: int, world_size: int, store, timeout: float, secret: Optional[bytes] = None,
               host: Optional[str] = None, prefix: str = "tcp") -> dict[int, socket.socket]:
    """Connect to every other rank within ``timeout`` seconds; returns one tuned, non-blocking,
    authenticated socket per peer rank."""
    deadline = time.monotonic() + timeout
    secret = job_secret() if secret is None else bytes(secret)
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
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousError(f"could not connect to {address} within {timeout} s",
                                  rank=rank, peer=peer, op="tcp.connect")
        try:
            sock = socket.create_connection((host, int(port)), timeout=remaining)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.EAGAIN, errno.ETIMEDOUT):
                raise RendezvousError(f"could not connect to {address}: {e}", rank=rank,
                                      peer=peer, op="tcp.connect") from None
            time.sleep(0.05)
            continue
        try:
            client_handshake(sock, secret, remaining, client_info=hello)
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
    """Accept until every higher rank is in ``socks``; the loop itself never reads a byte."""
    missing = set(range(rank + 1, world_size))
    rejected = ""
    handshakes = _Handshakes(secret)
    try:
        while True:
            # One at a time: whatever is left unclaimed when we raise, close() disposes of.
            while (finished := handshakes.take_one()) is not None:
                conn, addr, info, error = finished
                if error is None:
                    peer = _admit(conn, addr, info, rank, world_size, prefix, missing)
                    socks[peer] = conn
                    missing.discard(peer)
                elif isinstance(error, (AuthenticationError, OSError)):
                    # a stranger, or a peer that vanished mid-handshake: keep waiting
                    rejected = f" (last rejected connection: {error})"
                else:
                    raise error
            if not missing:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RendezvousError(f"ranks {sorted(missing)} did not connect within "
                                      f"{timeout} s{rejected}", rank=rank, op="tcp.accept")
            if handshakes.count >= MAX_CONCURRENT_HANDSHAKES:
                handshakes.wait(min(remaining, _ACCEPT_SLICE_S))
                continue
            # With nothing in flight, only a new connection can change anything.
            listener.settimeout(min(remaining, _ACCEPT_SLICE_S) if handshakes.count else remaining)
            try:
                conn, addr = listener.accept()
            except OSError:  # timed out (looked at above) or interrupted
                continue
            handshakes.start(conn, addr, min(remaining, HANDSHAKE_LIMIT_S))
    finally:
        handshakes.close()


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


class _Handshakes:
    """Server handshakes in flight, one daemon thread each. A finished handshake is handed over
    as ``(conn, addr, info, None)``, or as ``(None, addr, None, error)`` with the connection
    already closed. After ``close`` nothing is handed over and every connection is closed."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._changed = threading.Condition()
        self._running: dict[socket.socket, threading.Thread] = {}
        self._finished: list[tuple] = []
        self._closed = False

    @property
    def count(self) -> int:
        with self._changed:
            return len(self._running)

    def start(self, conn: socket.socket, addr, timeout: float) -> None:
        thread = threading.Thread(target=self._authenticate, args=(conn, addr, timeout),
                                  name=f"tcp-handshake-{addr}", daemon=True)
        with self._changed:
            self._running[conn] = thread
        try:
            thread.start()
        except BaseException:
            with self._changed:
                del self._running[conn]
            conn.close()
            raise

    def _authenticate(self, conn: socket.socket, addr, timeout: float) -> None:
        info, error = None, None
        try:
            info = server_handshake(conn, self._secret, timeout)
        except Exception as e:  # handed to the accept loop, which decides
            error = e
        with self._changed:
            del self._running[conn]
            keep = error is None and not self._closed
            if not self._closed:
                self._finished.append((conn, addr, info, None) if keep else
                                      (None, addr, None, error))
            self._changed.notify_all()
        if not keep:
            conn.close()

    def wait(self, timeout: float) -> None:
        """Sleep until a handshake finishes or ``timeout`` passes."""
        with self._changed:
            if not self._finished:
                self._changed.wait(timeout)

    def take_one(self) -> Optional[tuple]:
        with self._changed:
            return self._finished.pop(0) if self._finished else None

    def close(self) -> None:
        """Cut off every handshake in flight and wait for its thread (each is bounded by its
        own handshake timeout even if the cut-off were ignored)."""
        with self._changed:
            self._closed = True
            running = list(self._running.items())
            for conn, _ in running:
                # Shutdown wakes a thread blocked in recv; closing is left to that thread, so
                # the descriptor cannot be reused while it still reads from it.
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            unclaimed, self._finished = self._finished, []
        for conn, *_ in unclaimed:
            if conn is not None:
                conn.close()
        for _, thread in running:
            thread.join(HANDSHAKE_LIMIT_S)


def tune(sock: socket.socket) -> None:
    """Low latency, large buffers where the kernel allows them, and keep-alive probes."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option, limit_file in ((socket.SO_SNDBUF, "wmem_max"), (socket.SO_RCVBUF, "rmem_max")):
        # A fixed size turns Linux's autotuning off: only worth it when the cap allows it.
        if _kernel_limit(limit_file) >= _SOCKET_BUFFER:
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):  # dead hosts (no FIN ever comes) show up within ~25 s idle
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


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
        sock.listen(max(128, world_size))
    except OSError as e:
        sock.close()
        raise RendezvousError(f"cannot listen on {host}: {e}", op="tcp.listen") from None
    return sock
