"""Process-group pieces that need no second process: backend choice, groups, trust."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import distributed as dist
from neural_arch.distributed.algorithms import ring
from neural_arch.distributed.group import backend_choice
from neural_arch.distributed.group import world as pgm
from neural_arch.distributed.processes import host_identity
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.rendezvous.env import RendezvousInfo
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.work import CommQueue
from threaded_transport import Fabric, run_threads

pytestmark = pytest.mark.timeout(30)


class DictStore:
    def __init__(self, preset=None):
        self.data = dict(preset or {})

    def set(self, key, value):
        self.data[key] = bytes(value)

    def get(self, key):
        return self.data[key]


def info(rank, world_size):
    return RendezvousInfo(rank, world_size, rank, world_size, "127.0.0.1", 1, "explicit")


def test_backend_choice_compares_host_identities():
    same = DictStore({f"{backend_choice._HOST_KEY}/1": host_identity("ipc").encode()})
    assert backend_choice.choose_on_one_host(info(0, 2), same) == "shm"
    other = DictStore({f"{backend_choice._HOST_KEY}/1": b"elsewhere|boot-2"})
    assert backend_choice.choose_on_one_host(info(0, 2), other) == "tcp"
    # a non-zero rank reads rank 0's decision
    decided = DictStore({f"{backend_choice._HOST_KEY}/choice": b"tcp"})
    assert backend_choice.choose_on_one_host(info(1, 2), decided) == "tcp"


def test_unknown_backend_lists_the_choices():
    with pytest.raises(ValueError) as exc:
        backend_choice.normalize_backend("carrier-pigeon")
    assert "carrier-pigeon" in str(exc.value) and "tcp" in str(exc.value)
    assert backend_choice.normalize_backend("GLOO") == "auto"


def test_queries_before_init(monkeypatch):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        dist.get_rank()
    state = dist.get_distributed_info()
    assert state["initialized"] is False and state["backend"] is None
    dist.destroy_process_group()  # harmless when nothing is initialized


def test_group_transport_translates_ranks():
    members = [1, 3]

    def body(t):
        if t.rank not in members:
            return None
        view = pgm.GroupTransport(t, members, members.index(t.rank))
        buf = np.full(5, float(t.rank))
        ring.all_reduce(view, buf, ReduceOp.SUM, Fingerprint("all_reduce:sum", 1, "float64", 5, 7))
        return buf

    results = run_threads(4, body)
    assert results[0] is None and results[2] is None
    for rank in members:
        np.testing.assert_array_equal(results[rank], np.full(5, 4.0))


def test_fingerprints_number_collectives_and_peers_separately():
    group = pgm.ProcessGroup(3, [0, 2], 2, Fabric(2).transports()[1], CommQueue(2, 1.0), "tcp",
                             1.0, True)
    first = group.fingerprint("all_reduce:sum", np.float32, 10)
    assert first == Fingerprint("all_reduce:sum", 1, "float32", 10, 3)
    assert group.p2p_fingerprint("send", 0, "p2p:0", np.int64, 4).seq == 1
    assert group.p2p_fingerprint("send", 0, "p2p:0", np.int64, 4).seq == 2
    assert group.p2p_fingerprint("recv", 0, "p2p:0", np.int64, 4).seq == 1
    assert group.fingerprint("barrier", np.uint8, 0).seq == 2
    assert group.group_rank_of(2, "src") == 1
    with pytest.raises(ValueError, match=r"src=1 is not in group 3 \(ranks \[0, 2\]\)"):
        group.group_rank_of(1, "src")
    with pytest.raises(TypeError, match="dst must be an int"):
        group.group_rank_of(1.5, "dst")


def test_object_collectives_refuse_unauthenticated_transports(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group(world_size=1, rank=0, timeout=5)
    try:
        untrusted = pgm.ProcessGroup(9, [0], 0, None, CommQueue(0, 1.0), "custom", 1.0,
                                     trusted=False)
        with pytest.raises(PermissionError, match="custom"):
            dist.all_gather_object({"x": 1}, group=untrusted)
        with pytest.raises(PermissionError, match="custom"):
            dist.broadcast_object_list([1], group=untrusted)
        with pytest.raises(PermissionError, match="custom"):
            dist.gather_object(1, [None], group=untrusted)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def no_job_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "NEURAL_ARCH_BACKEND", "NEURAL_FORGE_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_backend_alias_variable_is_read_by_init_process_group(no_job_variables):
    no_job_variables.setenv("NEURAL_FORGE_BACKEND", "tcp")
    dist.init_process_group(world_size=1, rank=0, timeout=5)
    try:
        assert dist.get_backend() == "tcp"
    finally:
        dist.destroy_process_group()
    no_job_variables.setenv("NEURAL_ARCH_BACKEND", "shm")
    with pytest.raises(ValueError, match="NEURAL_ARCH_BACKEND='shm' and its alias "
                                         "NEURAL_FORGE_BACKEND='tcp' disagree"):
        dist.init_process_group(world_size=1, rank=0, timeout=5)
    assert not dist.is_initialized()


def test_world_size_without_rank_is_refused_not_a_job_of_one(no_job_variables):
    no_job_variables.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=4 but no rank: set RANK"):
        dist.init_process_group(timeout=5)
    assert not dist.is_initialized()
    no_job_variables.setenv("RANK", "0")  # the contract, complete but for the master
    with pytest.raises(ValueError, match="MASTER_ADDR and MASTER_PORT are not set"):
        dist.init_process_group("shm", timeout=5)
    assert not dist.is_initialized()
