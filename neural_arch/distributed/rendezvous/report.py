"""``python -m neural_arch.distributed.env``: what this process would be in a job, and why.

Run where the job runs (inside srun, mpirun, a pod, a launcher's worker) to see what
``init_process_group`` will see: rank, world size, local rank, local world size, the master's
address and port and the job's identity, each with the variable (or default) that decided it,
and the family of variables that spoke for the process. ``--json`` prints the same as one JSON
object. A contradictory or half-set environment prints the resolver's error and exits 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Mapping, Optional, Sequence

from .secret import SECRET_ENV, secret_file
from .env import resolve
from .families import TITLES
from .job import job_identity

_FIELDS = (("rank", "rank"), ("world_size", "world size"), ("local_rank", "local rank"),
           ("local_world_size", "local world size"), ("master_addr", "master address"),
           ("master_port", "master port"))


def _secret_if_known(environ: Mapping[str, str]) -> Optional[bytes]:
    """The job secret as a rank would use it, without creating the secret file."""
    if environ.get(SECRET_ENV):
        return environ[SECRET_ENV].encode()
    try:
        return secret_file().read_bytes().strip() or None
    except OSError:
        return None


def report(environ: Optional[Mapping[str, str]] = None, init_method: str = "env://") -> dict:
    """The resolver's answer with its reasons; ValueError when the environment is inconsistent."""
    environ = os.environ if environ is None else environ
    info = resolve(init_method, environ=environ)
    job, job_from = job_identity(info, environ, _secret_if_known(environ))
    out = {"family": info.launcher,
           "family_title": TITLES.get(info.launcher, "arguments"),
           "values": {name: getattr(info, name) for name, _ in _FIELDS},
           "sources": {name: info.sources[name] for name, _ in _FIELDS}}
    out["values"]["job"], out["sources"]["job"] = job, job_from
    return out


def _text(result: dict) -> str:
    lines = [f"decided by: {result['family']} ({result['family_title']})"]
    for name, label in _FIELDS + (("job", "job"),):
        value = result["values"][name]
        shown = "(made at init_process_group)" if value is None else value
        lines.append(f"{label:<17} {shown!s:<22} from {result['sources'][name]}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m neural_arch.distributed.env",
        description="Print the rank, world size, local rank and master address/port that "
                    "init_process_group would use here, and which variables decided each.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--init_method", "--init-method", default="env://",
                        help="as init_process_group's (env:// or tcp://host:port)")
    args = parser.parse_args(argv)
    try:
        result = report(init_method=args.init_method)
    except ValueError as exc:
        if args.json:
            print(json.dumps({"error": str(exc)}))
        print(f"neural_arch.distributed.env: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else _text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
