"""The multi-process test harness reports failures by rank and leaves no process behind."""
from __future__ import annotations

import os
import socket
import time

import pytest

import dist_harness
from dist_harness import RankFailed, mpi_available, run_ranks

pytestmark = pytest.mark.timeout(120)


def record_pid(rank: int, ws: int, folder: str) -> None:
    with open(os.path.join(folder, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))


def fail_on_rank_one(rank: int, ws: int, folder: str) -> int:
    record_pid(rank, ws, folder)
    if rank == 1:
        raise KeyError("missing bucket 42")
    return rank * 10


def exit_on_rank_two(rank: int, ws: int, folder: str) -> int:
    record_pid(rank, ws, folder)
    if rank == 2:
        os._exit(3)
    return rank


def hang_on_rank_zero(rank: int, ws: int, folder: str) -> int:
    record_pid(rank, ws, folder)
    if rank == 0:
        time.sleep(300)
    return rank


def squares(rank: int, ws: int, folder: str) -> int:
    record_pid(rank, ws, folder)
    return rank * rank + ws


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def assert_all_gone(folder: str, ws: int) -> None:
    pids = []
    for rank in range(ws):
        path = os.path.join(folder, f"{rank}.pid")
        if os.path.exists(path):
            with open(path) as f:
                pids.append(int(f.read()))
    assert pids, "no rank recorded its pid"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


@pytest.mark.parametrize("backend", ["none", "tcp"])
def test_results_come_back_in_rank_order(tmp_path, backend):
    assert run_ranks(squares, 3, backend, args=(str(tmp_path),)) == [3, 4, 7]
    assert_all_gone(str(tmp_path), 3)


def test_a_raising_rank_is_named_with_its_traceback(tmp_path):
    with pytest.raises(RankFailed) as info:
        run_ranks(fail_on_rank_one, 3, "tcp", args=(str(tmp_path),), init_kwargs={"timeout": 10})
    assert info.value.rank == 1
    assert "missing bucket 42" in str(info.value) and "fail_on_rank_one" in info.value.details
    assert_all_gone(str(tmp_path), 3)


def test_a_rank_that_exits_early_is_reported(tmp_path):
    with pytest.raises(RankFailed, match="exited with code 3") as info:
        run_ranks(exit_on_rank_two, 3, "none", args=(str(tmp_path),))
    assert info.value.rank == 2
    assert_all_gone(str(tmp_path), 3)


def test_a_hung_rank_is_killed_at_the_deadline(tmp_path):
    with pytest.raises(RankFailed, match=r"did not finish within 3") as info:
        run_ranks(hang_on_rank_zero, 2, "none", timeout=3, args=(str(tmp_path),))
    assert info.value.rank == 0
    assert_all_gone(str(tmp_path), 2)


@pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")
def test_a_hung_mpi_job_is_stopped(tmp_path):
    # ranks run in sessions of their own: killing mpiexec's process group would miss them
    with pytest.raises(RankFailed, match="reported nothing"):
        run_ranks(hang_on_rank_zero, 2, "mpi", timeout=8, args=(str(tmp_path),))
    assert_all_gone(str(tmp_path), 2)


def test_a_taken_port_is_replaced_by_a_fresh_one(tmp_path, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        handed_out = []

        def first_the_taken_port():
            handed_out.append(taken.getsockname()[1] if not handed_out else real())
            return handed_out[-1]

        real = dist_harness.free_port
        monkeypatch.setattr(dist_harness, "free_port", first_the_taken_port)
        assert run_ranks(squares, 2, "tcp", args=(str(tmp_path),),
                         init_kwargs={"timeout": 10}) == [2, 3]
        assert len(handed_out) == 2  # the run was retried once, on a fresh port
