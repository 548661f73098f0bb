"""Environment variables read on hot paths (every tensor built, every fused-op call)."""
from __future__ import annotations

import os
from typing import Any, Callable


def raw_reader(name: str) -> Callable[[], Any]:
    """A function returning ``name``'s raw value (bytes on POSIX; None when unset) in about
    20 ns: ``os.environ.get`` costs ~0.7 us when the variable is unset, as it raises and catches
    KeyError. It reads the mapping behind ``os.environ``, so it sees every change made through
    it (``monkeypatch.setenv`` included). Callers cache what they parse, keyed on this value."""
    key = os.environ.encodekey(name)

    def read() -> Any:
        try:
            return os.environ._data.get(key)  # type: ignore[attr-defined]
        except AttributeError:  # os.environ replaced by a plain mapping
            return os.environ.get(name)
    return read
