"""How the distributed benchmarks write up their results: the machine, tables, sections, figures.

Every report names the command that reproduces it and the machine it ran on; its text goes
between markers of its own in a Markdown file (e.g. ``benchmarks/RESULTS.md``), so that each
script rewrites only its section. Figures are PNG files drawn without a display.
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import shutil
import subprocess
from typing import Any, List, Optional, Sequence


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            match = re.search(r"model name\s*:\s*(.+)", handle.read())
            if match:
                return match.group(1).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def open_mpi_version() -> Optional[str]:
    if not shutil.which("mpiexec"):
        return None
    try:
        out = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\(([^)]*MPI[^)]*)\)\s*([0-9][0-9.]*)", out)
    if match:
        return f"{match.group(1)} {match.group(2)}"
    return out.strip().splitlines()[0] if out.strip() else None


def machine_info() -> str:
    import numpy as np
    parts = [cpu_model(), f"{os.cpu_count()} cores", f"Python {platform.python_version()}",
             f"NumPy {np.__version__}"]
    mpi = open_mpi_version()
    parts.append(mpi if mpi else "no MPI")
    try:
        load = os.getloadavg()[0]
        parts.append(f"load average {load:.2f} at start")
    except OSError:
        pass
    parts.append(datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
    return "; ".join(parts)


def command_line(script_relpath: str, argv: Sequence[str]) -> str:
    return "python " + " ".join(shlex.quote(a) for a in [script_relpath, *argv])


def write_section(path: str, name: str, body: str) -> None:
    """Put ``body`` between ``<!-- name:start -->`` and ``<!-- name:end -->`` in ``path``,
    replacing an earlier copy and leaving every other part of the file as it was."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    section = f"{start}\n{body.strip()}\n{end}"
    existing = ""
    if os.path.isfile(path):  # not /dev/null or a pipe: those are written, never read
        with open(path, encoding="utf-8") as handle:
            existing = handle.read()
    if start in existing and end in existing:
        head = existing[:existing.index(start)]
        tail = existing[existing.index(end) + len(end):]
        updated = head + section + tail
    else:
        updated = (existing.rstrip() + "\n\n" if existing.strip() else "") + section + "\n"
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    from neural_arch._files import write_whole  # here: numpy's threads are set by then
    write_whole(path, updated, path + ".tmp")  # never a regular file over /dev/null


def section_head(title: str, command: str, machine: str, method: str) -> List[str]:
    return [f"## {title}", "", f"Command: `{command}`", "", f"Machine: {machine}", "", method, ""]


def publish(text: str, outputs: Sequence[str], section: str) -> None:
    print("\n" + text)
    for path in outputs:
        write_section(path, section, text)
        print(f"wrote {path}")


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    print(f"wrote {path}")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]],
                   align: Optional[str] = None) -> str:
    """``align``: one character per column, ``l`` or ``r`` (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: Optional[bool]) -> str:
    return "n/a (not measured)" if ok is None else ("PASS" if ok else "MISS")
