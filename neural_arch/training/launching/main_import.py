"""What a worker runs of a script that trains at its top level, without
``if __name__ == "__main__":``.

Each worker is a fresh interpreter that first imports the parent's main script as
``__mp_main__`` (as multiprocessing's "spawn" does), so that what the recipe takes from
``__main__`` (the model's class, a loss function) resolves there. Unguarded, that import reaches
the script's training call again. ``stop_main_import`` ends the import at that call: it raises
``MainImportStopped`` carrying the script's namespace as it stands there (all it defined above
the call), which the launcher's worker bootstrap installs as ``__mp_main__``; then the worker
runs the recipe the parent sent. So each worker runs the script's top level up to its first
training call, and what follows the call runs only in the parent.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Dict, Optional, Tuple

MAIN_MODULE = "__mp_main__"  # the name under which a spawned worker imports the main script

# (script, line) where this worker's import of the main script stopped; None if it did not
stopped_at: Optional[Tuple[str, int]] = None


class MainImportStopped(BaseException):
    """Ends a worker's import of the main script at its training call. A BaseException, as
    SystemExit is, so that a script's ``except Exception:`` around the call lets it through.
    The launcher's bootstrap recognises it by ``main_namespace``: the script's globals."""

    def __init__(self, message: str, main_namespace: Dict[str, Any]) -> None:
        super().__init__(message)
        self.main_namespace = main_namespace


def importing_main() -> bool:
    """True while this process, a worker, still imports the main module (spawn's bootstrap)."""
    from multiprocessing import process
    return bool(getattr(process.current_process(), "_inheriting", False))


def stop_main_import(owner: str) -> None:
    """In a worker importing the main script, which has just reached its training call again:
    ends that import here, keeping what the script defined so far. Elsewhere it does nothing,
    so every training call that may start workers makes it first."""
    global stopped_at
    if not importing_main():
        return
    frame = _script_frame(sys._getframe(1))
    if frame is None:  # spawn imports the main script under MAIN_MODULE: not expected
        raise RuntimeError(f"{owner} was called while this worker process imports the main "
                           f"module, outside its top-level code; put the training under "
                           f"`if __name__ == \"__main__\":`")
    stopped_at = (frame.f_code.co_filename, frame.f_lineno)
    raise MainImportStopped(f"{owner}: this worker stops importing the main script at its "
                            f"training call ({stopped_at[0]}, line {stopped_at[1]}); it runs "
                            f"the parent's recipe instead", frame.f_globals)


def _script_frame(frame: Optional[types.FrameType]) -> Optional[types.FrameType]:
    """The main script's top-level frame among ``frame`` and its callers (the script may call
    the training from a function of its own)."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" \
                and frame.f_globals.get("__name__") == MAIN_MODULE:
            return frame
        frame = frame.f_back
    return None


def missing_from_main(error: AttributeError) -> Optional[RuntimeError]:
    """Why the recipe does not unpickle in a worker whose import of the main script stopped
    early: it names something the script defines only below its first training call."""
    if stopped_at is None or MAIN_MODULE not in str(error):
        return None
    path, line = stopped_at
    return RuntimeError(f"the training needs what the main script defines below its first "
                        f"training call: {error}; each worker ran {path} only up to line "
                        f"{line}, the first training call at its top level. Define what the "
                        f"training uses above that call, or put the training under "
                        f"`if __name__ == \"__main__\":`")
