"""Containers: ``Sequential`` (chains modules), ``ModuleList`` and ``ModuleDict`` (hold them),
``ParameterList`` and ``ParameterDict`` (hold parameters)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping, Optional, Tuple, Union

from ..core import Tensor
from .module import Module
from .parameter import Parameter


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


def _check_key(owner: Module, key: Any, table: dict) -> str:
    """torch's rule: a key may not shadow an attribute or method of the container."""
    if not isinstance(key, str):
        raise TypeError(f"{type(owner).__name__} keys must be strings, got {type(key).__name__}")
    if key not in table and hasattr(owner, key):
        raise KeyError(f"attribute '{key}' already exists on {type(owner).__name__}")
    return key


def _pairs(values: Any, owner: str, sort_plain_dicts: bool) -> Iterator[Tuple[Any, Any]]:
    """(key, value) pairs of a mapping or of an iterable of pairs. ParameterDict sorts a plain
    dict's keys, ModuleDict keeps their order: both as PyTorch."""
    if isinstance(values, Mapping):
        items = values.items()
        plain = not isinstance(values, (OrderedDict, Module))
        return iter(sorted(items) if sort_plain_dicts and plain else items)
    pairs = []
    for j, pair in enumerate(values):
        if not isinstance(pair, Iterable) or len(pair) != 2:
            raise ValueError(f"{owner}.update: element #{j} must be a (key, value) pair, got "
                             f"{pair!r}")
        pairs.append(tuple(pair))
    return iter(pairs)


class ModuleDict(Module):
    """Submodules by name, in insertion order; ``state_dict`` keys are "name.weight", ..."""

    def __init__(self, modules: Optional[Any] = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.register_module(_check_key(self, key, self._modules), module)

    def __delitem__(self, key: str) -> None:
        if key not in self._modules:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def clear(self) -> None:
        for key in list(self._modules):
            del self[key]

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def items(self) -> Iterable[Tuple[str, Module]]:
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def update(self, modules: Any) -> None:
        for key, module in _pairs(modules, "ModuleDict", sort_plain_dicts=False):
            self[key] = module


def _as_parameter(value: Any, owner: str) -> Parameter:
    """A Parameter as is; any other Tensor or array becomes one (trainable), as PyTorch."""
    if isinstance(value, Parameter):
        return value
    if isinstance(value, Tensor) or hasattr(value, "__array__") \
            or hasattr(value, "__cuda_array_interface__"):
        return Parameter(value)
    raise TypeError(f"{owner} holds tensors, got a {type(value).__name__}")


class ParameterList(Module):
    """Parameters registered under "0", "1", ...; indexable and iterable like a list."""

    def __init__(self, values: Optional[Iterable[Any]] = None) -> None:
        super().__init__()
        if values is not None:
            self.extend(values)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        values = list(self._parameters.values())
        if isinstance(index, slice):
            return ParameterList(values[index])
        return values[_index(index, len(values), "ParameterList")]

    def __setitem__(self, index: int, value: Any) -> None:
        name = str(_index(index, len(self), "ParameterList"))
        self.register_parameter(name, _as_parameter(value, "ParameterList"))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._parameters.values())

    def append(self, value: Any) -> "ParameterList":
        self.register_parameter(str(len(self)), _as_parameter(value, "ParameterList"))
        return self

    def extend(self, values: Iterable[Any]) -> "ParameterList":
        for value in values:
            self.append(value)
        return self


class ParameterDict(Module):
    """Parameters by name, in insertion order (a plain dict given to the constructor or
    ``update`` is taken in sorted key order, as PyTorch); ``state_dict`` keys are the names."""

    def __init__(self, parameters: Optional[Any] = None) -> None:
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.register_parameter(_check_key(self, key, self._parameters),
                                _as_parameter(value, "ParameterDict"))

    def __delitem__(self, key: str) -> None:
        if key not in self._parameters:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def __contains__(self, key: object) -> bool:
        return key in self._parameters

    def clear(self) -> None:
        for key in list(self._parameters):
            del self[key]

    def pop(self, key: str) -> Parameter:
        value = self[key]
        del self[key]
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self._parameters.get(key, default)

    def keys(self) -> Iterable[str]:
        return self._parameters.keys()

    def items(self) -> Iterable[Tuple[str, Parameter]]:
        return self._parameters.items()

    def values(self) -> Iterable[Parameter]:
        return self._parameters.values()

    def update(self, parameters: Any) -> None:
        for key, value in _pairs(parameters, "ParameterDict", sort_plain_dicts=True):
            self[key] = value
