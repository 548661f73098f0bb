"""A GPT trained with pipeline parallelism: one stage per process, 1F1B over micro-batches.

Every rank builds the same GPT (same seed), cuts it into one stage per rank with
``pipeline_split`` (the first stage also embeds tokens, the last also runs the LM head; the
tied embedding's gradient is exchanged between them after each step), and runs the schedule:
the first rank feeds the batch, the last gets the targets and the losses. Each rank's
optimizer updates its own stage. At the end the first rank writes the timeline of the last
step as a Chrome/Perfetto trace (and a PNG when matplotlib is installed).

    python -m neural_arch.distributed.launcher --standalone --nproc_per_node=2 --backend=shm \\
        examples/train_pipeline_gpt.py --steps 20 --microbatches 4 [--schedule gpipe|1f1b]
"""
import argparse

import numpy as np

from neural_arch import distributed as dist
from neural_arch import functional as F
from neural_arch.core import manual_seed
from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                bubble_fraction, pipeline_split,
                                                plot_timeline, write_chrome_trace)
from neural_arch.models import GPT, GPTConfig
from neural_arch.optim import AdamW


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           np.asarray(targets).reshape(-1).astype(np.int64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    args = parser.parse_args()

    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    manual_seed(0)  # every rank builds the same model and keeps its own stage of it
    config = GPTConfig(block_size=32, vocab_size=65, n_layer=max(4, world), n_head=4, n_embd=64)
    stage = PipelineStage(pipeline_split(GPT(config), world)[rank], rank, world)
    kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = kind(stage, args.microbatches, loss_fn=lm_loss)
    opt = AdamW(stage.submodule.parameters(), lr=3e-3)

    rng = np.random.default_rng(1)  # every rank draws the same batches; each uses its part
    for step in range(args.steps):
        # a toy task: predict the next token of a repeating sequence
        start = rng.integers(0, config.vocab_size, (args.batch, 1))
        tokens = (start + np.arange(config.block_size + 1)) % config.vocab_size
        x, y = tokens[:, :-1], tokens[:, 1:]
        opt.zero_grad()
        losses = []
        if world == 1:
            schedule.step(x, target=y, losses=losses)
        elif rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        if losses:
            print(f"step {step}: loss {np.mean([loss.item() for loss in losses]):.4f}",
                  flush=True)

    events = schedule.timeline()  # every stage's passes of the last step, on every rank
    if rank == 0:
        print(f"bubble of the last step: {bubble_fraction(events):.0%}")
        print("wrote", write_chrome_trace(events, "pipeline_trace.json"))
        try:
            print("wrote", plot_timeline(events, "pipeline_timeline.png"))
        except ImportError as exc:
            print(f"no PNG: {exc}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
