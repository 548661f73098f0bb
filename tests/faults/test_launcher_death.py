"""A launcher killed with SIGKILL takes its workers with it, and they leave nothing behind.

The launcher runs as a real subprocess; its workers record their pids (and their children's),
the test SIGKILLs the launcher alone and then waits, bounded, until every recorded process is
gone and no shared-memory segment of theirs is left in /dev/shm.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

try:
    from launcher_support import free_port, job, process_alive, wait_until  # noqa: F401
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import free_port, job, process_alive, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(180)

GONE_WITHIN_S = 30.0  # far above the expected time (immediate, or the 5 s grace period)

# argv: mode, backend. Every rank records its pid; the collective timeout is short so that a
# job whose launcher died and that was not stopped still ends on its own, soon after the test.
TRAINING = """
import numpy as np
from neural_arch import distributed as dist

MODE, BACKEND = sys.argv[1], sys.argv[2]
if MODE == "stubborn":
    # Deaf to SIGTERM, with a child in its process group, and (rank 0) stuck in a collective
    # that rank 1 never joins: only SIGKILL ends these, and only a process-group kill the child.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if RANK == 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        record_pid(child.pid, tag="child")
record_pid()
if MODE == "rendezvous" and RANK == 1:
    # Agree on the backend at the store as init_process_group would, then never map the
    # segment: rank 0 waits for it in the shm rendezvous, its segment still named.
    from neural_arch.distributed.group.backend_choice import backend_key
    from neural_arch.distributed.rendezvous.store import TCPStore
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                     secret=os.environ["NEURAL_ARCH_SECRET"].encode(), timeout=60)
    store.set(backend_key(1), BACKEND.encode())
    time.sleep(300)
dist.init_process_group(BACKEND, timeout=60)
if MODE == "stubborn" and RANK == 1:
    time.sleep(300)
x = np.ones(1000)
while True:
    dist.all_reduce(x)
    x[:] = 1.0
    (OUT / f"looping_{RANK}").touch()
    time.sleep(0.01)
"""


def _segments(pids):
    prefixes = tuple(f"nf_{pid}_" for pid in pids)
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefixes))


def _cleanup(job) -> None:
    """Kill what is left and remove its segments: a failing run leaves nothing behind either."""
    pids = [pid for pid, _ in job.recorded("*")]
    job.cleanup()
    for name in _segments(pids):
        os.unlink(os.path.join("/dev/shm", name))


def _kill_launcher_once_running(job, mode: str, backend: str, running) -> list:
    """Start the job, wait until ``running(job)``, SIGKILL the launcher; the recorded pids."""
    script = job.script(TRAINING)
    expected = 3 if mode == "stubborn" else 2
    launcher = job.start(script, mode, backend, "--nproc_per_node=2", f"--backend={backend}",
                         f"--master_port={free_port()}")
    started = wait_until(lambda: len(job.recorded("*")) == expected and running(job), 90)
    if not started:
        _cleanup(job)
        out, err = launcher.communicate(timeout=30)
        pytest.fail(f"the job did not start ({mode}, {backend})\nstdout:\n{out}\n"
                    f"stderr:\n{err}")
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=10)
    return job.recorded("*")


def _assert_all_gone(job, recorded) -> None:
    pids = [pid for pid, _ in recorded]
    gone = wait_until(lambda: not any(process_alive(p, s) for p, s in recorded), GONE_WITHIN_S)
    left = [pid for pid, start in recorded if process_alive(pid, start)]
    segments = _segments(pids)
    _cleanup(job)
    assert gone, f"processes {left} of {pids} still run {GONE_WITHIN_S} s after the launcher died"
    assert segments == [], f"/dev/shm segments left behind by {pids}: {segments}"


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_workers_in_collectives_end_with_their_killed_launcher(job, backend):
    looping = lambda j: all((j.out / f"looping_{r}").exists() for r in (0, 1))
    recorded = _kill_launcher_once_running(job, "looping", backend, looping)
    _assert_all_gone(job, recorded)


def test_a_worker_in_the_rendezvous_removes_its_segment(job):
    # Rank 0 created the job's segment and waits for rank 1 to map it: its name is still in
    # /dev/shm, and only the worker's own SIGTERM handler can remove it.
    def segment_named(j):
        rank0 = [pid for pid, _ in j.recorded("worker")]
        return bool(_segments(rank0))
    recorded = _kill_launcher_once_running(job, "rendezvous", "shm", segment_named)
    _assert_all_gone(job, recorded)


def test_workers_deaf_to_sigterm_and_their_children_are_killed(job):
    def stuck(j):
        return any(p.name.startswith("pid_child") for p in j.out.iterdir())
    recorded = _kill_launcher_once_running(job, "stubborn", "shm", stuck)
    _assert_all_gone(job, recorded)


def test_a_worker_whose_launcher_died_before_it_was_set_up_exits_at_once(tmp_path):
    # The launcher may die between fork and the death-signal request, when the request can no
    # longer fire: the child must then see that its parent changed and exit before exec.
    from neural_arch.distributed.launch.guard import die_with_launcher
    marker = tmp_path / "ran"
    preexec = die_with_launcher(launcher_pid=os.getpid() + 1)  # the child's parent is us
    assert preexec is not None, "this Linux system should offer prctl(PR_SET_PDEATHSIG)"
    child = subprocess.Popen([sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                             preexec_fn=preexec)
    assert child.wait(timeout=30) != 0
    assert not marker.exists(), "the command ran although its launcher was gone"
