"""Property tests of every decoder that reads bytes from the network.

Arbitrary input may only raise the documented errors, and no decoder may ask for more bytes
than the protocol's caps allow before validating them.
"""
import io
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.errors import AuthenticationError
from neural_arch.distributed.rendezvous.auth import server_handshake
from neural_arch.distributed.rendezvous.store import (ADD, CHECK, DELETE, GET, MAX_KEY_BYTES, SET,
                                                      WAIT, FrameError, Request, decode_keys,
                                                      encode_keys, encode_request, read_request)
from neural_arch.distributed.transports.base import (HEADER_SIZE, Fingerprint, pack_header,
                                                     unpack_header)

pytestmark = pytest.mark.timeout(120)
MAX_VALUE = 1 << 16


class _Reader:
    """read_exact over a byte string that records the largest request."""

    def __init__(self, data: bytes) -> None:
        self.stream, self.largest = io.BytesIO(data), 0

    def __call__(self, n: int) -> bytes:
        self.largest = max(self.largest, n)
        chunk = self.stream.read(n)
        if len(chunk) != n:
            raise EOFError(f"wanted {n} bytes, got {len(chunk)}")
        return chunk


def _frame_like():
    """Mostly well-formed headers with hostile lengths, plus raw noise."""
    header = st.builds(lambda op, klen, vlen, t: struct.pack("<BIQd", op, klen, vlen, t),
                       st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                       st.floats(allow_nan=True, allow_infinity=True))
    return st.one_of(st.binary(max_size=200),
                     st.tuples(header, st.binary(max_size=300)).map(lambda t: t[0] + t[1]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_frame_like())
def test_read_request_only_raises_documented_errors(data):
    reader = _Reader(data)
    try:
        req = read_request(reader, MAX_VALUE)
    except (FrameError, EOFError):
        pass
    else:
        assert req.op in (SET, GET, ADD, CHECK, DELETE, WAIT)
        assert len(req.key) <= MAX_KEY_BYTES and len(req.value) <= MAX_VALUE
        assert 0.0 <= req.timeout
    assert reader.largest <= max(MAX_VALUE, MAX_KEY_BYTES, 21)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([SET, GET, DELETE]), st.binary(min_size=1, max_size=MAX_KEY_BYTES),
       st.binary(max_size=2000), st.floats(0, 1e6))
def test_request_round_trip(op, key, value, timeout):
    assert read_request(_Reader(encode_request(op, key, value, timeout)), MAX_VALUE) == \
        Request(op, key, value, timeout)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_key_list_round_trip(keys):
    blob = encode_keys(keys)
    assert decode_keys(blob) == keys
    assert read_request(_Reader(encode_request(WAIT, b"", blob, 1.0)), MAX_VALUE).value == blob


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=400))
def test_decode_keys_on_noise(blob):
    try:
        keys = decode_keys(blob)
    except FrameError:
        return
    assert sum(4 + len(k) for k in keys) == len(blob)  # a full, exact parse
    assert all(len(k) <= MAX_KEY_BYTES for k in keys)


@settings(max_examples=600, deadline=None)
@given(st.binary(min_size=0, max_size=2 * HEADER_SIZE))
def test_message_header_decoder_on_noise(raw):
    try:
        fp, nbytes = unpack_header(raw)
    except ValueError:
        return
    assert len(raw) == HEADER_SIZE and raw[:4] == b"NFv1"
    assert isinstance(fp, Fingerprint) and nbytes >= 0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=24).filter(lambda s: len(s.encode()) <= 24 and "\0" not in s),
       st.integers(0, 2**63), st.sampled_from(["float32", "int64", "float16"]),
       st.integers(0, 2**63), st.integers(0, 2**32 - 1), st.integers(0, 2**63))
def test_message_header_round_trip(op, seq, dtype, count, group, nbytes):
    fp = Fingerprint(op, seq, dtype, count, group)
    assert unpack_header(pack_header(fp, nbytes)) == (fp, nbytes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=120),
                 st.binary(max_size=80).map(lambda b: b"NFa1" + b)))
def test_server_handshake_on_noise(data):
    server, client = socket.socketpair()
    result = {}

    def serve():
        try:
            result["info"] = server_handshake(server, b"secret", 2.0)
        except Exception as e:
            result["error"] = e

    t = threading.Thread(target=serve)
    t.start()
    try:
        client.sendall(data)
        client.shutdown(socket.SHUT_WR)  # the stranger says no more
        t.join(10)
    finally:
        server.close()
        client.close()
    assert isinstance(result.get("error"), AuthenticationError), result
