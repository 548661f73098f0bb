"""Writing a file the user named: whole or not at all, without replacing what is not a file.

A file written whole goes to a temporary file beside the path and is renamed over it, so a
reader or a crash never sees half of it. That rename replaces whatever the path names: given
``/dev/null`` or ``/dev/stdout`` (a device), or a named pipe, it would put a regular file in its
place, and as root that removes ``/dev/null`` for every program on the machine. Such a path is
written in place instead, as ``open(path, "w")`` writes it.
"""
from __future__ import annotations

import os
import stat
from typing import Iterable, Union


def is_stream(path: str) -> bool:
    """Whether ``path`` (after its links) is a device, a named pipe or a socket."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False  # nothing there yet, or a dangling link: an ordinary write makes a file
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def write_whole(path: str, content: Union[str, bytes, Iterable[memoryview]],
                temporary: str) -> None:
    """Write ``content`` (text, bytes or pieces of bytes) to ``path`` through ``temporary``,
    renamed over it when whole; a stream (``is_stream``) is written in place."""
    text = isinstance(content, str)
    pieces = [content] if isinstance(content, (str, bytes)) else content
    target = path if is_stream(path) else temporary
    try:
        with open(target, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as out:
            for piece in pieces:
                out.write(piece)
        if target == temporary:
            os.replace(temporary, path)
    finally:
        if target == temporary and os.path.lexists(temporary):
            os.unlink(temporary)
