"""How ``save`` writes a path: into a temporary file beside it, renamed over it when whole.

The temporary file is ``<name>.<writer>-<random>.tmp``, its writer recorded as the checkpoint
manager records its own (``distributed.checkpoint.owner``: the process table, the pid and the
start time). A writer killed mid-write leaves its temporary file, as large as the file it was
writing; each save of ``<name>`` first removes the temporaries of ``<name>`` whose writer is
gone. Those of a writer that still runs are kept (its rename needs them), and so are those of
writers in another process table (another host sharing the folder), which cannot be checked
from here. ``<name>.<pid>.tmp``, as saves named them before writers were recorded, counts as
written on this host.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
from typing import Iterable

from .._files import write_whole

logger = logging.getLogger("neural_arch.serialization")


def write_atomically(path: str, pieces: Iterable[memoryview]) -> None:
    """Write ``pieces`` to ``path`` through a temporary file, so a crash leaves the previous
    file whole; stale temporaries of ``path`` go first, freeing their space."""
    from ..distributed.checkpoint import owner

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"save: cannot write {path!r}: the folder {folder!r} does not "
                                f"exist")
    remove_stale_temporaries(path)
    # a plain open: the file mode follows the umask; a device or pipe is written in place
    write_whole(path, pieces, f"{path}.{owner.this_process()}-{secrets.token_hex(4)}.tmp")


def remove_stale_temporaries(path: str) -> None:
    """Remove the temporary files of ``path`` whose writer is gone."""
    from ..distributed.checkpoint import owner

    folder, base = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"^{re.escape(base)}\.(?:({owner.PATTERN})-[0-9a-f]+|(\d+))\.tmp$")
    try:
        names = os.listdir(folder)
    except OSError:
        return  # the save itself reports an unusable folder
    me = owner.this_process()
    for name in names:
        match = pattern.match(name)
        if match is None:
            continue
        writer = (owner.Writer.parse(match.group(1)) if match.group(1) else
                  dataclasses.replace(me, pid=int(match.group(2)), start=0))
        verdict = owner.state(writer)
        temporary = os.path.join(folder, name)
        if verdict == owner.GONE:
            logger.warning("removing %s, left by a save that was interrupted (its writer, pid "
                           "%d, is gone)", temporary, writer.pid)
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass  # another save removed it first
            except OSError as exc:
                logger.warning("could not remove %s: %s", temporary, exc)
        elif verdict == owner.UNKNOWN:
            logger.info("leaving %s: its writer (pid %d) runs on another host or in another "
                        "container, where this process cannot check it", temporary, writer.pid)
