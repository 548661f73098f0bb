"""How the round-based shared-memory all-reduce runs a message of a given size: a measured table.

Two choices shape a large all-reduce: the algorithm, ``whole`` (two ranks only: both reduce
every round whole, one barrier a round, ``direct``), ``split`` (rank r reduces slice r of each
round into the result area and everyone copies the other slices out after the next barrier,
``direct``) or ``peer_read`` (rank r reads slice r of every peer's buffer and reduces it in its
own, then writes each reduced chunk into the peers where they agreed to write each other's
memory, else reads the other slices from their owners, ``single_copy``; only where the ranks
agreed at set-up that they can read each other's memory, ``cross_memory``), and the bytes of
data per round (for ``peer_read``, per read), which decide how much of the vector stays in
cache between being copied and being reduced. Which is fastest depends on the machine's caches
and on how its cores share them, so it is measured, as Open MPI's tuned decision rules and
NCCL's tuning are:
``benchmarks/tune_shm_collectives.py`` times every candidate per world size and message size on
this machine and writes the table this module reads.

A table maps each world size to rows ``{"up_to_bytes": B, "algorithm": "whole" | "split" |
"peer_read", "round_bytes": R}`` by increasing ``up_to_bytes``; a message takes the first row
whose ``up_to_bytes`` it does not exceed, or the last row. Its ``"peer_writes": true`` says its
``peer_read`` rows were measured with the owners writing their reduced chunks into the peers
(``single_copy``): they then count only where the ranks agreed on peer writes too, since the
form that reads the owners' slices instead is slower at the smaller sizes. A file holds a table
per machine (``tuning_file``: two 2-core machines with different CPUs wanted opposite
choices), and a process reads, once, this machine's table from the file
``NEURAL_ARCH_SHM_TUNING`` names when set, else from ``tuning_table.json`` beside this file.
Where the file in force has no table for this machine (the package's file is not consulted
after the variable's), for a world size its table does not name, or for a ``peer_read`` row
in a job whose ranks cannot read each other, the built-in choice stands: ``peer_read`` in chunks of
PEER_READ_CHUNK_BYTES from PEER_READ_MIN_BYTES on (two ranks) where the ranks can and found
a read through the kernel cheap (``cross_memory.PeerReads.reads_pay``), else
``whole`` for two ranks and ``split`` for more, 1 MiB rounds. Every choice gives the same bits
(each element is reduced in rank order either way), so a table changes only the time. Ranks
that were given different tables and choose differently are told so by the collective's
fingerprint check (``tagged``), never left to mix two algorithms' steps; the ranks always
agree on whether they can read each other, and on whether reads pay.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import tuning_file
from .tuning_file import PEER_WRITES

ENV_TABLE = "NEURAL_ARCH_SHM_TUNING"
TABLE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_table.json")
ALGORITHMS = ("whole", "split", "peer_read")
DEFAULT_ROUND_BYTES = 1 << 20  # rounds of 1 MiB keep large vectors in cache on two cores
MIN_ROUND_BYTES = 4096
# Peer reads (``single_copy``), where every rank of the job can: the built-in choice from these
# sizes on, per world size, reading the peers in chunks of PEER_READ_CHUNK_BYTES. Measured on
# two cores against ``whole`` in turns, in the form without peer writes (three barriers, the
# owners' slices read back): 3-20% faster at 4 MiB and 20-40% at 16 MiB, but 5-50% slower from
# 256 KiB to 2 MiB, where the workspace copies stay in cache and the barriers and the kernel's
# page pinning weigh more. With peer writes it was faster above 192 KiB, which the shipped
# table (``"peer_writes": true``) says. World sizes not named here keep the workspace
# algorithms unless a table says otherwise: three and four ranks on two cores were slower.
PEER_READ_MIN_BYTES = {2: 4 << 20}
PEER_READ_CHUNK_BYTES = 256 << 10


class Choice(NamedTuple):
    algorithm: str    # "whole" (two ranks only), "split" or "peer_read"
    round_bytes: int  # data per round, at most the workspace's area; peer_read: per read

    @property
    def tag(self) -> str:
        """A short name of the choice, e.g. ``split@512K``."""
        kib = self.round_bytes >> 10
        size = f"{kib >> 10}M" if kib % 1024 == 0 else f"{kib}K"
        return f"{self.algorithm}@{size}"


Rows = List[Tuple[int, Choice]]
_loaded: Dict[str, Any] = {}  # "rows": {world size: rows}, "source": where they came from
_decided: Dict[Tuple[int, int, int, int, bool], Tuple[Choice, str]] = {}  # see ``decide``
MAX_DECIDED = 4096


# What a job's ranks agreed they can do to each other's memory (``cross_memory``), as the
# ``peer_reads`` level the functions below take: a bool True counts as READ.
NO_PEER_MEMORY, READ, READ_WRITE = 0, 1, 2


def peer_level(usable: bool, writable: bool) -> int:
    """The ``peer_reads`` level of a job whose ranks agreed on reads (``usable``) and writes."""
    return (READ_WRITE if writable else READ) if usable else NO_PEER_MEMORY


def default_choice(world_size: int, nbytes: int = 0, peer_reads: int = NO_PEER_MEMORY,
                   reads_pay: bool = True) -> Choice:
    """The choice without a table; ``peer_reads``: what the job's ranks agreed they can do to
    each other's memory (``peer_level``); ``reads_pay``: whether they found a read through the
    kernel cheap enough for peer reads to pay (``cross_memory.PeerReads.pays``)."""
    if peer_reads and reads_pay and world_size in PEER_READ_MIN_BYTES \
            and nbytes >= PEER_READ_MIN_BYTES[world_size]:
        return Choice("peer_read", PEER_READ_CHUNK_BYTES)
    return Choice("whole" if world_size == 2 else "split", DEFAULT_ROUND_BYTES)


def parse_rows(sizes: Any, source: str) -> Dict[int, Rows]:
    """The rows per world size of one table's ``all_reduce`` field; ValueError naming
    ``source`` and the field."""
    if not isinstance(sizes, dict):
        raise ValueError(f"{source}: \"all_reduce\" must map world sizes to rows, got {sizes!r}")
    parsed: Dict[int, Rows] = {}
    for key, rows in sizes.items():
        if not str(key).isdigit() or int(key) < 2 or not isinstance(rows, list) or not rows:
            raise ValueError(f"{source}: all_reduce[{key!r}] must be a world size >= 2 with a "
                             f"non-empty list of rows, got {rows!r}")
        p, out = int(key), []
        for i, row in enumerate(rows):
            where = f"{source}: all_reduce[{key!r}][{i}]"
            if not isinstance(row, dict):
                raise ValueError(f"{where} must be an object, got {row!r}")
            up_to, algorithm, round_bytes = (row.get("up_to_bytes"), row.get("algorithm"),
                                             row.get("round_bytes"))
            if not isinstance(up_to, int) or up_to < 0 or (out and up_to <= out[-1][0]):
                raise ValueError(f"{where}: up_to_bytes must be an int above the previous "
                                 f"row's, got {up_to!r}")
            if algorithm not in ALGORITHMS or (algorithm == "whole" and p != 2):
                raise ValueError(f"{where}: algorithm must be one of {ALGORITHMS} ('whole' "
                                 f"for two ranks only), got {algorithm!r} for {p} ranks")
            if not isinstance(round_bytes, int) or round_bytes < MIN_ROUND_BYTES:
                raise ValueError(f"{where}: round_bytes must be an int >= {MIN_ROUND_BYTES}, "
                                 f"got {round_bytes!r}")
            out.append((up_to, Choice(algorithm, round_bytes)))
        parsed[p] = out
    return parsed


def tables(decoded: Any, source: str) -> List[tuning_file.Table]:
    """Every table of a decoded file (``tuning_file``), each checked."""
    return tuning_file.tables(decoded, source, parse_rows)


def load(path: str, machine: Optional[str] = None) -> Optional[tuning_file.Table]:
    """The table at ``path`` for ``machine`` (this one by default), or None where the file
    has none for it; ValueError when the file is unreadable or malformed."""
    found = tables(tuning_file.read(path), path)
    return tuning_file.for_machine(found, machine or tuning_file.machine())


def table() -> Dict[int, Rows]:
    """The rows in force, read once: this machine's table (``tuning_file.machine``) in the
    file ``NEURAL_ARCH_SHM_TUNING`` names when set (an error if the file is unusable: it was
    asked for; a warning and none if it has no table for this machine), else in the package's
    file (a warning and none if that is unusable); none: the built-in choices."""
    if "rows" not in _loaded:
        path = os.environ.get(ENV_TABLE, "").strip()
        here = tuning_file.machine()
        found = None
        if path:
            found = load(path, here)
            if found is None:
                warnings.warn(f"{ENV_TABLE}={path} has no table for this machine ({here!r}); "
                              f"the built-in choices stand: run benchmarks/"
                              f"tune_shm_collectives.py here", RuntimeWarning)
        elif os.path.exists(TABLE_FILE):
            path = TABLE_FILE
            try:
                found = load(path, here)
            except ValueError as exc:
                warnings.warn(f"{exc}; the built-in choices stand", RuntimeWarning)
        if found is None:
            _loaded.update(rows={}, source="", writes=False)
        else:
            _loaded.update(rows=found.rows, writes=found.peer_writes,
                           source=path if found.machine is None else f"{path} ({found.machine})")
    return _loaded["rows"]


def source() -> str:
    """Where the table in force came from: the file, and the machine its table names ('' for
    the built-in choices)."""
    table()
    return _loaded["source"]


def forget() -> None:
    """Read the table again at the next all-reduce (after the file or the variable changed)."""
    _loaded.clear()
    _decided.clear()


def _clamped(choice: Choice, workspace_bytes: int) -> Choice:
    # peer reads go through private scratch: the workspace does not bound them
    if choice.round_bytes > workspace_bytes and choice.algorithm != "peer_read":
        return choice._replace(round_bytes=workspace_bytes)
    return choice


def all_reduce_choice(world_size: int, nbytes: int, workspace_bytes: int,
                      peer_reads: int = NO_PEER_MEMORY, reads_pay: bool = True) -> Choice:
    """How an all-reduce of ``nbytes`` runs on ``world_size`` ranks: the table's row for that
    size, its rounds at most ``workspace_bytes`` (an input area's size). A row naming
    peer_read counts only where ``peer_reads`` says the ranks can read each other (and write,
    where the table says its rows need it); elsewhere the built-in choice stands
    (``default_choice``, with ``reads_pay``)."""
    rows = table().get(world_size)
    choice = default_choice(world_size, nbytes, peer_reads, reads_pay)
    if rows:
        listed = next((c for up_to, c in rows if nbytes <= up_to), rows[-1][1])
        needed = READ_WRITE if _loaded["writes"] else READ
        if listed.algorithm != "peer_read" or peer_reads >= needed:
            choice = listed
    return _clamped(choice, workspace_bytes)


def _is_default(choice: Choice, world_size: int, workspace_bytes: int, nbytes: int,
                peer_reads: int, reads_pay: bool) -> bool:
    return choice == _clamped(default_choice(world_size, nbytes, peer_reads, reads_pay),
                              workspace_bytes)


def tagged(fp: Any, choice: Choice, world_size: int, workspace_bytes: int, nbytes: int = 0,
           peer_reads: int = NO_PEER_MEMORY, reads_pay: bool = True) -> Any:
    """``fp`` with the choice appended to its op when it is not the built-in one, so that ranks
    choosing differently fail the fingerprint check (naming both choices) instead of running
    different steps; the built-in choice leaves ``fp`` as it is."""
    if _is_default(choice, world_size, workspace_bytes, nbytes, peer_reads, reads_pay):
        return fp
    return fp._replace(op=f"{fp.op}/{choice.tag}")


def decide(world_size: int, nbytes: int, workspace_bytes: int,
           peer_reads: int = NO_PEER_MEMORY, reads_pay: bool = True) -> Tuple[Choice, str]:
    """(``all_reduce_choice``, the suffix ``tagged`` appends to the op: '' for the built-in
    choice), remembered per size: a large all-reduce pays a dictionary lookup for it."""
    key = (world_size, nbytes, workspace_bytes, peer_reads, reads_pay)
    found = _decided.get(key)
    if found is None:
        if len(_decided) >= MAX_DECIDED:
            _decided.clear()
        choice = all_reduce_choice(world_size, nbytes, workspace_bytes, peer_reads, reads_pay)
        default = _is_default(choice, world_size, workspace_bytes, nbytes, peer_reads,
                              reads_pay)
        found = _decided[key] = (choice, "" if default else f"/{choice.tag}")
    return found


def rows_for_json(choices: List[Tuple[int, Choice]]) -> List[dict]:
    """Measured (size, best choice) pairs as table rows, neighbours with one choice merged."""
    rows: List[dict] = []
    for size, choice in sorted(choices):
        row = {"up_to_bytes": int(size), "algorithm": choice.algorithm,
               "round_bytes": int(choice.round_bytes)}
        if rows and (rows[-1]["algorithm"], rows[-1]["round_bytes"]) == choice:
            rows[-1]["up_to_bytes"] = int(size)
        else:
            rows.append(row)
    return rows


def write(path: str, per_world_size: Dict[int, List[Tuple[int, Choice]]],
          measured: Optional[dict] = None, peer_writes: bool = False,
          machine: Optional[str] = None) -> dict:
    """Write the best choice per world size and message size as ``machine``'s table (this
    machine's by default) into the file at ``path``, keeping other machines' tables; returns
    the table. ``peer_writes``: its peer_read rows were measured with peer writes."""
    entry = {tuning_file.MACHINE: machine or tuning_file.machine(), "measured": measured or {},
             PEER_WRITES: peer_writes,
             "all_reduce": {str(p): rows_for_json(c) for p, c in sorted(per_world_size.items())}}
    tuning_file.write(path, entry, tables)
    return entry
