"""How the Trainer gets its batches and turns one into a loss: the loader split over the
data-parallel ranks, and the forward conventions it accepts."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..backends import backend_for
from ..core import Tensor
from ..data import DataLoader
from ..distributed import DistributedSampler


def shard_loader(loader: Any, world: int, rank: int, shuffle: Optional[bool],
                 seed: int) -> Any:
    """``loader`` reading this rank's share through a ``DistributedSampler``.

    A plain ``DataLoader`` is rebuilt with one at every world size, one process included: the
    sampler's shuffle depends on ``seed + epoch`` only, so the same global batches come out at
    any world size, and its state (the epoch) is what a checkpoint needs to resume. A loader
    that already has a ``DistributedSampler`` is used as it is."""
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        return loader
    if not isinstance(loader, DataLoader) or sampler is not None:
        if world > 1:
            raise ValueError(f"Trainer: with {world} data-parallel ranks the loader must be a "
                             f"DataLoader without a sampler (the Trainer adds a "
                             f"DistributedSampler) or one with a DistributedSampler, got "
                             f"{type(loader).__name__} with sampler {type(sampler).__name__}")
        return loader
    shuffle = loader.shuffle if shuffle is None else shuffle
    sampler = DistributedSampler(len(loader.dataset), num_replicas=world, rank=rank,
                                 shuffle=bool(shuffle), seed=seed)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                      drop_last=loader.drop_last, collate_fn=loader.collate_fn,
                      **loader.worker_options())


def batch_size_of(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 1


def forward(model: Any, batch: Any, loss_fn: Optional[Callable]) -> Tuple[Any, Tensor, Any]:
    """(output, loss, target) of one batch ``(inputs, target)``.

    With a ``loss_fn``: ``loss_fn(model(inputs), target)``. Without: ``model(inputs, target)``
    returns the loss, or ``(output, loss)`` as ``GPT`` does."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        size = len(batch) if hasattr(batch, "__len__") else "?"
        raise ValueError(f"Trainer expects batches (inputs, target), got "
                         f"{type(batch).__name__} of {size} items")
    inputs, target = batch
    if loss_fn is not None:
        output = model(inputs)
        return output, loss_fn(output, target), target
    result = model(inputs, target)
    if isinstance(result, (tuple, list)):
        output, loss = result[0], result[-1]
    else:
        output, loss = None, result
    if not isinstance(loss, Tensor):
        raise TypeError(f"Trainer without loss_fn: model(inputs, target) must return the loss "
                        f"Tensor or (output, loss), got {type(result).__name__}")
    return output, loss, target


def correct_predictions(output: Any, target: Any,
                        predict: Optional[Callable] = None) -> Tuple[float, float]:
    """(correct, counted) of argmax predictions, when the output is class scores over the
    target's shape (a classifier's (N, C) for (N,), a language model's (B, T, V) for (B, T));
    (0, 0) otherwise. ``predict(scores)``, when given, replaces the argmax: a model's own
    (a tensor-parallel GPT's scores are its shard of the vocabulary)."""
    if output is None or target is None:
        return 0.0, 0.0
    scores = output.array if isinstance(output, Tensor) else output
    labels = target.array if isinstance(target, Tensor) else target
    labels = backend_for(labels).to_numpy(labels)
    if labels.dtype.kind not in "iu" or scores.ndim != labels.ndim + 1 \
            or tuple(scores.shape[:-1]) != labels.shape:
        return 0.0, 0.0
    predicted = scores.argmax(axis=-1) if predict is None else predict(scores)
    predicted = backend_for(predicted).to_numpy(predicted)  # a GPU model's, copied back
    valid = labels >= 0  # -1 marks ignored positions (as cross_entropy's ignore_index)
    hits = (predicted == labels) & valid
    return float(hits.sum()), float(valid.sum())
