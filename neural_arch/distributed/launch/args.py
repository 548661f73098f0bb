"""The launcher's command line: launcher options, the script and the script's arguments.

Command-line rule: launcher options (known names, dashes or underscores, ``--opt=value`` or
``--opt value``) are recognised anywhere before a ``--``; everything after ``--`` goes to the
script verbatim, and unknown options after the script go to the script. ``-h`` and ``-m`` are
the launcher's only before the script, so ``train.py -h`` still reaches the script. A launcher
option given twice is an error (argparse would keep the last one silently, and the other was
most likely meant for the script).

The values are checked by ``LaunchConfig`` (``config``), not here.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..rendezvous.env import BACKEND_ALIAS, BACKEND_VAR, backend_from_environment
# Re-exported: supervisor.py and its callers take the whole configuration from this module.
from .config import BACKENDS, SECRET_VAR, LaunchConfig, Target, cpu_count, resolve_nproc
from .torchrun_env import pet_defaults

__all__ = ["BACKENDS", "PROG", "SECRET_VAR", "LaunchConfig", "Target", "build_parser", "cpu_count",
           "parse_launcher_args", "resolve_nproc", "split_command_line"]

PROG = "python -m neural_arch.distributed.launcher"
# Launcher-only before the script: after it these most likely belong to the script.
_BEFORE_SCRIPT_ONLY = {"-h", "--help", "-m", "--module"}


def _canonical(option: str) -> str:
    """``--nproc-per-node=4`` -> ``--nproc_per_node``; single-dash options stay as they are."""
    name = option.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].replace("-", "_")
    return name


def build_parser() -> argparse.ArgumentParser:
    """The launcher's options; also the single source of the names the splitter recognises."""
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{PROG} [options] SCRIPT [script args] [options] [-- script args]",
        description="Start nproc_per_node workers on this node with the environment that\n"
                    "init_process_group reads (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
                    "GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, NEURAL_ARCH_BACKEND,\n"
                    f"RESTART_COUNT, {SECRET_VAR}, NEURAL_ARCH_RUN_ID), watch them, and stop\n"
                    "all of them when one fails.",
        epilog="Options may stand before or after SCRIPT (torchrun's order and the reverse):\n"
               "after SCRIPT the launcher still takes every option named above, in any of\n"
               "its spellings (--nproc_per_node, --nproc-per-node, with '=' or a space), and\n"
               "passes the others to the script. '--' ends the launcher's options: all that\n"
               "follows goes to the script verbatim, so a script option that shares a name\n"
               "with one of the launcher's goes after it:\n"
               f"  {PROG} --nproc_per_node=2 train.py --lr 0.1 -- --nnodes 8\n"
               "gives train.py '--lr 0.1 --nnodes 8'. -h and -m are the launcher's only\n"
               "before SCRIPT. An option given twice is an error naming it.\n"
               f"{SECRET_VAR}: each job gets a fresh random secret unless it is set in the\n"
               "environment; multi-node jobs must set the same value on every node.\n"
               "Exit status: 0 when every worker exits 0, else the failing worker's code\n"
               "(128+N for a death by signal N), 124 after --timeout.\n"
               "As torchrun, an option not given takes its default from PET_<OPTION>\n"
               "(PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR,\n"
               "PET_MASTER_PORT, PET_MAX_RESTARTS, PET_MONITOR_INTERVAL, PET_LOG_DIR).\n")

    def add(name: str, **kwargs: Any) -> None:
        spellings = [name] if "_" not in name else [name, name.replace("_", "-")]
        parser.add_argument(*spellings, dest=name.lstrip("-"), **kwargs)

    add("--nproc_per_node", default="1", metavar="N",
        help="workers on this node: an integer or 'auto' (the CPU count); default 1")
    add("--nnodes", type=int, default=1, metavar="N", help="number of nodes; default 1")
    add("--node_rank", type=int, default=0, metavar="K",
        help="rank of this node, 0..nnodes-1; default 0")
    add("--master_addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"), metavar="HOST",
        help="address of the node running rank 0; default $MASTER_ADDR or 127.0.0.1")
    add("--master_port", type=int, default=os.environ.get("MASTER_PORT", "29500"), metavar="PORT",
        help="port of rank 0's rendezvous store; default $MASTER_PORT or 29500")
    add("--standalone", action="store_true",
        help="single node on 127.0.0.1 with a free port picked by the launcher")
    # None: read the environment in parse_launcher_args, where a conflict becomes a usage error.
    add("--backend", default=None, choices=BACKENDS,
        help=f"passed to the workers as {BACKEND_VAR}; default ${BACKEND_VAR} (or "
             f"${BACKEND_ALIAS}) or auto. 'mpi' is refused: start MPI ranks with mpirun")
    add("--max_restarts", type=int, default=0, metavar="N",
        help="restart the whole group up to this many times after a failure; default 0")
    add("--log_dir", default=None, metavar="DIR",
        help="also write each rank's output to DIR/rank_<R>.log")
    add("--monitor_interval", type=float, default=0.1, metavar="SECONDS",
        help="seconds between checks of the workers; default 0.1")
    add("--timeout", type=float, default=None, metavar="SECONDS",
        help="stop all workers and exit 124 after this many seconds")
    add("--no_prefix", action="store_true", help="do not prefix output lines with [rank R]")
    add("--no_python", action="store_true",
        help="run SCRIPT as a program, not with the Python interpreter")
    parser.add_argument("-m", "--module", dest="module", action="store_true",
                        help="SCRIPT is a module name, run as python -m SCRIPT")
    return parser


