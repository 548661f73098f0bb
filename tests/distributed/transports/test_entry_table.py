"""The C table of the public calls' short path (``transports/_entry_table.c``) on its own, in
one process, with Python stand-ins for the kernel, the queue and the lock: what it serves,
what it declines untouched, the order of its calls, the lock released on every way out, and
what it keeps alive. Its use on shared memory is tested in ``test_short_calls_in_c.py``."""
from __future__ import annotations

import gc
import importlib
import pickle
import sys
import types
import weakref

import numpy as np
import pytest

from neural_arch.distributed import ReduceOp
from neural_arch.distributed.transports import entry_table

pytestmark = pytest.mark.timeout(30)
if entry_table.Table is None:  # pragma: no cover - a machine without a C compiler
    pytest.skip("the C extension _entry_table was not built (no C compiler at install)",
                allow_module_level=True)


class Stage:
    """A table's group: records every call the table makes, in order."""

    def __init__(self, status=0, op="all_reduce"):
        self.calls, self.status, self.seq = [], status, 0
        self.spin_polls = 4000
        self.table = entry_table.Table(np.ndarray, op, self.next_seq, self.drain,
                                       self.acquire, self.release, self, entry_table.OPS[op])
        self.held = False

    def next_seq(self):
        self.seq += 1
        self.calls.append(("seq", self.seq))
        return self.seq

    def drain(self, op, seq):
        self.calls.append(("drain", op, seq))

    def acquire(self):
        assert not self.held
        self.held = True
        self.calls.append(("acquire",))
        return True

    def release(self):
        assert self.held
        self.held = False
        self.calls.append(("release",))

    def kernel(self, tensor, address, seq, polls):
        assert self.held
        self.calls.append(("kernel", tensor.ctypes.data, address, seq, polls))
        tensor += 1
        return self.status

    def finish(self, status, tensor, seq):
        assert self.held
        self.calls.append(("finish", status, tensor.ctypes.data, seq))

    def add(self, dtype=np.float32, count=3, how=ReduceOp.SUM, keep=None):
        return self.table.add(np.dtype(dtype), count, how, self.kernel, 12345, self.finish,
                              keep if keep is not None else object())


def test_a_served_call_makes_the_python_entrys_calls_in_its_order():
    stage = Stage()
    assert stage.add() is True and stage.table.used == 1
    x = np.zeros(3, np.float32)
    assert stage.table.run(x, ReduceOp.SUM) is True
    assert stage.table.run(x, ReduceOp.SUM) is True
    address = x.ctypes.data
    assert stage.calls == [("seq", 1), ("drain", "all_reduce", 1), ("acquire",),
                           ("kernel", address, 12345, 1, 4000), ("release",),
                           ("seq", 2), ("drain", "all_reduce", 2), ("acquire",),
                           ("kernel", address, 12345, 2, 4000), ("release",)]
    assert x.tolist() == [2.0, 2.0, 2.0]


def test_a_status_goes_to_finish_with_the_tensor_and_its_seq():
    stage = Stage(status=2)
    stage.add()
    x = np.zeros(3, np.float32)
    stage.spin_polls = 17  # read at every call
    assert stage.table.run(x, ReduceOp.SUM) is True
    assert stage.calls[3:] == [("kernel", x.ctypes.data, 12345, 1, 17),
                               ("finish", 2, x.ctypes.data, 1), ("release",)]


@pytest.mark.parametrize("case", ["list", "2-D strided", "0-D", "strided", "read-only",
                                  "unaligned", "subclass", "dtype", "byte order", "count", "op",
                                  "bool root"])
def test_what_it_does_not_serve_is_declined_untouched(case):
    stage = Stage()
    stage.add(how=ReduceOp.SUM)
    stage.add(count=6, how=1)
    x, how = np.zeros(3, np.float32), ReduceOp.SUM
    if case == "list":
        x = [0.0, 0.0, 0.0]
    elif case == "2-D strided":  # three elements, not C-contiguous
        x = np.zeros((3, 2), np.float32)[:, :1]
        assert x.size == 3 and not x.flags.c_contiguous
    elif case == "0-D":  # one element: no entry of that count
        x = np.zeros((), np.float32)
    elif case == "strided":
        x = np.zeros(6, np.float32)[::2]
    elif case == "read-only":
        x.flags.writeable = False
    elif case == "unaligned":
        x = np.zeros(13, np.uint8)[1:].view(np.float32)
        assert x.flags.c_contiguous and not x.flags.aligned
    elif case == "subclass":
        x = x.view(type("Sub", (np.ndarray,), {}))
    elif case == "dtype":
        x = np.zeros(3, np.float64)
    elif case == "byte order":
        x = np.zeros(3, np.dtype(np.float32).newbyteorder())
    elif case == "count":
        x = np.zeros(4, np.float32)
    elif case == "op":
        how = ReduceOp.MAX
    else:
        x, how = np.zeros(6, np.float32), True  # a bool is not the root 1
    before = np.array(x, copy=True)
    assert stage.table.run(x, how) is False
    assert stage.calls == [] and stage.seq == 0
    np.testing.assert_array_equal(np.asarray(x), before)


