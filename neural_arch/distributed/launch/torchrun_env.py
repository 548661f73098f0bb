"""torchrun's ``PET_*`` variables as the launcher's defaults, the way torchrun reads them.

torchrun takes the default of each option from ``PET_<OPTION>`` (PET_NPROC_PER_NODE,
PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, ...), and Kubeflow's trainer starts
it with nothing else set: a launcher that ignored them would start one worker where the job
asked for several, and the job would wait for the rest. A flag on the command line still wins.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Mapping, Tuple

from .config import resolve_nproc


def _nnodes(text: str) -> int:
    """torchrun's ``N`` or ``MIN:MAX``; only a fixed size (MIN == MAX) fits this launcher."""
    low, _, high = text.partition(":")
    if not low.strip().isdigit() or (high and high.strip() != low.strip()):
        raise ValueError("a number of nodes (an elastic range MIN:MAX needs MIN == MAX here)")
    return int(low)


def _positive_nproc(text: str) -> str:
    resolve_nproc(text)  # refused here, so the error can name the variable
    return text


# launcher option (its ``dest``) -> how to read its PET_ variable
_READERS: Tuple[Tuple[str, Callable[[str], Any]], ...] = (
    ("nproc_per_node", _positive_nproc), ("nnodes", _nnodes), ("node_rank", int),
    ("master_addr", str), ("master_port", int), ("max_restarts", int),
    ("monitor_interval", float), ("log_dir", str),
)


def pet_defaults(given: Iterable[str], environ: Mapping[str, str]) -> Tuple[dict, List[str]]:
    """({option: value} from the PET_ variables of the options not ``given`` on the command
    line, [errors naming the variable and its value])."""
    given = set(given)
    values, errors = {}, []
    for dest, convert in _READERS:
        name = f"PET_{dest.upper()}"
        raw = environ.get(name, "").strip()
        if dest in given or not raw:
            continue
        try:
            values[dest] = convert(raw)
        except ValueError as exc:
            errors.append(f"{name}={raw!r} is not valid for --{dest} ({exc})")
    return values, errors
