"""``neural_arch.nn.functional``: torch's path to the functional API.

Ported scripts say ``import torch.nn.functional as F``; this module is where that line points
once ``torch`` is ``neural_arch``. The functions are ``neural_arch.functional``'s own (the same
objects), so either import gives the same behaviour.
"""
from ..functional import *  # noqa: F401,F403
from ..functional import __all__  # noqa: F401
