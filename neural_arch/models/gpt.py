"""A nanoGPT-style decoder-only transformer language model."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from .. import functional as F
from ..core import Tensor, is_grad_enabled, no_grad
from ..core.random import get_rng
from ..nn import (GELU, CausalSelfAttention, Dropout, Embedding, LayerNorm, Linear, Module,
                  ModuleList, init)
from ..utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True  # the LM head shares the token embedding matrix (as GPT-2)
    # recompute the blocks' activations during backward instead of keeping them (training
    # only; every block but the last): less memory for about one more forward of the blocks
    gradient_checkpointing: bool = False


class FeedForward(Module):
    """Linear(C, 4C) -> GELU -> Linear(4C, C) -> Dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = GELU()
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config.n_embd, config.n_head, config.dropout, config.bias)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = FeedForward(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _token_array(tokens: Any) -> Any:
    """The array behind token ids: a Tensor's data or an array as it is (NumPy or CuPy, so ids
    already on the GPU stay there), anything else through NumPy."""
    data = tokens.array if isinstance(tokens, Tensor) else tokens
    return data if hasattr(data, "shape") and hasattr(data, "dtype") else np.asarray(data)


def _refuse_removed(removed: dict) -> None:
    """``GPT(config, tp_group=...)`` built a different model under this name; now a clear
    error says where tensor parallelism went."""
    moved = sorted(set(removed) & {"tp_group", "sequence_parallel"})
    if moved:
        raise TypeError(f"GPT() no longer takes {', '.join(moved)}: build the dense GPT(config) "
                        "and split it with neural_arch.distributed.tensor_parallel."
                        "parallelize_gpt(model, tp_mesh, sequence_parallel=...)")
    if removed:
        raise TypeError(f"GPT() got an unexpected keyword argument '{sorted(removed)[0]}'")


class GPT(Module):
    """Token + position embeddings, ``n_layer`` blocks, final LayerNorm and the LM head.

    Initialised as nanoGPT: N(0, 0.02) weights, zero biases, and residual projections scaled
    by ``1/sqrt(2 * n_layer)``.

    Tensor parallelism is applied from outside, on a built model:
    ``neural_arch.distributed.tensor_parallel.parallelize_gpt(model, tp_mesh)`` splits it in
    place (``forward`` then returns this rank's vocabulary shard of the logits, with the loss
    of the full vocabulary); ``_loss`` and ``_next_token_logits`` are where it differs.
    """

    def __init__(self, config: GPTConfig, **removed: Any) -> None:
        super().__init__()
        _refuse_removed(removed)
        if config.n_embd % config.n_head != 0:
            raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head "
                             f"({config.n_head})")
        self.config = config
        self.wte = Embedding(config.vocab_size, config.n_embd)
        self.wpe = Embedding(config.block_size, config.n_embd)
        self.drop = Dropout(config.dropout)
        self.h = ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (Linear, Embedding)):
                init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, Linear) and module.bias is not None:
                init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.h:
            init.normal_(block.attn.c_proj.weight, 0.0, residual_std)
            init.normal_(block.mlp.c_proj.weight, 0.0, residual_std)

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Parameter count, without the position embeddings by default (as nanoGPT)."""
        total = sum(p.array.size for p in self.parameters())
        return total - self.wpe.weight.array.size if non_embedding else total

    def forward(self, idx: Any, targets: Any = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits (batch, time, vocab) and, given int targets (batch, time), the mean
        cross-entropy (targets of -1 are ignored)."""
        idx_data = _token_array(idx)
        if idx_data.ndim != 2 or idx_data.dtype.kind not in "iu":
            raise ValueError(f"GPT expects integer token ids of shape (batch, time), got "
                             f"{idx_data.dtype} {idx_data.shape}")
        time = idx_data.shape[1]
        if time > self.config.block_size:
            raise ValueError(f"sequence length {time} exceeds block_size {self.config.block_size}")
        positions = np.arange(time, dtype=np.int64)
        x = self.drop(self.wte(idx_data) + self.wpe(positions))
        recompute = self.config.gradient_checkpointing and self.training and is_grad_enabled()
        last = len(self.h) - 1
        for i, block in enumerate(self.h):
            # The last block keeps its activations: backward would recompute it first thing;
            # one block's worth of memory buys one forward of it per step.
            x = checkpoint(block, x) if recompute and i < last else block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        target_data = _token_array(targets)
        if target_data.shape != idx_data.shape:
            raise ValueError(f"targets shape {target_data.shape} does not match idx shape "
                             f"{idx_data.shape}")
        return logits, self._loss(logits, target_data)

    def _loss(self, logits: Tensor, targets: Any) -> Tensor:
        """The mean cross-entropy of ``logits`` (batch, time, vocab) against ``targets``
        (batch, time); targets of -1 are ignored."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               targets.reshape(-1).astype(np.int64), ignore_index=-1)

    def load_dense_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """Load a dense GPT's ``state_dict()``: here ``load_state_dict``; a tensor-parallel GPT
        takes its shards of it."""
        return self.load_state_dict(state_dict, strict)

    def dense_state_dict(self) -> Any:
        """The dense GPT's ``state_dict()``: here ``state_dict()``; a tensor-parallel GPT
        gathers its shards."""
        return self.state_dict()

    def _next_token_logits(self, context: Any) -> Tensor:
        """The logits (batch, vocab) that follow ``context``, over the whole vocabulary."""
        return self(context)[0][:, -1, :]

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, rng: Optional[np.random.Generator] = None) -> Any:
        """Append ``max_new_tokens`` sampled tokens to ``idx`` (batch, time); the context is
        cropped to ``block_size``. Returns the same kind (array or Tensor) as ``idx``."""
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        rng = get_rng() if rng is None else rng
        tokens = np.array(idx.array if isinstance(idx, Tensor) else idx, dtype=np.int64)
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    context = tokens[:, -self.config.block_size:]
                    logits = self._next_token_logits(context)
                    last = np.asarray(logits.numpy(), dtype=np.float64) / temperature
                    if top_k is not None:
                        k = min(int(top_k), last.shape[-1])
                        kth = np.sort(last, axis=-1)[:, -k][:, None]
                        last = np.where(last < kth, -np.inf, last)
                    probs = np.exp(last - last.max(axis=-1, keepdims=True))
                    probs /= probs.sum(axis=-1, keepdims=True)
                    nxt = np.array([rng.choice(len(p), p=p) for p in probs], dtype=np.int64)
                    tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        finally:
            self.train(was_training)
        return Tensor(tokens, dtype=np.int64) if isinstance(idx, Tensor) else tokens
