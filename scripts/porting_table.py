#!/usr/bin/env python
"""Run the six torch programs of tests/porting/programs under torch and, ported by their import
lines, under Neural Forge, and print the porting table.

    python scripts/porting_table.py [--only NAME ...] [--doc [PATH]]

Each program runs 20 steps from the same first weights (torch's, read by ours from a file);
a row gives the lines the port changed (import lines, lines marked ``# CPU:`` that any CPU run
of the original needs, and other lines, marked ``# port:``), the loss after the last step under
torch and under ours, and the largest difference over the 20 losses. Only with ``--doc`` does
the table replace the part of ``docs/porting.md`` (or PATH) between its markers. Needs torch;
the Horovod program's torch run needs Horovod (``horovodrun``), and without it the row compares
with a one-process run of ours (see ``tests/porting/program_runs.py``).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "porting"))

from program_runs import PROGRAMS, compare, final_losses, max_difference  # noqa: E402

DOC = ROOT / "docs" / "porting.md"
BEGIN = "<!-- porting table: begin (python scripts/porting_table.py --doc) -->"
END = "<!-- porting table: end -->"
HEADER = ("| program | original (repository, path @ commit) | import lines | CPU lines | "
          "other lines | loss after 20 steps: ours / torch | max \\|difference\\| over 20 "
          "losses |\n|---|---|---|---|---|---|---|")


def row(comparison) -> str:
    counts = comparison.counts
    repository, rest = comparison.program.original.split(" ", 1)
    theirs, ours = final_losses(comparison)
    reference = "" if comparison.reference == "torch" else f" ({comparison.reference})"
    return (f"| `{comparison.program.name}.py` | [{repository}](https://github.com/{repository}) "
            f"{rest} | {counts.imports} | {counts.cpu} | {counts.other} | "
            f"{ours:.6f} / {theirs:.6f}{reference} | {max_difference(comparison):.1e} |")


def replace_between_markers(text: str, table: str, path: Path) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{path} must hold each marker once: {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these programs")
    parser.add_argument("--doc", nargs="?", const=str(DOC), metavar="PATH",
                        help="write the table into this document between its markers")
    args = parser.parse_args(argv)
    programs = [p for p in PROGRAMS if not args.only or p.name in args.only]
    if not programs:
        raise ValueError(f"--only {args.only} names none of {[p.name for p in PROGRAMS]}")
    rows = [HEADER]
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="porting_table_") as scratch:
        for program in programs:
            rows.append(row(compare(program, Path(scratch) / program.name)))
            print(rows[-1], flush=True)
    if args.doc:
        path = Path(args.doc)
        path.write_text(replace_between_markers(path.read_text(), "\n".join(rows), path))
        print(f"wrote the table into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
