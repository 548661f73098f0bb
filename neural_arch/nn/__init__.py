"""Neural-network building blocks: ``Module``, layers, losses, initialisers, safetensors I/O."""
from . import functional, init  # ``functional``: the functional API at torch's path
from .activation import GELU, ReLU, Sigmoid, Softmax, Tanh
from .attention import CausalSelfAttention, MultiheadAttention
from .batchnorm import BatchNorm1d, BatchNorm2d
from .channel_dropout import Dropout2d
from .container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from .conv import Conv1d, Conv2d
from .dropout import Dropout
from .embedding import Embedding
from .linear import Flatten, Identity, Linear
from .loss import CrossEntropyLoss, MSELoss
from .module import IncompatibleKeys, Module
from .normalization import LayerNorm
from .parameter import Parameter
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .rnn import GRU, LSTM, RNN, RNNBase
from .rnn_cell import GRUCell, LSTMCell, RNNCell, RNNCellBase
from .serialization import load_state_dict_file, save_state_dict
from . import utils  # torch.nn.utils: gradient clipping, parameters as one vector

__all__ = [
    "ModuleDict", "ParameterList", "ParameterDict", "utils",
    "Module", "Parameter", "IncompatibleKeys", "Linear", "Identity", "Flatten", "ReLU", "GELU",
    "Tanh", "Sigmoid", "Softmax", "Dropout", "LayerNorm", "Embedding", "CausalSelfAttention",
    "MultiheadAttention", "Sequential", "ModuleList", "CrossEntropyLoss", "MSELoss", "init",
    "functional",
    "save_state_dict", "load_state_dict_file",
    "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell",
    "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "BatchNorm1d",
    "BatchNorm2d", "Dropout2d",
]

# torch's ``nn.SyncBatchNorm`` lives in ``distributed`` (it needs collectives): named here but
# imported on first use, through its door module, so ``import neural_arch.nn`` stays without it
from .._lazy import lazy_names  # noqa: E402

__getattr__, __dir__ = lazy_names(__name__, {"SyncBatchNorm": ".sync_batchnorm"})
__all__ += ["SyncBatchNorm"]
