"""Time one training step of a GPT: neural_arch against the same model in PyTorch on the CPU.

A step is zero_grad, forward, mean cross-entropy over the next characters, backward and an
AdamW update, in float32 on one thread per process; at p = 2 both run data parallel (our
``DistributedDataParallel`` on shm, torch's on gloo) in the same two processes, each rank on
its own batch, and the slower rank's median counts. The torch model is nanoGPT's layout written here
(fused q | k | v, ``scaled_dot_product_attention(is_causal=True)``, exact GELU, the LM head tied
to the token embedding) and starts from neural_arch's weights; the first step's losses must
agree, or the run stops. Steps of the two are interleaved (in rotating order) so that machine
noise hits them alike; each reports the median.

With ``--baseline REF`` a third runner joins the rotation: the same step on neural_arch as
it was at git revision REF (``gpt_step_baseline.py``: a child process per rank), so one run
shows what a change gained against torch and against the code before it.

    python benchmarks/bench_gpt_step.py [--steps 20] [--world-sizes 1,2] [--quick]
        [--baseline REF] [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()  # before NumPy and torch are imported

import argparse  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

import bench_reporting as reporting  # noqa: E402
import gpt_step_baseline as baseline  # noqa: E402

from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.models import GPT, GPTConfig  # noqa: E402
from neural_arch.optim import AdamW  # noqa: E402

GOAL, FLOOR = 1.0, 1.15  # neural_arch / torch step time: the goal, and the most allowed
SECTION = "bench_gpt_step"
VOCAB, LR = 65, 1e-3
# (layers, heads, width, block, batch): the char GPT of the training program, and a wider one
CONFIGS = [(4, 4, 128, 64, 16), (6, 4, 256, 128, 8)]
QUICK = [(2, 2, 32, 16, 4)]


def _torch_gpt(torch, model: GPT, config: GPTConfig):
    """nanoGPT in torch, holding a copy of ``model``'s weights."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = config.n_embd
            self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            b, t, c = x.shape
            h = config.n_head
            qkv = self.c_attn(self.ln_1(x)).view(b, t, 3, h, c // h).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class TorchGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.h = nn.ModuleList(Block() for _ in range(config.n_layer))
            self.ln_f = nn.LayerNorm(config.n_embd)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # the tied LM head
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    theirs = TorchGPT()
    # our names -> theirs: only the blocks' projections are spelled differently
    rename = {"attn.c_attn": "c_attn", "attn.c_proj": "attn_proj", "mlp.c_fc": "c_fc",
              "mlp.c_proj": "mlp_proj"}
    state = {}
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":
            continue
        for ours, torch_name in rename.items():
            key = key.replace(f".{ours}.", f".{torch_name}.")
        state[key] = torch.from_numpy(np.array(value, dtype=np.float32))
    theirs.load_state_dict(state)
    return theirs


class Pair:
    """The same GPT, batch and optimizer in neural_arch and in torch."""

    def __init__(self, torch, sizes, data_seed: int = 1) -> None:
        self.sizes, self.data_seed = sizes, data_seed
        self.previous: Optional[baseline.BaselineStep] = None  # see with_baseline
        layers, heads, width, block, batch = sizes
        self.config = GPTConfig(vocab_size=VOCAB, n_layer=layers, n_head=heads, n_embd=width,
                                block_size=block)
        manual_seed(0)
        self.ours = GPT(self.config)
        self.opt = AdamW(list({id(p): p for p in self.ours.parameters()}.values()), lr=LR)
        rng = np.random.default_rng(data_seed)
        self.idx = rng.integers(0, VOCAB, (batch, block))
        self.targets = rng.integers(0, VOCAB, (batch, block))
        self.torch = torch
        self.theirs = _torch_gpt(torch, self.ours, self.config)
        self.topt = torch.optim.AdamW(self.theirs.parameters(), lr=LR, weight_decay=1e-2)
        self.tidx = torch.from_numpy(self.idx)
        self.ttargets = torch.from_numpy(self.targets)

    def ours_step(self) -> float:
        self.opt.zero_grad()
        _, loss = self.ours(self.idx, self.targets)
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def with_baseline(self, folder: Optional[str], job: Optional[dict] = None) -> "Pair":
        """Also time the earlier commit extracted in ``folder`` (None: no baseline)."""
        if folder is not None:
            self.previous = baseline.BaselineStep(folder, self.sizes, self.data_seed, job)
        return self

    def close(self) -> None:
        if self.previous is not None:
            self.previous.close()

    def torch_step(self) -> float:
        self.topt.zero_grad()
        loss = self.theirs(self.tidx, self.ttargets)
        loss.backward()
        self.topt.step()
        return float(loss.item())


def _agree(name: str, loss: float, reference: float) -> None:
    if abs(loss - reference) > 1e-4 * max(1.0, abs(reference)):
        raise RuntimeError(f"the models disagree on the first loss: neural_arch "
                           f"{reference:.6f}, {name} {loss:.6f}")


def time_pair(pair: Pair, steps: int, warmup: int) -> Dict[str, float]:
    first = pair.ours_step()
    _agree("torch", pair.torch_step(), first)
    runners: Dict[str, Callable[[], float]] = {"neural_arch": pair.ours_step,
                                               "torch": pair.torch_step}
    if pair.previous is not None:
        _agree("the baseline commit", pair.previous.first_loss, first)
        runners["previous"] = pair.previous.step
    return common.interleaved_step_ms(runners, steps, warmup)


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(job: Dict[str, object]) -> Dict[str, float]:
    """One rank of a p = 2 job: both models data parallel, timed side by side."""
    import torch
    from neural_arch import distributed as dist
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}",
                                         rank=rank, world_size=world)
    pair = Pair(torch, job["sizes"], data_seed=1 + rank)
    try:
        pair.ours = dist.DistributedDataParallel(pair.ours)
        pair.theirs = torch.nn.parallel.DistributedDataParallel(pair.theirs)
        pair.with_baseline(job["baseline"], dict(port=job["baseline_port"], world=world,
                                                 rank=rank))
        result = time_pair(pair, job["steps"], job["warmup"])
    finally:
        pair.close()
        torch.distributed.destroy_process_group()
    names = sorted(result)
    slowest = np.array([result[name] for name in names])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return dict(zip(names, slowest.tolist()))


