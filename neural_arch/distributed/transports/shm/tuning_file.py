"""The shared-memory tuning table on disk: one table per machine it was measured on.

Which large all-reduce is fastest depends on the machine: its caches, its cores, and what the
kernel charges for reading another process's memory (``cross_memory``). Two 2-core machines of
the same suite disagree completely: on one, peer reads took 0.60-0.82x the time of the best
workspace algorithm from 224 KiB; on the other, a ``process_vm_readv`` moves 10 GB/s against
a local copy's 30, and peer reads took 1.6-2x the time of ``whole`` at every size. So a table
names the machine it was measured on, and a machine uses only its own.

A file is JSON in one of two forms:

* ``{"format": 2, "machines": [TABLE, ...]}``: a table per machine, each ``TABLE`` an object
  ``{"machine": "<signature>", "measured": {...}, "peer_writes": bool, "all_reduce": {...}}``
  (``tuning`` says what the rows mean). ``tune_shm_collectives.py`` writes this form, replacing
  the table of the machine it ran on and keeping the others.
* ``{"format": 1, "peer_writes": bool, "all_reduce": {...}}``: one table, for whatever machine
  reads it (a ``"machine"`` field, if present, limits it to that machine).

``machine()`` is the signature: the CPU's model name and the number of CPUs, the cheapest
description that tells those machines apart.
"""
from __future__ import annotations

import json
import os
import platform
import re
from typing import Any, Dict, List, NamedTuple, Optional

READ_FORMATS = (1, 2)
FORMAT = 2  # what ``write`` writes
PEER_WRITES = "peer_writes"  # a table's field: its peer_read rows were measured with writes
MACHINE = "machine"


class Table(NamedTuple):
    machine: Optional[str]  # None: a format-1 table without a machine, for any machine
    rows: Dict[int, list]   # world size -> [(up_to_bytes, Choice)], as ``tuning.parse_rows``
    peer_writes: bool


def machine() -> str:
    """This machine as a tuning table names it, e.g. ``'AMD EPYC, 2 CPUs'``."""
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            found = re.search(r"model name\s*:\s*(.+)", handle.read())
            model = found.group(1).strip() if found else ""
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return f"{model}, {os.cpu_count() or 1} CPUs"


def read(path: str) -> Any:
    """The decoded JSON at ``path``; ValueError naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the shared-memory tuning table {path}: {exc}") from None


def tables(decoded: Any, source: str, parse_rows: Any) -> List[Table]:
    """Every table of a decoded file; ``parse_rows(rows, where)`` checks one table's
    ``all_reduce`` field. ValueError naming ``source`` and the field at fault."""
    form = decoded.get("format") if isinstance(decoded, dict) else None
    if form not in READ_FORMATS:
        raise ValueError(f"{source}: a tuning table is a JSON object with \"format\" 1 or 2, "
                         f"got format {form if isinstance(decoded, dict) else decoded!r}")
    if form == 1:
        return [_table(decoded, source, parse_rows)]
    entries = decoded.get("machines")
    if not isinstance(entries, list):
        raise ValueError(f"{source}: \"machines\" must be a list of tables, got {entries!r}")
    out = [_table(entry, f"{source}: machines[{i}]", parse_rows, needs_machine=True)
           for i, entry in enumerate(entries)]
    names = [t.machine for t in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: a machine has more than one table: {names}")
    return out


def _table(entry: Any, where: str, parse_rows: Any, needs_machine: bool = False) -> Table:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object, got {entry!r}")
    name = entry.get(MACHINE)
    if (name is None and needs_machine) or (name is not None and not isinstance(name, str)):
        raise ValueError(f"{where}: \"{MACHINE}\" must name the machine as a string, "
                         f"got {name!r}")
    flag = entry.get(PEER_WRITES, False)
    if not isinstance(flag, bool):
        raise ValueError(f"{where}: \"{PEER_WRITES}\" must be true or false, got {flag!r}")
    return Table(name, parse_rows(entry.get("all_reduce", {}), where), flag)


def for_machine(found: List[Table], name: str) -> Optional[Table]:
    """The table measured on machine ``name``, else one for any machine, else None."""
    mine = [t for t in found if t.machine == name]
    anywhere = [t for t in found if t.machine is None]
    return (mine or anywhere or [None])[0]


def write(path: str, entry: Dict[str, Any], tables_of: Any) -> Dict[str, Any]:
    """Write ``entry`` (a table with its ``"machine"``) into the file at ``path``, replacing
    that machine's table and keeping the others'; returns the whole file's object.
    ``tables_of(decoded, source)`` checks what is written. An unreadable file already there
    is a ValueError, not overwritten."""
    kept: List[Dict[str, Any]] = []
    if os.path.exists(path):
        decoded = read(path)
        tables_of(decoded, path)
        if decoded["format"] == 1:
            if decoded.get(MACHINE) is not None:  # a format-1 table without one is the
                kept = [decoded]                  # machine's own, measured before: replaced
        else:
            kept = list(decoded["machines"])
        kept = [{k: v for k, v in t.items() if k != "format"} for t in kept
                if t.get(MACHINE) != entry[MACHINE]]
    out = {"format": FORMAT, "machines": sorted(kept + [entry], key=lambda t: t[MACHINE])}
    tables_of(out, path)  # never write a file the reader would refuse
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return out