@pytest.mark.parametrize("shape", [(1, 3), (3, 1, 1), (), (1,)])
def test_an_array_of_any_shape_runs_on_a_vector_view_of_its_memory(shape):
    """Found by element count, as the Python tables key it; the kernel and finish get a 1-D
    view of the same memory (the kernels were compiled for vectors), so the array changes."""
    stage = Stage(status=2)
    seen = []

    def kernel(tensor, address, seq, polls):
        seen.append((tensor.shape, tensor.base is not None or tensor is x))
        tensor += 1
        return 2

    def finish(status, tensor, seq):
        seen.append((tensor.shape, tensor.ctypes.data))
    count = int(np.prod(shape))
    stage.table.add(np.dtype(np.float32), count, ReduceOp.SUM, kernel, 1, finish, None)
    x = np.zeros(shape, np.float32)
    assert stage.table.run(x, ReduceOp.SUM) is True
    assert x.shape == shape and np.all(x == 1)
    assert seen == [((count,), True), ((count,), x.ctypes.data)]


def test_a_barrier_runs_its_one_entry_without_a_tensor():
    stage = Stage(op="barrier")
    assert stage.table.run_alone() is False and stage.calls == []
    statuses = iter([0, 2])

    def kernel(address, seq, polls):
        assert stage.held
        stage.calls.append(("kernel", address, seq, polls))
        return next(statuses)

    def finish(status, seq):
        stage.calls.append(("finish", status, seq))
    stage.table.add(None, 0, None, kernel, 7, finish, None)
    assert stage.table.run_alone() is True and stage.table.run_alone() is True
    assert stage.calls == [("seq", 1), ("drain", "barrier", 1), ("acquire",),
                           ("kernel", 7, 1, 4000), ("release",),
                           ("seq", 2), ("drain", "barrier", 2), ("acquire",),
                           ("kernel", 7, 2, 4000), ("finish", 2, 2), ("release",)]


def test_a_pair_runs_on_its_input_and_output_and_declines_what_does_not_fit():
    stage = Stage(status=2, op="all_gather_into_tensor")
    calls = stage.calls

    def kernel(src, out, address, seq, polls):
        calls.append(("kernel", src.ctypes.data, out.ctypes.data, address, seq, polls))
        out[:] = np.tile(src, 2)
        return 2

    def finish(status, src, out, seq):
        calls.append(("finish", status, src.ctypes.data, out.ctypes.data, seq))
    stage.table.add(np.dtype(np.float32), 3, 6, kernel, 5, finish, None)
    src, out = np.arange(3, dtype=np.float32), np.zeros(6, np.float32)
    for bad in [(src, np.zeros(7, np.float32)), (src, np.zeros(6, np.float64)),
                (np.zeros(4, np.float32), np.zeros(6, np.float32)),
                (src, np.zeros((6, 2), np.float32)[:, :1]), (src.tolist(), out),
                (src, np.zeros(12, np.float32)[::2])]:
        assert stage.table.run_pair(*bad) is False
    frozen, frozen_out = src.copy(), out.copy()
    frozen.flags.writeable = frozen_out.flags.writeable = False
    assert stage.table.run_pair(frozen, out) is False and calls == []
    assert stage.table.run_pair(src, frozen_out) is False and calls == []
    unpickled = pickle.loads(pickle.dumps(src))  # an equal dtype, another object
    assert unpickled.dtype == src.dtype and unpickled.dtype is not src.dtype
    assert stage.table.run_pair(unpickled, out) is False and calls == []
    assert stage.table.run_pair(src, out) is True
    assert out.tolist() == [0, 1, 2, 0, 1, 2]
    assert calls == [("seq", 1), ("drain", "all_gather_into_tensor", 1), ("acquire",),
                     ("kernel", src.ctypes.data, out.ctypes.data, 5, 1, 4000),
                     ("finish", 2, src.ctypes.data, out.ctypes.data, 1), ("release",)]
    with pytest.raises(TypeError, match="2 arguments"):
        stage.table.run_pair(src)
    # arrays of other shapes by their element counts, on 1-D views (torch's stacked output)
    stacked, calls[:] = np.zeros((2, 3), np.float32), []
    assert stage.table.run_pair(src.reshape(1, 3), stacked) is True
    assert stacked.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert calls[3] == ("kernel", src.ctypes.data, stacked.ctypes.data, 5, 2, 4000)