def _option_table(parser: argparse.ArgumentParser) -> Dict[str, bool]:
    """Canonical option name -> whether it takes a value."""
    table: Dict[str, bool] = {}
    for action in parser._actions:
        for spelling in action.option_strings:
            table[_canonical(spelling)] = action.nargs != 0
    return table


def split_command_line(argv: Sequence[str], parser: argparse.ArgumentParser
                       ) -> Tuple[List[str], Optional[str], List[str]]:
    """Split argv into (launcher tokens for argparse, script, script args)."""
    table = _option_table(parser)
    launcher: List[str] = []
    script: Optional[str] = None
    script_args: List[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            rest = tokens[i:]
            if script is None and rest:
                script, rest = rest[0], rest[1:]
            script_args.extend(rest)
            break
        name = _canonical(token) if token.startswith("-") and token != "-" else None
        known = name in table and not (script is not None and name in _BEFORE_SCRIPT_ONLY)
        if known:
            if table[name] and "=" not in token:
                value = tokens[i] if i < len(tokens) and tokens[i] != "--" else None
                if value is None:
                    launcher.append(name)  # argparse reports the missing value
                    continue
                i += 1
                launcher.append(f"{name}={value}")
            else:
                launcher.append(name + token[len(token.split("=", 1)[0]):])
        elif script is not None:
            script_args.append(token)
        elif name is not None:
            launcher.append(token)  # unknown before the script: argparse names it
        else:
            script = token
    return launcher, script, script_args


def _repeated_option(launcher_tokens: Sequence[str], table: Dict[str, bool]) -> Optional[str]:
    """A message naming the first launcher option given more than once, with its values."""
    seen: Dict[str, List[str]] = {}
    for token in launcher_tokens:
        name, has_value, value = token.partition("=")
        if name in table:
            seen.setdefault(name, []).append(value if has_value else "")
    for name, values in seen.items():
        if len(values) > 1:
            given = ", ".join(repr(v) for v in values) if any(values) else ""
            return (f"launcher option {name} is given {len(values)} times"
                    + (f" ({given})" if given else "") + "; give it once (an option meant for "
                    "the script goes after '--')")
    return None


def parse_launcher_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a launcher command line (values are validated by ``LaunchConfig``); exits with
    status 2 and a usage message on a malformed one."""
    parser = build_parser()
    launcher_tokens, script, script_args = split_command_line(argv, parser)
    repeated = _repeated_option(launcher_tokens, _option_table(parser))
    if repeated:
        parser.error(repeated)
    args = parser.parse_args(launcher_tokens)
    if script is None:
        parser.error("the following arguments are required: SCRIPT")
    given = {token.partition("=")[0][2:] for token in launcher_tokens if token.startswith("--")}
    from_pet, errors = pet_defaults(given, os.environ)
    if errors:
        parser.error("; ".join(errors))
    for dest, value in from_pet.items():
        setattr(args, dest, value)
    if args.backend is None:
        try:
            args.backend = backend_from_environment() or "auto"
        except ValueError as exc:
            parser.error(str(exc))
    args.script, args.script_args, args.parser = script, script_args, parser
    return args
