"""The launcher when things go wrong: exit codes, signal deaths, teardown of the survivors (and
their children), restarts, signals sent to the launcher itself, and the run timeout."""
from __future__ import annotations

import signal

import pytest

try:
    from launcher_support import free_port, job, process_alive, wait_until  # noqa: F401
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import (free_port, job, process_alive,  # noqa: F401
                                             wait_until)

pytestmark = pytest.mark.timeout(120)

# Every rank records its pid and sleeps; the rank named in argv[1] waits until all have
# started, then leaves the way argv[2] says.
FAIL_ONE = """
record_pid()
if RANK == int(sys.argv[1]):
    wait_for_files("pid_worker_*", int(os.environ["WORLD_SIZE"]))
    if sys.argv[2] == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(sys.argv[2]))
time.sleep(300)
"""


def assert_all_gone(job, expected_count):
    recorded = job.recorded("*")
    assert len(recorded) == expected_count, recorded
    survivors = [pid for pid, start in recorded if process_alive(pid, start)]
    assert survivors == [], f"processes left running: {survivors}"


def test_failing_rank_exit_code_is_propagated_and_named(job):
    script = job.script(FAIL_ONE)
    logs = job.dir / "logs"
    result = job.run(script, "2", "3", "--nproc_per_node=4", f"--log_dir={logs}",
                     f"--master_port={free_port()}")
    assert result.returncode == 3, result.stderr
    summary = [line for line in result.stderr.splitlines() if line.startswith("launcher: rank")]
    assert summary == [f"launcher: rank 2 failed with exit code 3; log: {logs / 'rank_2.log'}"]
    assert_all_gone(job, 4)


def test_worker_killed_by_a_signal(job):
    script = job.script(FAIL_ONE)
    result = job.run(script, "1", "sigkill", "--nproc_per_node=3", f"--master_port={free_port()}")
    assert result.returncode == 128 + signal.SIGKILL
    assert "rank 1 failed with signal SIGKILL (exit code 137)" in result.stderr
    assert_all_gone(job, 3)


def test_failure_stops_stubborn_workers_and_their_children(job):
    # Rank 0 ignores SIGTERM (needs the SIGKILL after the grace period); rank 1 has a child
    # process, which must die with it; rank 2 fails once both are in place.
    script = job.script("""
        if RANK == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if RANK == 1:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            record_pid(child.pid, tag="child")
        record_pid()
        if RANK == 2:
            wait_for_files("pid_*", 4)
            sys.exit(1)
        time.sleep(300)
    """)
    proc = job.start(script, "--nproc_per_node=3", f"--master_port={free_port()}")
    result = job.finish(proc, timeout=30)  # grace period 5 s, then SIGKILL
    assert result.returncode == 1, result.stderr
    assert "rank 2 failed with exit code 1" in result.stderr
    assert len(job.recorded("child")) == 1
    assert_all_gone(job, 4)


def test_restart_succeeds_on_the_second_attempt(job):
    script = job.script("""
        dump_env()
        if RANK == 1 and ATTEMPT == 0:
            wait_for_files("env_*_0.json", int(os.environ["WORLD_SIZE"]))
            sys.exit(4)
        if ATTEMPT == 0:
            time.sleep(300)  # stopped by the launcher when rank 1 fails
    """)
    logs = job.dir / "logs"
    result = job.run(script, "--nproc_per_node=2", "--max_restarts=1", f"--log_dir={logs}",
                     f"--master_port={free_port()}")
    assert result.returncode == 0, result.stderr
    envs = job.envs()
    assert sorted(envs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(env["RESTART_COUNT"] == str(attempt) for (_, attempt), env in envs.items())
    assert envs[(0, 0)]["NEURAL_ARCH_SECRET"] == envs[(1, 1)]["NEURAL_ARCH_SECRET"]
    assert "rank 1 failed with exit code 4; restarting all 2 workers (restart 1 of 1" \
        in result.stderr
    assert "restart 1 of 1" in (logs / "rank_0.log").read_text()


def test_restarts_run_out(job):
    script = job.script("""
        dump_env()
        if RANK == 0:
            wait_for_files(f"env_*_{ATTEMPT}.json", int(os.environ["WORLD_SIZE"]))
            sys.exit(5)
    """)
    result = job.run(script, "--nproc_per_node=2", "--max-restarts", "2",
                     f"--master_port={free_port()}")
    assert result.returncode == 5
    assert sorted(job.envs()) == [(r, a) for r in (0, 1) for a in (0, 1, 2)]
    assert result.stderr.count("restarting all 2 workers") == 2
    assert "launcher: rank 0 failed with exit code 5; no log file" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_is_forwarded_and_nothing_remains(job, signum):
    script = job.script("""
        def leave(signum, frame):
            (OUT / f"got_{signal.Signals(signum).name}_{RANK}").write_text("")
            sys.exit(0)
        signal.signal(signal.SIGTERM, leave)
        signal.signal(signal.SIGINT, leave)
        record_pid()
        time.sleep(300)
    """)
    proc = job.start(script, "--nproc_per_node=3", f"--master_port={free_port()}")
    assert wait_until(lambda: len(job.recorded()) == 3), "workers did not start"
    proc.send_signal(signum)
    result = job.finish(proc, timeout=30)
    assert result.returncode == 128 + signum, result.stderr
    name = signal.Signals(signum).name
    assert sorted(p.name for p in job.out.glob("got_*")) == [f"got_{name}_{r}" for r in range(3)]
    assert f"received {name}" in result.stderr
    assert_all_gone(job, 3)


def test_run_timeout_stops_everything(job):
    script = job.script("""
        record_pid()
        time.sleep(300)
    """)
    result = job.run(script, "--nproc_per_node=2", "--timeout", "1",
                     f"--master_port={free_port()}", timeout=30)
    assert result.returncode == 124
    assert "--timeout=1.0s" in result.stderr
    assert_all_gone(job, len(job.recorded()))


def test_stray_child_of_a_finished_worker_is_stopped(job):
    script = job.script("""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        record_pid(child.pid, tag="child")
        print("leaving my child behind")
    """)
    result = job.run(script, "--nproc_per_node=2", f"--master_port={free_port()}", timeout=30)
    assert result.returncode == 0, result.stderr
    assert_all_gone(job, 2)
