"""The shared-memory tuning table on disk: one table per machine it was measured on.

Which large all-reduce is fastest depends on the machine: its caches, its cores, and what the
kernel charges for reading another process's memory (``cross_memory``). Two 2-core machines
with different CPUs disagree completely: on one, peer reads were fastest from 224 KiB (0.60-0.82x
the time of the best workspace algorithm from 256 KiB); on the other, a ``process_vm_readv``
costs 3.3-4.1 local copies of its bytes, and peer reads took 1.3-4.2x the time of ``whole``
at every size. So a table names the machine it was measured on, and a machine uses only its
own.

A file is JSON in one of two forms:

* ``{"format": 2, "machines": [TABLE, ...]}``: a table per machine, each ``TABLE`` an object
  ``{"machine": "<signature>", "measured": {...}, "peer_writes": bool, "all_reduce": {...}}``
  (``tuning`` says what the rows mean). ``tune_shm_collectives.py`` writes this form, replacing
  the whole table of the machine it ran on (every world size it measured in that run) and
  keeping the others'.
* ``{"format": 1, "peer_writes": bool, "all_reduce": {...}}``: one table, for whatever machine
  reads it (a ``"machine"`` field, if present, limits it to that machine). Written over by the
  tuner only when it names its machine: a table for any machine is never dropped unasked.

``machine()`` is the signature: the CPU's model name and the number of CPUs this process may
run on, the cheapest description that tells those machines apart.
"""
from __future__ import annotations

import json
import os
import platform
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional

READ_FORMATS = (1, 2)
FORMAT = 2  # what ``write`` writes
PEER_WRITES = "peer_writes"  # a table's field: its peer_read rows were measured with writes
MACHINE = "machine"
ParseRows = Callable[[Any, str], Dict[int, list]]  # one table's all_reduce field, checked
TablesOf = Callable[[Any, str], list]  # every table of a decoded file, checked


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
    try:
        cpus = len(os.sched_getaffinity(0))  # a container's share, not its host's count
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return f"{model}, {cpus} CPUs"


def read(path: str) -> Any:
    """The decoded JSON at ``path``; ValueError naming the file when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read the shared-memory tuning table {path}: {exc}") from None


def tables(decoded: Any, source: str, parse_rows: ParseRows) -> List[Table]:
    """Every table of a decoded file; ``parse_rows(rows, where)`` checks one table's
    ``all_reduce`` field. ValueError naming ``source`` and the field at fault."""
    form = decoded.get("format") if isinstance(decoded, dict) else None
    if type(form) is not int or form not in READ_FORMATS:  # not True, which equals 1
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


def _table(entry: Any, where: str, parse_rows: ParseRows, needs_machine: bool = False) -> Table:
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


def existing(path: str, tables_of: TablesOf) -> List[Dict[str, Any]]:
    """The tables already in the file at ``path`` (none if there is no file), as written;
    ValueError if it is unreadable or holds a table for any machine (format 1 without a
    ``"machine"``), which writing a machine's table into it would have to drop."""
    if not os.path.exists(path):
        return []
    decoded = read(path)
    tables_of(decoded, path)
    if decoded["format"] == 2:
        return list(decoded["machines"])
    if decoded.get(MACHINE) is None:
        raise ValueError(f"{path} holds one table for any machine (format 1 without "
                         f"\"{MACHINE}\"): name its machine in it, or write elsewhere")
    return [decoded]


def write(path: str, entry: Dict[str, Any], tables_of: TablesOf) -> Dict[str, Any]:
    """Write ``entry`` (a table with its ``"machine"``) into the file at ``path``, replacing
    that machine's table and keeping the others'; returns the whole file's object.
    ``tables_of(decoded, source)`` checks what is written. An unreadable file already there
    is a ValueError, not overwritten."""
    kept = [{k: v for k, v in t.items() if k != "format"} for t in existing(path, tables_of)
            if t[MACHINE] != entry[MACHINE]]
    out = {"format": FORMAT, "machines": sorted(kept + [entry], key=lambda t: t[MACHINE])}
    tables_of(out, path)  # never write a file the reader would refuse
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return out
