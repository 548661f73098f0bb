"""SLURM host lists (``SLURM_STEP_NODELIST``, ``SLURM_NODELIST``): ``node[01-03,07],gpu5``.

What SLURM prints: hosts separated by commas, each a name with bracketed ranges in it
(``a[1-2]b[3-4]`` is every combination, a1b3 a1b4 a2b3 a2b4); a range is ``N`` or ``N-M``
with N <= M, and a zero-padded bound keeps its width (``[08-10]`` is 08 09 10). Anything else
(``node[01-``, ``node[]``, ``node[3-1]``, brackets that do not pair) is an error naming the
variable and its value: taking the text before a broken bracket for a host would send every
rank to a master that does not exist, or to the wrong one.
"""
from __future__ import annotations

import itertools
import math
import re
from typing import Iterator, Optional, Union

MAX_HOSTS = 1 << 20  # far above any cluster; a list beyond it is a typo, not a job
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_Piece = Union[str, list]  # literal text, or the numbers of one bracket as zero-padded strings


def _error(nodelist: str, variable: Optional[str], why: str) -> ValueError:
    named = f"{variable}={nodelist!r}" if variable else f"SLURM node list {nodelist!r}"
    return ValueError(f"{named} is not a SLURM host list: {why}")


def _split_hosts(nodelist: str, variable: Optional[str]) -> list[str]:
    """The comma-separated hosts, commas inside brackets kept; brackets must pair, unnested."""
    hosts, start, depth = [], 0, 0
    for i, char in enumerate(nodelist):
        if char == "[":
            if depth:
                raise _error(nodelist, variable, f"'[' inside brackets at character {i + 1}")
            depth = 1
        elif char == "]":
            if not depth:
                raise _error(nodelist, variable, f"']' without '[' at character {i + 1}")
            depth = 0
        elif char == "," and not depth:
            hosts.append(nodelist[start:i])
            start = i + 1
    if depth:
        raise _error(nodelist, variable, "a '[' is never closed")
    hosts.append(nodelist[start:])
    return hosts


def _bracket(inside: str, nodelist: str, variable: Optional[str]) -> list:
    """The ranges of one bracket, checked: (low, high, width) each."""
    ranges = []
    for part in inside.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise _error(nodelist, variable, f"range {part!r} in [{inside}] is not N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise _error(nodelist, variable, f"range {part!r} in [{inside}] runs backwards")
        ranges.append((int(low), int(high), len(low)))
    return ranges


def _parse(nodelist: str, variable: Optional[str]) -> list[list[_Piece]]:
    entries = []
    for host in _split_hosts(nodelist.strip(), variable):
        host = host.strip()
        if not host:
            raise _error(nodelist, variable, "an empty host name")
        pieces: list[_Piece] = []
        position = 0
        while position < len(host):
            opening = host.find("[", position)
            if opening < 0:
                pieces.append(host[position:])
                break
            if opening > position:
                pieces.append(host[position:opening])
            closing = host.index("]", opening)  # ``_split_hosts`` checked that brackets pair
            inside = host[opening + 1:closing]
            if not inside.strip():
                raise _error(nodelist, variable, f"empty brackets in {host!r}")
            pieces.append(_bracket(inside, nodelist, variable))
            position = closing + 1
        entries.append(pieces)
    return entries


def _count(pieces: list[_Piece]) -> int:
    return math.prod(sum(high - low + 1 for low, high, _ in p)
                     for p in pieces if isinstance(p, list))


def _hosts(pieces: list[_Piece]) -> Iterator[str]:
    choices = [[p] if isinstance(p, str) else
               [str(n).zfill(width) for low, high, width in p for n in range(low, high + 1)]
               for p in pieces]
    return ("".join(combination) for combination in itertools.product(*choices))


def _checked(nodelist: str, variable: Optional[str]) -> list[list[_Piece]]:
    entries = _parse(nodelist, variable)
    total = sum(_count(pieces) for pieces in entries)
    if total > MAX_HOSTS:
        raise _error(nodelist, variable, f"it names {total} hosts (more than {MAX_HOSTS})")
    return entries


def expand_nodelist(nodelist: str, variable: Optional[str] = None) -> list[str]:
    """Every host of ``nodelist``, in order; ValueError naming ``variable`` (the variable it
    came from) and the value when it is malformed."""
    return [host for pieces in _checked(nodelist, variable) for host in _hosts(pieces)]


def first_host(nodelist: str, variable: Optional[str] = None) -> str:
    """The first host of ``nodelist`` (where a SLURM job's rank 0 runs), after checking the
    whole list as ``expand_nodelist`` does, without expanding it."""
    first = _checked(nodelist, variable)[0]
    return "".join(p if isinstance(p, str) else str(p[0][0]).zfill(p[0][2]) for p in first)
