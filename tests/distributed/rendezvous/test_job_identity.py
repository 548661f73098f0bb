"""Job identities: where each comes from, how the handshake shows it, and a store client of one
job that reaches another job's store failing at once with an error naming both jobs."""
from __future__ import annotations

import time

import pytest

from neural_arch.distributed.errors import RendezvousError
from neural_arch.distributed.rendezvous.env import RendezvousInfo
from neural_arch.distributed.rendezvous.job import (JOB_KEY, job_identity, labelled_nonce,
                                                    nonce_label, secret_id)
from neural_arch.distributed.rendezvous.store import TCPStore

pytestmark = pytest.mark.timeout(60)
SECRET = b"job-identity-test-secret"
OTHER_SECRET = b"another-jobs-secret-entirely"


def info(launcher, world=2, port=29500):
    return RendezvousInfo(0, world, 0, world, "127.0.0.1", port, launcher)


@pytest.mark.parametrize("launcher, env, expected", [
    ("env", {"NEURAL_ARCH_RUN_ID": "3f9a", "SLURM_JOB_ID": "9"}, "run:3f9a"),
    ("env", {"TORCHELASTIC_RUN_ID": "job-7"}, "torchrun:job-7"),
    ("slurm", {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3"}, "slurm:4242.3"),
    ("slurm", {"SLURM_JOB_ID": "4242"}, "slurm:4242.batch"),
    ("mpi", {"PMIX_NAMESPACE": "prterun-host-77@1"}, "pmix:prterun-host-77@1"),
])
def test_identity_comes_from_the_launcher_that_started_the_job(launcher, env, expected):
    assert job_identity(info(launcher), env, SECRET)[0] == expected


def test_without_a_launchers_name_the_identity_is_a_digest_of_what_the_job_shares():
    first, why = job_identity(info("env"), {"TORCHELASTIC_RUN_ID": "none"}, SECRET)
    assert first.startswith("env:") and secret_id(SECRET) in why
    assert job_identity(info("env"), {}, SECRET)[0] == first  # every rank computes the same
    assert job_identity(info("env"), {}, OTHER_SECRET)[0] != first
    assert job_identity(info("env", world=4), {}, SECRET)[0] != first
    # SLURM's job id names the job only when srun started this process as one of its tasks
    assert job_identity(info("env"), {"SLURM_JOB_ID": "1"}, SECRET)[0] == first
    assert job_identity(info("env"), {}, None)[0] is None


def test_the_servers_nonce_carries_its_label():
    assert nonce_label(labelled_nonce(b"slurm:4242.0")) == "slurm:4242.0"
    assert len(labelled_nonce(b"slurm:4242.0")) == len(labelled_nonce(b"")) == 32
    assert labelled_nonce(b"x") != labelled_nonce(b"x")  # still fresh
    assert nonce_label(labelled_nonce(b"a" * 40)) == "a" * 20  # cut to fit
    assert nonce_label(bytes(range(200, 232))) is None


@pytest.fixture
def job_a_store():
    store = TCPStore("127.0.0.1", 0, world_size=2, is_server=True, secret=SECRET, timeout=20,
                     rank=0, job="slurm:1001.0")
    yield store
    store.close()


def connect(server, secret, job):
    return TCPStore("127.0.0.1", server.port, secret=secret, timeout=20, rank=1, job=job)


def test_the_same_job_joins(job_a_store):
    assert job_a_store.get(JOB_KEY) == b"slurm:1001.0"
    with connect(job_a_store, SECRET, "slurm:1001.0") as client:
        client.set("k", b"v")
    with connect(job_a_store, SECRET, None):  # a client that names no job is not checked
        pass


@pytest.mark.parametrize("secret, how", [
    (SECRET, "the store of job 'slurm:1001.0'"),
    (OTHER_SECRET, "a store that does not know this job's secret and says it serves job "
                   "'slurm:1001.0'"),
])
def test_another_jobs_store_is_refused_naming_both_jobs(job_a_store, secret, how):
    with pytest.raises(RendezvousError) as error:
        connect(job_a_store, secret, "slurm:1002.0")
    message, where = str(error.value), f"at 127.0.0.1:{job_a_store.port}"
    assert f"rank 1 of job 'slurm:1002.0' reached {how} {where}" in message
    assert "own MASTER_PORT" in message
    # the refused client hung up: rank 0's own connection is the store's only one again
    deadline = time.monotonic() + 20
    while job_a_store.num_clients != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job_a_store.num_clients == 1


def test_a_store_that_names_no_job_is_refused_by_a_rank_that_names_one():
    with TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=20) as plain:
        with pytest.raises(RendezvousError, match="a store that names no job"):
            connect(plain, SECRET, "run:abc")
