"""Which job a rank belongs to, so that a rank which reaches another job's store says so at once.

Two jobs on one host that share a master port (two srun jobs left on the same default, two
scripts started with the same MASTER_PORT) meet at whichever store bound the port first. With
the same secret (the per-user secret file, when neither job sets NEURAL_ARCH_SECRET) a rank of
one job would join the other and compute with a stranger's ranks; with different secrets it
failed with an authentication error that named neither job. So every rendezvous carries the
job's identity, the first of:

- ``run:<id>``: NEURAL_ARCH_RUN_ID, which our launcher sets for each single-node run,
- ``torchrun:<id>``: torchrun's TORCHELASTIC_RUN_ID (its --rdzv_id),
- ``slurm:<job>.<step>``: SLURM_JOB_ID and SLURM_STEP_ID, for the tasks srun started,
- ``pmix:<namespace>``: PMIX_NAMESPACE, for the ranks an MPI launcher started,
- ``env:<digest>``: a digest of what the ranks of one job share and two colliding jobs
  rarely do: the world size, the master's port and the secret's id.

Rank 0's store holds it under ``JOB_KEY`` from the start, and its handshake shows it
(``auth``): a rank of another job fails at once with an error naming both jobs, whether or
not it knows the other job's secret.
"""
from __future__ import annotations

import hashlib
import secrets
from typing import Mapping, Optional, Tuple

from ..errors import RendezvousError

RUN_ID_VAR = "NEURAL_ARCH_RUN_ID"
NONCE_SIZE = 32  # the handshake's (``auth``)
# A server's nonce: its label (cut or NUL-padded), then random bytes. A nonce need only be
# fresh, and 96 random bits keep it so; the server's proof covers the nonce, label included.
# Anyone who connects reads the label: it tells them no more about the secret than the proof
# every stranger is sent already does.
LABEL_BYTES = 20
JOB_KEY = "neural_arch/job"
_MPI_FAMILIES = ("mpi", "pmi", "pmix", "horovod")


def secret_id(secret: bytes) -> str:
    """A short name for a secret that does not give the secret away."""
    return hashlib.sha256(b"neural_arch/secret-id/" + secret).hexdigest()[:8]


def job_identity(info, environ: Mapping[str, str],
                 secret: Optional[bytes]) -> Tuple[Optional[str], str]:
    """(identity, what it came from) of the job ``info`` (a ``RendezvousInfo``) belongs to.
    The identity is None when only the secret could give it and ``secret`` is None."""
    run = environ.get(RUN_ID_VAR, "").strip()
    if run:
        return f"run:{run}", f"{RUN_ID_VAR}={run}"
    elastic = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic != "none":  # torchrun's default id names no run
        return f"torchrun:{elastic}", f"TORCHELASTIC_RUN_ID={elastic}"
    job = environ.get("SLURM_JOB_ID", "").strip()
    if info.launcher == "slurm" and job:
        step = environ.get("SLURM_STEP_ID", "").strip() or "batch"
        return f"slurm:{job}.{step}", f"SLURM_JOB_ID={job}, SLURM_STEP_ID={step}"
    namespace = environ.get("PMIX_NAMESPACE", "").strip()
    if info.launcher in _MPI_FAMILIES and namespace:
        return f"pmix:{namespace}", f"PMIX_NAMESPACE={namespace}"
    shared = f"world size {info.world_size}, master port {info.master_port}"
    if secret is None:
        return None, f"a digest of the {shared} and the secret's id"
    sid = secret_id(secret)
    digest = hashlib.sha256(f"{info.world_size}|{info.master_port}|{sid}".encode())
    return f"env:{digest.hexdigest()[:12]}", f"a digest of the {shared} and the secret's id {sid}"


def foreign_job(host: str, port: int, ours: str, theirs: Optional[str], rank: Optional[int],
                verified: bool) -> RendezvousError:
    """The error of a rank of job ``ours`` that reached the store of job ``theirs``."""
    who = f"rank {rank} of job {ours!r}" if rank is not None else f"a rank of job {ours!r}"
    if theirs is None:
        whose = "a store that names no job (not one that init_process_group started)"
    elif verified:
        whose = f"the store of job {theirs!r}"
    else:
        whose = (f"a store that does not know this job's secret and says it serves job "
                 f"{theirs!r}")
    return RendezvousError(
        f"{who} reached {whose} at {host}:{port}: two jobs use the same MASTER_ADDR/MASTER_PORT "
        f"(the other job's rank 0 bound it first; this job's rank 0 cannot). Give each job its "
        f"own MASTER_PORT (srun jobs without one get a port of their own from SLURM_JOB_ID)",
        rank=rank, op="store.connect")


def check_store_job(store, job: str) -> None:
    """Raise ``foreign_job`` unless ``store`` (a connected ``TCPStore``) serves ``job``."""
    theirs = store.get(JOB_KEY, timeout=5.0).decode(errors="replace") if store.check(
        [JOB_KEY]) else None
    if theirs != job:
        raise foreign_job(store.host, store.port, job, theirs, store.rank, verified=True)


def labelled_nonce(label: bytes) -> bytes:
    """A fresh nonce; with a ``label``, the label (cut or NUL-padded) and 12 random bytes."""
    if not label:
        return secrets.token_bytes(NONCE_SIZE)
    head = label[:LABEL_BYTES].ljust(LABEL_BYTES, b"\0")
    return head + secrets.token_bytes(NONCE_SIZE - LABEL_BYTES)


def nonce_label(nonce: bytes) -> Optional[str]:
    """The label at the head of a server's nonce; None for a nonce that carries none (random
    bytes are printable ASCII all along with a chance of about 1e-8)."""
    head = nonce[:LABEL_BYTES].rstrip(b"\0")
    if not head or not all(32 <= b < 127 for b in head):
        return None
    return head.decode("ascii")