def report(rows: List[dict], command: str, torch_version: str,
           previous: Optional[str] = None) -> str:
    table, misses = [], 0
    for r in rows:
        ratio = round(r["neural_arch"] / r["torch"], 3)  # judged as shown
        misses += ratio > GOAL
        row = [f"{r['layers']} x {r['width']}, heads {r['heads']}, T {r['block']}, "
               f"B {r['batch']}", r["p"], f"{r['neural_arch']:.1f}", f"{r['torch']:.1f}"]
        if previous:
            row += [f"{r['previous']:.1f}", f"{r['neural_arch'] / r['previous']:.3f}"]
        table.append(row + [f"{ratio:.3f}", reporting.verdict(ratio <= GOAL),
                            reporting.verdict(ratio <= FLOOR)])
    head = reporting.section_head(
        "GPT training step against PyTorch (`benchmarks/bench_gpt_step.py`)", command,
        f"{reporting.machine_info()}; torch {torch_version}",
        "A step: zero_grad, forward, cross-entropy, backward, AdamW; float32, one thread per "
        "process; the median of interleaved steps after a warm-up, the first step's losses "
        "checked equal. p = 2: both data parallel (ours on shm, torch's DDP on gloo) in the "
        "same two processes, B per rank, the slower rank's median."
        + (f" `{previous}` ms: the same step on neural_arch at commit {previous}, in its own "
           "process per rank (its own DDP job at p = 2), in the same rotation; its time "
           "includes a pipe round trip to that process." if previous else ""))
    columns = ["GPT", "p", "neural_arch ms", "torch ms"]
    if previous:
        columns += [f"`{previous}` ms", f"neural_arch / `{previous}`"]
    body = reporting.markdown_table(
        columns + ["neural_arch / torch", f"<= {GOAL}", f"<= {FLOOR}"], table,
        "lr" + "r" * (len(columns) - 2) + "rll")
    return "\n".join(head + [body, "", f"{misses} row(s) slower than torch."])


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--world-sizes", default="1,2", help="1, 2 or both")
    parser.add_argument("--quick", action="store_true", help="a tiny GPT (a smoke run)")
    parser.add_argument("--baseline", default=None, metavar="REF",
                        help="also time neural_arch as it was at this git revision")
    parser.add_argument("--output", action="append", default=[])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    try:
        import torch
    except ImportError:
        print("bench_gpt_step needs torch (the peer it measures against): pip install torch")
        return 1
    torch.set_num_threads(1)
    world_sizes = sorted({int(w) for w in args.world_sizes.split(",")})
    if not set(world_sizes) <= {1, 2}:
        raise SystemExit(f"--world-sizes takes 1 and/or 2, got {args.world_sizes!r}")
    folder, previous = baseline.extract(args.baseline) if args.baseline else (None, None)
    rows = []
    try:
        for sizes in (QUICK if args.quick else CONFIGS):
            for p in world_sizes:
                rows.append(dict(zip(("layers", "heads", "width", "block", "batch"), sizes),
                                 p=p, **_time_row(torch, args, sizes, p, folder)))
                print(rows[-1], flush=True)
    finally:
        if folder:
            baseline.remove(folder)
    reporting.publish(report(rows, command, torch.__version__, previous), args.output, SECTION)
    return 0


def _time_row(torch, args: argparse.Namespace, sizes, p: int,
              folder: Optional[str]) -> Dict[str, float]:
    if p == 1:
        pair = Pair(torch, sizes).with_baseline(folder)
        try:
            return time_pair(pair, args.steps, args.warmup)
        finally:
            pair.close()
    return common.run_job(os.path.abspath(__file__), "shm", p, dict(
        sizes=list(sizes), steps=args.steps, warmup=args.warmup, port=_free_port(),
        baseline=folder, baseline_port=_free_port()), timeout=1800)


def main(argv: Optional[List[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_gpt_step.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
