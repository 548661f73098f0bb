"""Names a module offers but imports only on first use (PEP 562 module ``__getattr__``).

Several entry points (``neural_arch.distributed``, its ``ddp`` package, torch's paths such as
``neural_arch.nn.parallel``) name classes whose modules are heavy or bring in
``neural_arch.distributed``; importing them eagerly would slow every ``import`` and break the
rule that model code runs without ``distributed``. ``lazy_names`` builds the two module-level
functions that do this once, so each entry point only lists its table.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple


def lazy_names(module_name: str, table: Dict[str, str],
               fallback: Optional[Callable[[str], Any]] = None
               ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for the module ``module_name``, being imported: a name in
    ``table`` (name -> module path, relative to the module's package or absolute) is imported
    on first access and kept in the module's namespace; any other name goes to ``fallback``
    (which returns None when it has nothing either), then is an AttributeError."""
    namespace = sys.modules[module_name].__dict__
    anchor = namespace["__package__"]

    def __getattr__(name: str) -> Any:
        path = table.get(name)
        if path is None:
            found = fallback(name) if fallback is not None else None
            if found is None:
                raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
            return found
        value = namespace[name] = getattr(importlib.import_module(path, anchor), name)
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
