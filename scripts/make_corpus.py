"""Write a reproducible English text of at least 1 MB from what every Python install carries.

The text is Python's language-reference topics (``pydoc_data.topics.topics``, the values in
sorted key order), then the docstrings (``inspect.getdoc``) of the standard library's public
modules (sorted ``sys.stdlib_module_names``, names without a leading "_") and of the public
objects each module defines itself, joined by blank lines. Modules that act when imported
(opening windows or browsers, printing) are skipped, and so is any module that fails to import
here. The text therefore depends on the Python version (and on which optional modules this
build has): the same interpreter always writes the same bytes, another version writes another
text. On Python 3.11 it is about 1.1 MB.

    python scripts/make_corpus.py --out corpus.txt [--min-bytes 1000000]

Importable: ``build_text()`` returns the text, ``write_corpus(path, min_bytes)`` writes it.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import sys
import warnings
from typing import Dict, Iterator, List, Optional

DEFAULT_MIN_BYTES = 1_000_000
# Importing these opens a window or a browser, prints, or starts a GUI toolkit.
SIDE_EFFECT_MODULES = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle",
                                 "turtledemo"})


class CorpusTooSmall(ValueError):
    """The text this Python can build is shorter than the size asked for."""


def _topics() -> List[str]:
    from pydoc_data.topics import topics
    return [topics[key] for key in sorted(topics)]


def _public_module_names() -> List[str]:
    names = getattr(sys, "stdlib_module_names", None)
    if names is None:  # Python < 3.10 has no such list; the text needs it to be reproducible
        raise RuntimeError(f"make_corpus needs Python 3.10 or newer (sys.stdlib_module_names), "
                           f"this is {sys.version.split()[0]}")
    return sorted(name for name in names
                  if not name.startswith("_") and name not in SIDE_EFFECT_MODULES)


def _import_quietly(name: str) -> Optional[object]:
    """The module, or None when it cannot be imported here (a missing optional part, another
    platform's module); warnings and anything printed while importing are swallowed."""
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - some modules raise SystemExit or odd errors
        return None


def _own_public_objects(module: object) -> Iterator[object]:
    """The module's public attributes (sorted by name) that it defines itself, not re-exports."""
    name = module.__name__
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        value = vars(module)[attr]
        if getattr(value, "__module__", None) == name and (
                inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value)):
            yield value


def _docstrings(module: object) -> Iterator[str]:
    for thing in (module, *_own_public_objects(module)):
        try:
            doc = inspect.getdoc(thing)
        except Exception:  # noqa: BLE001 - a broken __doc__ property must not stop the text
            doc = None
        if doc and doc.strip():
            yield doc.strip()


def build_text() -> str:
    """The whole text; the same for the same Python build."""
    parts = [topic.strip() for topic in _topics() if topic.strip()]
    for name in _public_module_names():
        module = _import_quietly(name)
        if module is not None:
            parts.extend(_docstrings(module))
    return "\n\n".join(parts) + "\n"


def write_corpus(path: str, min_bytes: int = DEFAULT_MIN_BYTES) -> Dict[str, int]:
    """Write the text to ``path`` (UTF-8); its byte, character and distinct-character counts.
    Raises CorpusTooSmall, writing nothing, when it is shorter than ``min_bytes``."""
    text = build_text()
    data = text.encode("utf-8")
    if len(data) < min_bytes:
        raise CorpusTooSmall(f"this Python ({sys.version.split()[0]}) yields {len(data):,} "
                             f"bytes of documentation, fewer than --min-bytes {min_bytes:,}")
    with open(path, "wb") as handle:
        handle.write(data)
    return {"bytes": len(data), "characters": len(text), "distinct_characters": len(set(text))}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, metavar="PATH", help="the text file to write")
    parser.add_argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES,
                        help=f"fail unless the text has at least this many bytes "
                             f"(default {DEFAULT_MIN_BYTES:,})")
    args = parser.parse_args(argv)
    try:
        counts = write_corpus(args.out, args.min_bytes)
    except CorpusTooSmall as exc:
        print(f"make_corpus: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {counts['bytes']:,} bytes, {counts['characters']:,} characters, "
          f"{counts['distinct_characters']} distinct characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
