"""Containers: ``Sequential`` (chains modules) and ``ModuleList`` (holds them)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Optional, Union

from .module import Module


def _index(index: int, length: int, owner: str) -> int:
    if not -length <= index < length:
        raise IndexError(f"index {index} is out of range for {owner} of length {length}")
    return index % length


class Sequential(Module):
    """Calls its modules in order, feeding each output to the next.

    ``Sequential(a, b, c)`` names them "0", "1", "2"; ``Sequential(OrderedDict(...))`` keeps the
    given names.
    """

    def __init__(self, *modules: Any) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.register_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.register_module(str(i), module)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        return items[_index(index, len(items), "Sequential")][1]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> "Sequential":
        self.register_module(str(len(self)), module)
        return self

    def forward(self, x: Any) -> Any:
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleList(Module):
    """A list of submodules registered under "0", "1", ...; indexable and iterable."""

    def __init__(self, modules: Optional[Iterable[Module]] = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        values = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(values[index])
        return values[_index(index, len(values), "ModuleList")]

    def __setitem__(self, index: int, module: Module) -> None:
        self.register_module(str(_index(index, len(self), "ModuleList")), module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> "ModuleList":
        self.register_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self