def test_the_finisher_hands_an_entrys_finish_its_arguments():
    seen = []
    settle = entry_table.finisher(lambda status, args, seq: seen.append((status, args, seq)))
    x = np.zeros(2)
    settle(4, x, 9), settle(2, 10), settle(1, x, x, 11)
    assert seen[0][0] == 4 and seen[0][1][0] is x and len(seen[0][1]) == 1 and seen[0][2] == 9
    assert seen[1] == (2, (), 10)
    assert seen[2][0] == 1 and seen[2][1] == (x, x) and seen[2][2] == 11


def test_roots_match_by_value_and_ops_by_identity():
    stage = Stage(op="broadcast")
    big = int("1000")  # not a cached small int
    stage.add(how=big)
    assert stage.table.run(np.zeros(3, np.float32), int("1000")) is True
    assert stage.table.run(np.zeros(3, np.float32), 1000.0) is False


@pytest.mark.parametrize("where", ["kernel", "finish", "drain", "next_seq"])
def test_an_error_propagates_and_the_lock_is_released(where):
    stage = Stage(status=4)

    def boom(*args):
        raise RuntimeError(f"boom in {where}")
    setattr(stage, where, boom)
    stage.table = entry_table.Table(np.ndarray, "all_reduce", stage.next_seq, stage.drain,
                                    stage.acquire, stage.release, stage)
    stage.add()
    with pytest.raises(RuntimeError, match=f"boom in {where}"):
        stage.table.run(np.zeros(3, np.float32), ReduceOp.SUM)
    assert not stage.held
    acquired = ("acquire",) in stage.calls
    assert acquired == (where in ("kernel", "finish"))
    assert (("release",) in stage.calls) == acquired


def test_the_first_error_wins_over_a_failing_release():
    stage = Stage()

    def kernel(*args):
        raise KeyError("kernel")

    def release():
        stage.held = False
        raise OSError("release")
    stage.table = entry_table.Table(np.ndarray, "all_reduce", stage.next_seq, stage.drain,
                                    stage.acquire, release, stage)
    stage.table.add(np.dtype(np.float32), 3, ReduceOp.SUM, kernel, 1, stage.finish, None)
    with pytest.raises(KeyError, match="kernel"):
        stage.table.run(np.zeros(3, np.float32), ReduceOp.SUM)
    with pytest.raises(OSError, match="release"):  # alone, its own error is raised
        stage.table.add(np.dtype(np.float64), 3, ReduceOp.SUM, lambda *a: 0, 1,
                        stage.finish, None)
        stage.table.run(np.zeros(3, np.float64), ReduceOp.SUM)


def test_a_status_that_is_no_int_raises():
    stage = Stage(status="2")
    stage.add()
    with pytest.raises(TypeError):
        stage.table.run(np.zeros(3, np.float32), ReduceOp.SUM)
    assert not stage.held


def test_capacity_clear_and_what_the_entries_keep_alive():
    stage = Stage()

    class Kept:
        pass
    kept = Kept()
    ref = weakref.ref(kept)
    assert stage.add(keep=kept)
    del kept
    gc.collect()
    assert ref() is not None  # the plan words a kernel's address points into
    assert all(stage.add(count=n) for n in range(4, 67))
    assert stage.table.used == 64
    assert stage.add(count=99) is True and stage.table.used == 1  # full: started afresh
    gc.collect()
    assert ref() is None
    assert stage.table.run(np.zeros(3, np.float32), ReduceOp.SUM) is False
    assert stage.table.run(np.zeros(99, np.float32), ReduceOp.SUM) is True
    stage.table.clear()
    assert stage.table.used == 0
    assert stage.table.run(np.zeros(99, np.float32), ReduceOp.SUM) is False


