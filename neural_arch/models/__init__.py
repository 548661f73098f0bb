"""Ready-made models."""
from .gpt import GPT, GPTConfig
from .mlp import MLP
from .resnet import BasicBlock, ResNet, resnet8, resnet20

__all__ = ["MLP", "GPT", "GPTConfig", "ResNet", "BasicBlock", "resnet8", "resnet20"]
