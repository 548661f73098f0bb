"""Neural-network building blocks: ``Module``, layers, losses, initialisers, safetensors I/O."""
from . import functional, init  # ``functional``: the functional API at torch's path
from .activation import GELU, ReLU, Sigmoid, Softmax, Tanh
from .attention import CausalSelfAttention, MultiheadAttention
from .container import ModuleList, Sequential
from .dropout import Dropout
from .embedding import Embedding
from .linear import Flatten, Identity, Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import IncompatibleKeys, Module
from .normalization import LayerNorm
from .parameter import Parameter
from .serialization import load_state_dict_file, save_state_dict

__all__ = [
    "Module", "Parameter", "IncompatibleKeys", "Linear", "Identity", "Flatten", "ReLU", "GELU",
    "Tanh", "Sigmoid", "Softmax", "Dropout", "LayerNorm", "Embedding", "CausalSelfAttention",
    "MultiheadAttention", "Sequential", "ModuleList", "CrossEntropyLoss", "MSELoss", "init",
    "functional",
    "save_state_dict", "load_state_dict_file",
]
