"""A fake ``mpi4py.MPI`` for the MPI transport's failure tests: a two-rank communicator (rank 0
of this process) whose calls fail where a test says, without mpiexec."""
from types import SimpleNamespace

import numpy as np

from neural_arch.distributed.transports import mpi_chained, mpi_wire
from neural_arch.distributed.transports.base import Fingerprint, pack_header

FP = Fingerprint("all_reduce", 7, "float32", 4)  # the fingerprint of every chained peer's plan


class FakeMpiError(Exception):
    pass


class Request:
    def __init__(self, fail: bool, done: bool = False, buf=None):
        self.fail, self.done, self.cancelled, self.buf = fail, done, False, buf

    def Test(self, status=None):
        if self.fail:
            raise FakeMpiError("MPI_ERR_PROC_FAILED: process failure")
        return self.done

    def Cancel(self):
        self.cancelled = True


class Group:
    def __init__(self, ranks):
        self.ranks = ranks

    def Get_size(self):
        return len(self.ranks)

    def Free(self):
        pass


class Comm:
    """Two-rank communicator whose receives fail at ``fail_at`` ("Irecv" or "Test"), or never
    complete (None); collectives complete at once. "Isend": every send after the first fails at
    its post, "Ibarrier", "Iallgather", "Ibcast" and "Iprobe" those calls."""

    def __init__(self, world_size=2, fail_at=None):
        self.world_size, self.fail_at, self.posted = world_size, fail_at, []

    def _fail(self, call):
        if self.fail_at == call:
            raise FakeMpiError("MPI_ERR_PROC_FAILED: process failure")

    def Get_rank(self):
        return 0

    def Get_size(self):
        return self.world_size

    def Dup(self):
        return self

    def Iallgather(self, mine, table):
        self._fail("Iallgather")
        table[:] = mine  # every rank on this host, with this pid: alive
        return Request(False, done=True)

    def Ibcast(self, buf, root):
        self._fail("Ibcast")
        return Request(False, done=True)

    def Ibarrier(self):
        self._fail("Ibarrier")
        return Request(False, done=True)

    def Iprobe(self, *args):
        self._fail("Iprobe")
        return False  # no notices

    def Irecv(self, buf, src, tag):
        self._fail("Irecv")
        self.posted.append(Request(self.fail_at == "Test", buf=buf[0]))
        return self.posted[-1]

    def Isend(self, buf, dst, tag):
        if any(req.buf is None for req in self.posted):
            self._fail("Isend")
        self.posted.append(Request(False, done=True))
        return self.posted[-1]

    def Get_failed(self):
        return Group([1])

    def Get_group(self):
        return Group([0, 1])


def module():
    """The fake ``mpi4py.MPI`` module."""
    return SimpleNamespace(
        Exception=FakeMpiError, BYTE="byte", ANY_SOURCE=-1, Is_finalized=lambda: False,
        Status=Status,
        Request=SimpleNamespace(Testall=lambda reqs: all(r.Test() for r in reqs),
                                Testsome=lambda reqs: [i for i, r in enumerate(reqs) if r.Test()]),
        buffer=SimpleNamespace(frombuffer=lambda view, readonly: SimpleNamespace(
            address=np.frombuffer(view, np.uint8).ctypes.data)),
        Group=SimpleNamespace(Translate_ranks=lambda group, ranks, mine: group.ranks))


class Status:
    """A status: size 0 until an ``Arrived`` receive's Test sets it (``ChainedPeer``)."""
    count = 0

    def Get_count(self, kind):
        return self.count


class Arrived:
    """A receive whose message is in: its Test fills the status with the message's size."""

    def __init__(self, count):
        self.count, self.cancelled, self.buf = count, False, "receive"

    def Test(self, status=None):
        if status is not None:
            status.count = self.count
        return True

    def Cancel(self):
        self.cancelled = True


class ChainedPeer(Comm):
    """A peer that runs the same chained call: its plan, and each piece expected, arrive as
    soon as the receive is posted."""

    def Irecv(self, buf, src, tag):
        view, count = buf[0], len(buf[0])  # a chained piece fills its receive
        if tag == mpi_wire.TAG:
            plan = pack_header(FP, len(mpi_chained.PLAN_MARK)) + mpi_chained.PLAN_MARK
            view[:len(plan)], count = plan, len(plan)
        self.posted.append(Arrived(count))
        return self.posted[-1]
