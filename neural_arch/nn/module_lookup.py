"""Finding a module's parts by dotted name (``get_submodule`` / ``get_parameter`` /
``get_buffer``) and the switches over all gradients (``requires_grad_``, ``zero_grad``): a base of
``Module``, kept apart so that registration and traversal stay in one readable file."""
from __future__ import annotations

from typing import Any, Tuple

from ..core.grad_reset import zero_grads


class ModuleLookups:
    """The lookups of ``torch.nn.Module``, built on ``_modules``/``_parameters``/``_buffers``."""

    def get_submodule(self, target: str) -> Any:
        """The descendant at the dotted path ``target`` ("" is this module); AttributeError
        names the first missing part, as PyTorch."""
        if target == "":
            return self
        module = self
        for item in target.split("."):
            children = module.__dict__.get("_modules", {})
            if item not in children or children[item] is None:
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}` "
                                     f"(looking up '{target}')")
            module = children[item]
        return module

    def _owner_and_name(self, target: str) -> Tuple[Any, str]:
        module_path, _, name = target.rpartition(".")
        return self.get_submodule(module_path), name

    def get_parameter(self, target: str) -> Any:
        """The parameter at the dotted path ``target`` (e.g. "encoder.0.weight")."""
        owner, name = self._owner_and_name(target)
        if name not in owner._parameters:
            kind = "buffer" if name in owner._buffers else "attribute"
            if kind == "attribute" and not hasattr(owner, name):
                raise AttributeError(f"{type(owner).__name__} has no attribute `{name}` "
                                     f"(looking up '{target}')")
            raise AttributeError(f"`{name}` is not an nn.Parameter (looking up '{target}')")
        return owner._parameters[name]

    def get_buffer(self, target: str) -> Any:
        """The buffer at the dotted path ``target``."""
        owner, name = self._owner_and_name(target)
        if name not in owner._buffers:
            if not hasattr(owner, name):
                raise AttributeError(f"{type(owner).__name__} has no attribute `{name}` "
                                     f"(looking up '{target}')")
            raise AttributeError(f"`{name}` is not a buffer (looking up '{target}')")
        return owner._buffers[name]

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """Set ``requires_grad`` on every parameter (e.g. to freeze a part); returns self."""
        for param in self.parameters():
            param.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (or zero it in place with ``set_to_none=False``)."""
        zero_grads(self.parameters(), set_to_none)
