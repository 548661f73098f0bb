"""What ``python -m neural_arch.horovod.run`` starts in each worker slot: it adds Horovod's
variables (HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME) to the launcher's, then replaces
itself by the user's command (same process, so the launcher's signals and exit codes reach
the command directly)."""
from __future__ import annotations

import os
import socket
import sys
from typing import Dict, Mapping, Sequence


def horovod_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """HOROVOD_* from the launcher's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK."""
    try:
        rank, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local_rank = int(environ.get("LOCAL_RANK", rank))
        local_size = int(environ.get("LOCAL_WORLD_SIZE", size))
        node = int(environ.get("NODE_RANK", environ.get("GROUP_RANK", 0)))
    except (KeyError, ValueError) as exc:
        raise RuntimeError(f"neural_arch.horovod.worker runs under the launcher, which sets "
                           f"RANK and WORLD_SIZE; the environment lacks or garbles {exc}") from None
    return {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(node),
            "HOROVOD_CROSS_SIZE": str(max(size // max(local_size, 1), 1)),
            "HOROVOD_HOSTNAME": socket.gethostname()}


def main(argv: Sequence[str]) -> None:
    if not argv:
        sys.exit("usage: python -m neural_arch.horovod.worker COMMAND [ARGS...]")
    env = dict(os.environ)
    env.update(horovod_environment(env))
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as exc:
        sys.exit(f"horovod run: cannot start {argv[0]!r}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
