"""Attach the operations in ``ops_*`` to ``Tensor`` as methods and operators."""
from __future__ import annotations

def bind(tensor_class: type) -> None:
    from . import ops_elementwise as ew
    from . import ops_linalg as la
    from . import ops_reduce as rd
    from . import ops_shape as sh
    from .ops_misc import astype, clone, to

    table = {
        "__add__": ew.add, "__radd__": ew.add, "__sub__": ew.sub, "__rsub__": ew.rsub,
        "__mul__": ew.mul, "__rmul__": ew.mul, "__truediv__": ew.div, "__rtruediv__": ew.rdiv,
        "__pow__": ew.pow, "__rpow__": ew.rpow, "__neg__": ew.neg,
        "__matmul__": la.matmul, "__rmatmul__": la.rmatmul,
        "__lt__": ew.lt, "__le__": ew.le, "__gt__": ew.gt, "__ge__": ew.ge,
        "__eq__": ew.eq, "__ne__": ew.ne, "__and__": ew.logical_and, "__or__": ew.logical_or,
        "__xor__": ew.logical_xor, "__invert__": ew.logical_not, "__getitem__": sh.getitem,
        "add": ew.add, "sub": ew.sub, "mul": ew.mul, "div": ew.div, "pow": ew.pow,
        "neg": ew.neg, "matmul": la.matmul, "exp": ew.exp, "log": ew.log, "tanh": ew.tanh,
        "sqrt": ew.sqrt, "relu": ew.relu, "sigmoid": ew.sigmoid, "abs": ew.abs,
        "clip": ew.clip, "clamp": ew.clip, "lt": ew.lt, "le": ew.le, "gt": ew.gt, "ge": ew.ge,
        "eq": ew.eq, "ne": ew.ne,
        "sum": rd.sum, "mean": rd.mean, "max": rd.max, "min": rd.min, "var": rd.var,
        "std": rd.std, "argmax": rd.argmax, "argmin": rd.argmin,
        "reshape": sh.reshape, "view": sh.reshape, "transpose": sh.transpose,
        "permute": sh.permute, "swapaxes": sh.swapaxes, "unsqueeze": sh.unsqueeze,
        "squeeze": sh.squeeze, "expand": sh.expand, "broadcast_to": sh.expand,
        "flatten": sh.flatten, "masked_fill": sh.masked_fill,
        "astype": astype, "to": to, "clone": clone,
    }
    for name, fn in table.items():
        setattr(tensor_class, name, fn)
    tensor_class.T = property(lambda self: sh.transpose(self), doc="All axes reversed.")
    tensor_class.cpu = lambda self: to(self, "cpu")
    tensor_class.cuda = lambda self: to(self, "cuda")
    tensor_class.float = lambda self: astype(self, "float32")
    tensor_class.double = lambda self: astype(self, "float64")
    tensor_class.long = lambda self: astype(self, "int64")

