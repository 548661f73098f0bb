"""``ProcessGroup.fingerprint`` and the short entries of ``group.short_calls`` build their
``Fingerprint`` with ``tuple.__new__`` and positional values (a call of a named constructor
costs a measurable share of a fingerprint), which neither checks their number nor names them: a
field added to ``Fingerprint`` (or two reordered) must show here, not as a short tuple or
swapped values on the wire."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed import algorithms
from neural_arch.distributed.group import world as pgm
from neural_arch.distributed.group.short_calls import ShortCalls
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.work import CommQueue

pytestmark = pytest.mark.timeout(30)


def _group() -> pgm.ProcessGroup:
    """Group 3 of global ranks 0 and 2, seen from rank 2; no transport (nothing is sent)."""
    return pgm.ProcessGroup(3, [0, 2], 2, None, CommQueue(2, 1.0), "tcp", 1.0, True)


def _fields(built: tuple) -> dict:
    assert len(built) == len(Fingerprint._fields), (
        f"{len(built)} values built for the fields {Fingerprint._fields}: {built!r}")
    return {name: getattr(built, name) for name in Fingerprint._fields}


def test_a_collectives_fingerprint_holds_every_field_by_name():
    built = _group().fingerprint("all_reduce:sum", np.float32, 10)
    expected = Fingerprint(op="all_reduce:sum", seq=1, dtype="float32", count=10, group=3)
    assert _fields(built) == expected._asdict()


def test_a_short_entrys_fingerprint_holds_every_field_by_name(monkeypatch):
    """Each entry hands its algorithm the fingerprint the general path would make for the
    same call (the algorithms are replaced by ones that keep it)."""
    made = []
    monkeypatch.setattr(algorithms, "all_reduce_plan",
                        lambda t, dtype, nbytes, op: lambda buf, fp: made.append(fp))
    monkeypatch.setattr(algorithms, "broadcast_plan",
                        lambda t, dtype, count, root: lambda buf, fp: made.append(fp))
    monkeypatch.setattr(algorithms, "barrier", lambda t, fp: made.append(fp))
    group = _group()
    short = ShortCalls(group)
    x = np.zeros((2, 5), np.float32)
    assert short.all_reduce_entry(x, ReduceOp.MAX, "max")(x) is True
    assert short.broadcast_entry(x, 1)(x) is True
    assert short.barrier_entry()() is True
    assert [_fields(fp) for fp in made] == [
        Fingerprint(op="all_reduce:max", seq=1, dtype="float32", count=10, group=3)._asdict(),
        Fingerprint(op="broadcast:1", seq=2, dtype="float32", count=10, group=3)._asdict(),
        Fingerprint(op="barrier", seq=3, dtype="uint8", count=0, group=3)._asdict()]
    # and the general path's fingerprints of the same calls, numbered next
    assert [_fields(group.fingerprint(fp.op, np.dtype(fp.dtype), fp.count))
            for fp in made] == [{**_fields(fp), "seq": fp.seq + 3} for fp in made]
