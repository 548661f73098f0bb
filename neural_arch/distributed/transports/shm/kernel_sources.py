"""The files each cached shared-memory kernel module is compiled from, and the cache's refresh.

Numba's cache stamps a kernel by its own file only, while ``entry_kernels`` and
``pair_kernels`` call the compiled functions of ``kernels`` (which calls ``byte_copies``) and
all of them read the constants of ``layout``, frozen into their machine code.
``refresh_cache`` drops a kernel module's cached machine code when one of those files
changed since it was cached (``backends.compiled_cache``); ``compiled`` and ``pair_rounds`` call
it once, before the module's first use. Importing this module hashes those files (``compiled``
imports it, and the kernel modules only later, on first use): a process whose files change after
that compiles its kernels without touching their cache, since the code it imports may be either.
Importing this module does not import Numba.
"""
from __future__ import annotations

import os
import sys
from types import ModuleType

from ....backends import compiled_cache

_FOLDER = os.path.dirname(os.path.abspath(__file__))
_SHARED = ("kernels", "byte_copies", "layout")
# each cached kernel module that calls another module's compiled code or reads its constants:
# the modules of this package its machine code is built from, its own first
BUILT_FROM = {
    "kernels": _SHARED,
    "entry_kernels": ("entry_kernels", *_SHARED),
    "pair_kernels": ("pair_kernels", *_SHARED),
}


def _paths(name: str) -> list:
    return [os.path.join(_FOLDER, f"{source}.py") for source in BUILT_FROM[name]]


compiled_cache.remember(path for name in BUILT_FROM for path in _paths(name))


def refresh_cache(module: ModuleType) -> None:
    """Before ``module`` (a kernel module named in ``BUILT_FROM``) first runs: drop its cached
    machine code, and that of the kernel modules it calls, where a file it is built from changed
    since it was cached."""
    short = module.__name__.rpartition(".")[2]
    if short not in BUILT_FROM:
        raise ValueError(f"refresh_cache: {module.__name__} is not a kernel module of "
                         f"{__package__} ({', '.join(BUILT_FROM)})")
    for name in BUILT_FROM[short]:
        kernel_module = module if name == short else sys.modules.get(f"{__package__}.{name}")
        if name in BUILT_FROM and kernel_module is not None:
            compiled_cache.refresh_if_stale(compiled_cache.module_dispatchers(kernel_module),
                                            _paths(name), kernel_module.__name__)