def test_a_table_runs_only_entries_of_its_kind_of_kernel():
    """A call of another kind (a pair on a table of one-array kernels) raises before it takes a
    sequence number, as a kernel called with the wrong arguments would only after."""
    for op, wrong in [("all_reduce", lambda t: t.run_pair(np.zeros(3, np.float32),
                                                          np.zeros(3, np.float32))),
                      ("all_gather_into_tensor", lambda t: t.run(np.zeros(3, np.float32), 6)),
                      ("broadcast", lambda t: t.run_alone())]:
        stage = Stage(op=op)
        stage.add(how=6)
        with pytest.raises(TypeError, match="this table's kernels take"):
            wrong(stage.table)
        assert stage.calls == [] and not stage.held
    with pytest.raises(ValueError, match="0, 1 or 2, not 3"):
        entry_table.Table(np.ndarray, "x", stage.next_seq, stage.drain, stage.acquire,
                          stage.release, stage, 3)


def test_bad_arguments_are_refused_with_their_values():
    stage = Stage()
    with pytest.raises(TypeError, match="numpy.ndarray, not list"):
        entry_table.Table(list, "all_reduce", stage.next_seq, stage.drain, stage.acquire,
                          stage.release, stage)
    with pytest.raises(RuntimeError, match="already initialised"):
        stage.table.__init__(np.ndarray, "all_reduce", stage.next_seq, stage.drain,
                             stage.acquire, stage.release, stage)
    with pytest.raises(TypeError, match="callable"):
        entry_table.Table(np.ndarray, "all_reduce", 1, stage.drain, stage.acquire,
                          stage.release, stage)
    with pytest.raises(ValueError, match="-1"):
        stage.table.add(np.dtype(np.float32), -1, ReduceOp.SUM, stage.kernel, 1,
                        stage.finish, None)
    with pytest.raises(TypeError):
        stage.table.add(np.dtype(np.float32), 3, ReduceOp.SUM, stage.kernel, "address",
                        stage.finish, None)
    with pytest.raises(TypeError, match="2 arguments"):
        stage.table.run(np.zeros(3, np.float32))


def test_an_unready_table_declines():
    table = entry_table.Table.__new__(entry_table.Table)
    assert table.run(np.zeros(3, np.float32), ReduceOp.SUM) is False


def test_the_switch(monkeypatch):
    monkeypatch.setenv(entry_table.ENV_SWITCH, "0")
    assert entry_table.enabled() is False
    monkeypatch.setenv(entry_table.ENV_SWITCH, "1")
    assert entry_table.enabled() is True
    monkeypatch.setenv(entry_table.ENV_SWITCH, "yes")
    with pytest.raises(ValueError, match="NEURAL_ARCH_SHORT_C='yes'"):
        entry_table.enabled()


def test_a_build_from_other_sources_is_not_used(monkeypatch):
    """An in-place build left from older sources (no API_VERSION, or another) warns and the
    Python entries serve."""
    name = "neural_arch.distributed.transports._entry_table"
    stale = types.ModuleType(name)
    stale.Table, stale.__file__ = entry_table.Table, "stale.so"
    monkeypatch.setitem(sys.modules, name, stale)
    monkeypatch.setattr(sys.modules["neural_arch.distributed.transports"], "_entry_table", stale)
    try:
        with pytest.warns(RuntimeWarning,
                          match=f"API_VERSION None, expected {entry_table.API_VERSION}"):
            importlib.reload(entry_table)
        assert entry_table.Table is None and entry_table.enabled() is False
    finally:
        monkeypatch.undo()
        importlib.reload(entry_table)
    assert entry_table.Table is not None


def test_the_all_gathers_finish_gets_its_arrays_as_bytes():
    """The all-gather's settling kernel takes bytes (``compiled.all_gather``): the finish its C
    entry is given hands it byte views of the typed arrays the table passes."""
    from neural_arch.distributed.transports.shm.two_array_calls import _as_bytes
    seen = []
    settle = entry_table.finisher(_as_bytes(lambda status, arrays, seq: seen.append(arrays)))
    src, out = np.arange(3, dtype=np.float64), np.zeros(6, np.float64)
    settle(2, src, out, 5)
    (sent, got), = seen
    assert sent.dtype == got.dtype == np.uint8 and sent.size == 24 and got.size == 48
    assert np.shares_memory(sent, src) and np.shares_memory(got, out)
