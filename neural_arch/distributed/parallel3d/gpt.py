"""One GPT trained with data, tensor and pipeline parallelism at once, on a dp x tp x pp mesh.

Each rank builds the dense GPT and splits it over its tp group (``parallelize_gpt``: its
tensor-parallel shards of every layer, the dense GPT's weights under the same seed), cuts it
with ``pipeline_split`` and keeps the stage of its ``pp`` coordinate (with
``schedule="interleaved"``, the ``v`` chunks ``pp, pp + p, ...``). A step then runs in three
layers, each on its own group of the mesh:

1. the global batch is cut along the batch dimension into one slice per ``dp`` replica;
2. the replica's pipeline runs its micro-batches through the stages over the ``pp`` group,
   each stage's layers exchanging partial sums over the ``tp`` group, and the last stage's loss
   is the vocabulary-parallel cross-entropy (full logits are never gathered);
3. every gradient is averaged over the ``dp`` group: each piece runs in a
   ``DistributedDataParallel``, the stage accumulating all micro-batches but the last in
   ``no_sync`` and the buckets averaging during the last one's backward; the norm of the whole
   model's gradient is taken (each rank's share summed over tp, then pp:
   ``tensor_parallel.grad_norm``; ``grad_norm`` keeps it), and with ``max_grad_norm`` the
   gradients are clipped by it; then the optimizer steps: a plain one over the stage's
   parameters, or with ``data_parallel="zero1"`` a ``ZeroRedundancyOptimizer`` that keeps each
   dp rank's share of the optimizer state only.

The gradients are those of the mean loss over the whole global batch, so the run matches one
dense process training on that batch (the tests check it to float tolerance, 8 processes).
``evaluate(idx, targets)`` runs the same stages forward only (no gradients, no step) and
returns the mean loss over the global batch, as ``train_step`` does.
Only the ranks with dp = 0 and tp = 0 print (``log``), one line per pipeline stage.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

import numpy as np

from ...core import Tensor, no_grad
from ...models.gpt import GPT, GPTConfig
from ...optim import AdamW, Optimizer
from .. import collectives
from ..ddp import DistributedDataParallel
from ..device_mesh import DeviceMesh
from ..pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                          pipeline_split)
from ..pipelining.plan import Msg
from ..pipelining.stage import start_tied_equal, tied_elsewhere
from ..pipelining.transfer import exchange
from ..reduce_ops import ReduceOp
from ..replicas import broadcast_module_state, check_replicas_agree
from ..tensor_parallel.clip_grad import clip_grad_norm_, grad_norm, norm_parameters
from ..tensor_parallel.gpt import parallelize_gpt, tensor_parallel_loss

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}
MESH_DIMS = ("dp", "tp", "pp")


def _unique(params) -> List[Any]:
    return list({id(p): p for p in params}.values())  # a tied matrix once


class GPT3D:
    """A GPT on ``mesh`` (dimensions named dp, tp, pp): ``train_step(idx, targets)`` takes the
    global batch on every rank and returns the mean loss over it, on every rank."""

    def __init__(self, config: GPTConfig, mesh: DeviceMesh, n_microbatches: int,
                 optimizer_class: Type[Optimizer] = AdamW, schedule: str = "1f1b",
                 chunks: int = 2, data_parallel: str = "ddp", dtype: Any = None,
                 max_grad_norm: Optional[float] = None, **optimizer_kwargs: Any) -> None:
        if not isinstance(mesh, DeviceMesh) or set(mesh.mesh_dim_names) != set(MESH_DIMS):
            got = getattr(mesh, "mesh_dim_names", type(mesh).__name__)
            raise ValueError(f"GPT3D needs a DeviceMesh with dimensions {MESH_DIMS}, got {got}")
        if schedule not in _SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(_SCHEDULES)}, got {schedule!r}")
        if data_parallel not in ("ddp", "zero1"):
            raise ValueError(f"data_parallel must be 'ddp' or 'zero1', got {data_parallel!r}")
        if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and
                                              0 < max_grad_norm < float("inf")):
            raise ValueError(f"max_grad_norm must be a positive number or None, got "
                             f"{max_grad_norm!r}")
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.grad_norm: Optional[float] = None  # the last step's, before any clipping
        self.config, self.mesh, self.n_microbatches = config, mesh, int(n_microbatches)
        self.schedule_name, self.data_parallel = schedule, data_parallel
        self.dp_group, self.tp_group, self.pp_group = (mesh.get_group(d) for d in MESH_DIMS)
        self.dp, self.tp, self.pp = (mesh.size(d) for d in MESH_DIMS)
        self.dp_rank, self.tp_rank, self.pp_rank = (mesh.get_local_rank(d) for d in MESH_DIMS)
        self.chunks = int(chunks) if schedule == "interleaved" else 1
        model = parallelize_gpt(GPT(config), self.tp_group)
        if dtype is not None:
            for p in _unique(model.parameters()):
                p.array = p.array.astype(dtype)
        num_stages = self.pp * self.chunks
        pieces = pipeline_split(model, num_stages)
        # where each piece's blocks start in the whole model (checkpoints use the dense keys)
        starts = np.cumsum([0] + [len(piece.h) for piece in pieces]).tolist()
        self.stage_indices = [self.pp_rank + c * self.pp for c in range(self.chunks)]
        self.pieces = [pieces[i] for i in self.stage_indices]
        self.block_offsets = [int(starts[i]) for i in self.stage_indices]
        self.num_stages = num_stages
        self.is_last = self.pp_rank == self.pp - 1
        # Data parallelism: each piece runs in a DistributedDataParallel over dp, whose buckets
        # average during the step's last backward of that piece, overlapping it (the stage
        # runs the earlier ones in no_sync). A parameter two pieces of this rank share (the tied
        # embedding at pp = 1, interleaved) would be averaged by both: then one flat all-reduce
        # after the pipeline's backward instead (``_average_gradients``).
        shared = sum(len(list(piece.parameters())) for piece in self.pieces) > len(
            _unique(p for piece in self.pieces for p in piece.parameters()))
        self.overlapped = self.dp > 1 and not shared
        if self.overlapped:  # each DDP checks its replicas agree and broadcasts rank 0's state
            runs = [DistributedDataParallel(piece, group=self.dp_group) for piece in self.pieces]
        else:
            runs = self.pieces
            for piece in self.pieces:  # replicas must start equal, whatever each rank's seed
                check_replicas_agree(piece, self.dp_group, "GPT3D")
                broadcast_module_state(piece, self.dp_group)
        stages = [PipelineStage(run, i, num_stages, group=self.pp_group)
                  for run, i in zip(runs, self.stage_indices)]
        tp_group = self.tp_group

        def loss_fn(logits, targets):
            return tensor_parallel_loss(logits, targets, tp_group)
        first = stages if schedule == "interleaved" else stages[0]
        self.schedule = _SCHEDULES[schedule](first, self.n_microbatches, loss_fn)
        self.stages = stages
        self.params = _unique(p for piece in self.pieces for p in piece.parameters())
        # this rank's share of the gradient norm: tensor-parallel duplicates and a weight tied
        # across stages count on one rank only
        elsewhere = tied_elsewhere(stages)
        self._norm_share = [p for piece in self.pieces for p in norm_parameters(piece)[0]
                            if id(p) not in elsewhere]
        if data_parallel == "zero1":
            from ..optim import ZeroRedundancyOptimizer
            self.optimizer = ZeroRedundancyOptimizer(self.params, optimizer_class,
                                                     process_group=self.dp_group,
                                                     **optimizer_kwargs)
        else:
            self.optimizer = optimizer_class(self.params, **optimizer_kwargs)
        self.steps = 0

    # ----- training ---------------------------------------------------------------------
    def _replica_slice(self, value: Any, what: str,
                       n_microbatches: Optional[int] = None) -> np.ndarray:
        micro = self.n_microbatches if n_microbatches is None else n_microbatches
        data = np.asarray(value.array if hasattr(value, "array") and not isinstance(
            value, np.ndarray) else value)
        rows = data.shape[0] if data.ndim else 0
        if rows % (self.dp * micro):
            raise ValueError(f"GPT3D: {what} has {rows} rows (shape {data.shape}), which does "
                             f"not split into dp={self.dp} replicas x {micro} "
                             "micro-batches")
        share = rows // self.dp
        return data[self.dp_rank * share:(self.dp_rank + 1) * share]

    def train_step(self, idx: Any, targets: Any) -> float:
        """One optimizer step on the global batch ``(idx, targets)`` (the same on every rank);
        returns the mean loss over the whole batch, on every rank."""
        x, y = self._replica_slice(idx, "idx"), self._replica_slice(targets, "targets")
        self.optimizer.zero_grad()
        losses: List[Any] = []
        first, last = self.pp_rank == 0, self.is_last
        if first and last:
            self.schedule.step(x, target=y, losses=losses)
        elif first:
            self.schedule.step(x)
        elif last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        if not self.overlapped:
            self._average_gradients()
        groups = (self.tp_group, self.pp_group)
        if self.max_grad_norm is None:
            self.grad_norm = grad_norm(self.params, counted=self._norm_share, groups=groups)
        else:
            self.grad_norm = float(clip_grad_norm_(self.params, self.max_grad_norm,
                                                   counted=self._norm_share, groups=groups))
        self.optimizer.step()
        self.steps += 1
        return self._global_loss(losses)

    def _average_gradients(self) -> None:
        """Each gradient averaged over the dp replicas: one all-reduce per dtype."""
        if self.dp == 1:
            return
        by_dtype: Dict[np.dtype, List[Any]] = {}
        for p in self.params:
            if p.grad is None:  # a part this stage did not use: zeros keep the replicas in step
                p.grad = np.zeros_like(p.array)
            by_dtype.setdefault(np.dtype(p.grad.array.dtype), []).append(p)
        for dtype, params in by_dtype.items():
            flat = np.concatenate([np.ravel(p.grad.array) for p in params])
            flat = flat.astype(dtype, copy=False)
            collectives.all_reduce(flat, op=ReduceOp.AVERAGE, group=self.dp_group)
            at = 0
            for p in params:
                p.grad = flat[at:at + p.grad.array.size].reshape(p.grad.array.shape)
                at += p.grad.array.size

    def _global_loss(self, losses: List[Any]) -> float:
        """The last stage's mean micro-batch loss, averaged over dp, sent along the pipeline."""
        value = np.zeros(1)
        if self.is_last:
            value[0] = float(np.mean([float(np.asarray(loss.array if hasattr(loss, "array")
                                                       else loss)) for loss in losses]))
            collectives.all_reduce(value, op=ReduceOp.AVERAGE, group=self.dp_group)
        collectives.broadcast(value, src=self.pp_group.ranks[-1], group=self.pp_group)
        return float(value[0])

    # ----- evaluation -------------------------------------------------------------------
    def evaluate(self, idx: Any, targets: Any, logits: Optional[List[Any]] = None) -> float:
        """The mean loss over the global batch ``(idx, targets)`` (the same on every rank), on
        every rank, without gradients or a step. Each dp replica runs its slice through the
        stages in stage order, whole (nothing is kept for a backward, so micro-batches would
        only add messages): the rows need only split into dp equal slices. Dropout is off.
        ``logits``: a list the last stage appends its output to (its replica's rows, its tp
        rank's shard of the vocabulary), for the caller's accuracy."""
        x = self._replica_slice(idx, "idx", n_microbatches=1)
        y = self._replica_slice(targets, "targets", n_microbatches=1)
        start_tied_equal(self.stages)  # as the first train_step does
        modes = [piece.training for piece in self.pieces]
        losses: List[Any] = []
        try:
            for piece in self.pieces:
                piece.eval()
            with no_grad():
                self._forward_stages(x, y, losses, logits)
        finally:
            for piece, mode in zip(self.pieces, modes):
                piece.train(mode)
        return self._global_loss(losses)

    def _forward_stages(self, x: np.ndarray, y: np.ndarray, losses: List[Any],
                        logits: Optional[List[Any]] = None) -> None:
        """This rank's stages in order, each taking the previous stage's activation (sent over
        the pp group when another rank ran it); the last stage appends the loss (and its
        output to ``logits``)."""
        value: Any = x
        for index in range(self.num_stages):
            if index % self.pp != self.pp_rank:
                continue
            if index > 0 and (index - 1) % self.pp != self.pp_rank:
                value = self._receive_activation(index)
            piece = self.pieces[self.stage_indices.index(index)]
            out = piece(value if index == 0 else Tensor(value))
            if index == self.num_stages - 1:
                losses.append(tensor_parallel_loss(out, y, self.tp_group))
                if logits is not None:
                    logits.append(out)
                return
            value = np.ascontiguousarray(out.array)
            if (index + 1) % self.pp != self.pp_rank:
                self._send_activation(value, index + 1)

    def _send_activation(self, value: np.ndarray, stage: int) -> None:
        msg = Msg("act", stage, 0, self.pp_rank, stage % self.pp)
        exchange(self.pp_group, [msg], [], {("act", stage, 0): value}, {})

    def _receive_activation(self, stage: int) -> np.ndarray:
        msg = Msg("act", stage, 0, (stage - 1) % self.pp, self.pp_rank)
        return exchange(self.pp_group, [], [msg], {}, {})[("act", stage, 0)]

    # ----- reporting and checkpoints ----------------------------------------------------
    @property
    def logs(self) -> bool:
        """Whether this rank prints: dp = 0 and tp = 0, one rank per pipeline stage."""
        return self.mesh.is_first_along("dp", "tp")

    def log(self, message: str) -> None:
        if self.logs:
            print(f"[pp {self.pp_rank}/{self.pp}] {message}", flush=True)

    def save(self, parent: str, name: Optional[str] = None) -> str:
        """Write every rank's piece into one checkpoint directory (collective); its path."""
        from .checkpoint import save_pieces
        return save_pieces(self, parent, name or f"ckpt-e0-s{self.steps}")

    def load(self, path: str) -> None:
        """Load this rank's piece of a checkpoint saved on the same mesh shape (collective)."""
        from .checkpoint import load_pieces
        load_pieces(self, path)

    def __repr__(self) -> str:
        return (f"GPT3D(dp={self.dp}, tp={self.tp}, pp={self.pp}, schedule="
                f"{self.schedule_name}, stages {self.stage_indices} of {self.num_stages})")
