"""``Module``: the base of every layer, with registration of parameters, buffers and children
(the state dict is in ``module_state``, the lookups by dotted name in ``module_lookup``, the
device and dtype conversions such as ``to`` in ``module_casting``)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from .module_casting import ModuleCasting
from .module_lookup import ModuleLookups
from .module_state import IncompatibleKeys, ModuleState
from .parameter import Parameter

__all__ = ["IncompatibleKeys", "Module"]


class Module(ModuleLookups, ModuleState, ModuleCasting):
    """Base class: assign ``Parameter``s and ``Module``s as attributes and they are registered
    (in assignment order); define ``forward`` and call the module.

    Registered objects live in the ``_parameters`` / ``_buffers`` / ``_modules`` tables and are
    mirrored in the instance ``__dict__``, so reading ``self.weight`` in a hot ``forward`` is a
    plain attribute lookup. Always change them through attribute assignment or ``register_*``.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' before Module.__init__() is called in "
                f"{type(self).__name__}.__init__")
        params, modules, buffers = self._parameters, self._modules, self._buffers
        if isinstance(value, Parameter):
            self._forget(name)
            self._store(params, name, value)
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign a {type(value).__name__} to parameter '{name}' "
                                f"(nn.Parameter or None expected)")
            self._store(params, name, None)
        elif isinstance(value, Module):
            self._forget(name)
            self._store(modules, name, value)
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign a {type(value).__name__} to submodule '{name}' "
                                f"(nn.Module or None expected)")
            self._store(modules, name, None)
        elif name in buffers:
            self._store(buffers, name, value)
        else:
            object.__setattr__(self, name, value)

    def _store(self, table: Dict[str, Any], name: str, value: Any) -> None:
        table[name] = value
        self.__dict__[name] = value

    def _forget(self, name: str) -> None:
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        self._non_persistent.discard(name)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, e.g. for an object restored without its mirror.
        for table in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(table)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        if any(name in table for table in (self._parameters, self._buffers, self._modules)):
            self._forget(name)
            return
        object.__delattr__(self, name)

    def _check_new_name(self, name: str, table: Dict[str, Any]) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"names must be non-empty strings without '.', got {name!r}")
        for other in (self._parameters, self._buffers, self._modules):
            if other is not table and name in other:
                raise KeyError(f"'{name}' is already registered on {type(self).__name__}")

    def register_parameter(self, name: str, param: Optional[Parameter]) -> None:
        """Register ``param`` (or a None placeholder, e.g. a disabled bias) under ``name``."""
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot register a {type(param).__name__} as parameter '{name}' "
                            f"(wrap it in nn.Parameter)")
        self._check_new_name(name, self._parameters)
        self._store(self._parameters, name, param)

    def register_buffer(self, name: str, value: Any, persistent: bool = True) -> None:
        """Register non-trainable state (an array or Tensor); persistent ones go in state_dict."""
        self._check_new_name(name, self._buffers)
        self._store(self._buffers, name, value)
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def register_module(self, name: str, module: Optional["Module"]) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"cannot register a {type(module).__name__} as submodule '{name}'")
        self._check_new_name(name, self._modules)
        self._store(self._modules, name, module)

    add_module = register_module

    # ------------------------------------------------------------------ traversal
    def named_modules(self, memo: Optional[Set[int]] = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[Tuple[str, "Module"]]:
        """This module and every descendant (once each unless ``remove_duplicate=False``),
        depth first, with dotted names."""
        memo = set() if memo is None else memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                               remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[Tuple[str, "Module"]]:
        """Direct submodules, each once (a child under two names shows the first)."""
        seen: Set[int] = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        for _, child in self.named_children():
            yield child

    def _named_members(self, table: str, recurse: bool, unique: bool
                       ) -> Iterator[Tuple[str, Any]]:
        seen: Set[int] = set()
        owners = self.named_modules(remove_duplicate=unique) if recurse else iter([("", self)])
        for prefix, module in owners:
            for name, value in getattr(module, table).items():
                if value is None or (unique and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{prefix}.{name}" if prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[Tuple[str, Parameter]]:
        """(dotted name, parameter) in registration order; a shared parameter appears once.
        Each submodule is asked for its own, so one that overrides this (a sharding wrapper
        whose parameters are its shards) shows the same parameters inside a container."""
        if not remove_duplicate:
            for name, param in self._named_members("_parameters", recurse, unique=False):
                yield (f"{prefix}.{name}" if prefix else name), param
            return
        seen: Set[int] = set()
        for name, param in self._parameters.items():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                yield (f"{prefix}.{name}" if prefix else name), param
        if not recurse:
            return
        for child_name, child in self._modules.items():
            if child is None:
                continue
            child_prefix = f"{prefix}.{child_name}" if prefix else child_name
            for name, param in child.named_parameters(child_prefix):
                if id(param) not in seen:
                    seen.add(id(param))
                    yield name, param

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
                      ) -> Iterator[Tuple[str, Any]]:
        for name, buf in self._named_members("_buffers", recurse, unique=remove_duplicate):
            yield (f"{prefix}.{name}" if prefix else name), buf

    def buffers(self, recurse: bool = True) -> Iterator[Any]:
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    # ------------------------------------------------------------------ modes and devices
    def train(self, mode: bool = True) -> "Module":
        """Set training mode here and in every submodule; returns self."""
        if not isinstance(mode, bool):
            raise ValueError(f"training mode is expected to be boolean, got {mode!r}")
        for module in self.modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn`` on every submodule (children first) and on self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_repr}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n" + "\n".join(lines) + "\n)"

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))

    # ------------------------------------------------------------------ files
    def save(self, path: str) -> None:
        """Write ``state_dict()`` to a safetensors file."""
        from .serialization import save_state_dict
        save_state_dict(self, path)

    def load(self, path: str, strict: bool = True) -> IncompatibleKeys:
        """Load parameters and buffers from a safetensors file written by ``save``."""
        from .serialization import load_state_dict_file
        return self.load_state_dict(load_state_dict_file(path), strict=strict)
