"""Stand-ins that let a class body name functions of modules that import the class.

``Tensor``'s operators are the functions of the ``ops_*`` modules, and those modules import
``Tensor``: they cannot be loaded while its class body runs. So the body names each function
through an ``OpRef`` (``_ew.add`` for ``ops_elementwise.add``), where a reader sees it, and
``bind_op_refs`` later puts the function itself on the class. Afterwards ``t + u`` calls
``ops_elementwise.add`` directly, as a plain class attribute: nothing stays in between.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Iterable


class OpRef:
    """The name of function ``function`` in module ``module`` (the module's last name part)."""

    __slots__ = ("module", "function")

    def __init__(self, module: str, function: str = "") -> None:
        self.module, self.function = module, function

    def __getattr__(self, function: str) -> "OpRef":
        return OpRef(self.module, function)

    def __repr__(self) -> str:
        return f"OpRef({self.module}.{self.function})"


def bind_op_refs(cls: type, modules: Iterable[ModuleType]) -> None:
    """Replace every ``OpRef`` on ``cls``, plain or as a property's getter, by its function."""
    by_name = {module.__name__.rpartition(".")[2]: module for module in modules}

    def resolve(attr: str, ref: OpRef) -> Any:
        function = getattr(by_name.get(ref.module), ref.function, None)
        if function is None:
            raise ImportError(f"{cls.__name__}.{attr} names {ref.module}.{ref.function}, "
                              f"which is not a function of {sorted(by_name)}")
        return function

    for attr, value in list(vars(cls).items()):
        if type(value) is OpRef:
            setattr(cls, attr, resolve(attr, value))
        elif type(value) is property and type(value.fget) is OpRef:
            setattr(cls, attr, property(resolve(attr, value.fget), doc=value.__doc__))


__all__ = ["OpRef", "bind_op_refs"]
