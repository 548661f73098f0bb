"""Ready-made models."""
from .gpt import GPT, GPTConfig
from .mlp import MLP

__all__ = ["MLP", "GPT", "GPTConfig"]
