"""``parallelize_module`` with torch's styles on a small MLP, on real processes, against the
dense MLP (forward and every gradient, float64, at tp = 2); the plan's errors; and that the
dense GPT knows nothing of tensor parallelism (no import of ``neural_arch.distributed`` in
``models/gpt.py``, ``tp_group`` refused with a TypeError that names the new way)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dist_harness import run_ranks
from tp_cases import F64, check_param_grads, chunk, close, leaf, seeded, weighted_sum

pytestmark = pytest.mark.timeout(60)

GPT_SOURCE = Path(__file__).resolve().parents[3] / "neural_arch" / "models" / "gpt.py"


def _mlp():
    from neural_arch.nn import GELU, Linear, Module

    class MLP(Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = Linear(6, 8, dtype=F64), GELU(), Linear(8, 6, dtype=F64)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))
    return MLP()


def _mlp_case(rank, size, sequence_parallel, on_mesh):
    """The dense MLP and its copy parallelized by the plan; outputs and gradients."""
    from neural_arch import distributed as dist
    from neural_arch.core.random import get_rng
    from neural_arch.distributed.tensor_parallel import (ColumnParallelLinear, ColwiseParallel,
                                                         RowParallelLinear, RowwiseParallel,
                                                         Shard, parallelize_module)
    rng = seeded(3)
    dense = _mlp()
    seeded(3)
    model = _mlp()
    mesh = dist.init_device_mesh((size,), mesh_dim_names=("tp",)) if on_mesh else None
    sequence = Shard(1) if sequence_parallel else None
    plan = {"fc1": ColwiseParallel(input_layouts=sequence),
            "fc2": RowwiseParallel(output_layouts=sequence)}
    state = get_rng().bit_generator.state
    assert parallelize_module(model, mesh, plan) is model
    assert get_rng().bit_generator.state == state  # the dense weights are kept, none drawn
    assert isinstance(model.fc1, ColumnParallelLinear) and isinstance(model.fc2, RowParallelLinear)
    assert model.fc1.weight.shape == (8 // size, 6) and model.fc2.weight.shape == (6, 8 // size)
    assert list(model.state_dict()) == list(dense.state_dict())  # the dense keys, in order
    x_np, w = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 4, 6))
    mine = (lambda a: chunk(a, rank, size, axis=1)) if sequence_parallel else (lambda a: a)
    xd, x = leaf(x_np), leaf(mine(x_np))
    yd = dense(xd)
    weighted_sum(yd, w).backward()
    y = model(x)
    close(y.array, mine(yd.array), "output")
    weighted_sum(y, mine(w)).backward()
    close(x.grad, mine(xd.grad), "input gradient")
    return check_param_grads(model, dense, rank, size)


@pytest.mark.parametrize("sequence_parallel,on_mesh", [(False, False), (True, True)])
def test_colwise_then_rowwise_mlp_matches_dense(sequence_parallel, on_mesh):
    assert run_ranks(_mlp_case, 2, "shm", timeout=40, args=(sequence_parallel, on_mesh)) == [4, 4]


def _tied():
    """An embedding and a head sharing one matrix (as a GPT's tied LM head)."""
    from neural_arch.nn import Embedding, Linear, Module

    class Tied(Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = Embedding(8, 4), Linear(4, 8, bias=False)
            self.head.weight = self.emb.weight
    return Tied()


def _plan_errors_case(rank, size):
    from neural_arch.distributed.tensor_parallel import (ColwiseParallel, RowwiseParallel,
                                                         SequenceParallel, parallelize_module)
    both = parallelize_module(_tied(), None, {"emb": RowwiseParallel(),
                                              "head": ColwiseParallel()})
    assert both.head.weight is both.emb.weight and both.emb.weight.shape == (8 // size, 4)
    messages = {"tied": str(both.head.weight is both.emb.weight)}
    attempts = {
        "no such module": lambda: parallelize_module(_mlp(), None, {"fc3": ColwiseParallel()}),
        "not a Linear": lambda: parallelize_module(_mlp(), None, {"act": RowwiseParallel()}),
        "twice": lambda: parallelize_module(_mlp(), None, {"fc1": ColwiseParallel(),
                                                            "fc*": ColwiseParallel()}),
        "not a style": lambda: parallelize_module(_mlp(), None, {"fc1": "colwise"}),
        "sequence on Linear": lambda: parallelize_module(_mlp(), None,
                                                         {"fc1": SequenceParallel()}),
        "untied": lambda: parallelize_module(_tied(), None, {"head": ColwiseParallel()}),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except (TypeError, ValueError) as exc:
            messages[name] = f"{type(exc).__name__}: {exc}"
        else:
            messages[name] = "no error"
    return messages


def test_plan_errors_name_the_module_and_the_style():
    messages = run_ranks(_plan_errors_case, 2, "shm", timeout=40)[0]
    assert messages["no such module"].startswith("ValueError") and "'fc3'" in messages[
        "no such module"], messages
    assert messages["not a Linear"].startswith("TypeError") and "RowwiseParallel" in messages[
        "not a Linear"] and "GELU" in messages["not a Linear"], messages
    assert messages["twice"].startswith("TypeError") and "'fc1'" in messages["twice"], messages
    assert messages["not a style"].startswith("TypeError") and "'fc1'" in messages[
        "not a style"], messages
    assert messages["untied"].startswith("ValueError") and "'emb.weight' and 'head.weight' " \
        "were one parameter" in messages["untied"], messages
    assert messages["tied"] == "True"
    assert "SequenceParallel" in messages["sequence on Linear"] and "Linear" in messages[
        "sequence on Linear"], messages


def _imported_modules(tree: ast.AST, module: str):
    """Every module an import statement anywhere in ``tree`` names (function bodies too),
    relative imports resolved against ``module`` (a module, not a package)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")
            if node.level:
                base = base[:len(base) - node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            yield name
            yield from (f"{name}.{alias.name}" for alias in node.names)


def test_the_dense_gpt_imports_nothing_of_distributed():
    tree = ast.parse(GPT_SOURCE.read_text())
    imported = set(_imported_modules(tree, "neural_arch.models.gpt"))
    assert "neural_arch.nn" in imported  # the walk resolves relative imports
    wrong = sorted(m for m in imported if m == "neural_arch.distributed"
                   or m.startswith("neural_arch.distributed."))
    assert not wrong, f"models/gpt.py imports {wrong}"
    # no tensor-parallel branches either: nothing reads a group off the model
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not attributes & {"tp_group", "sequence_parallel"}


def test_gpt_refuses_tp_group_and_names_parallelize_gpt():
    from neural_arch.models.gpt import GPT, GPTConfig
    config = GPTConfig(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8)
    for kwargs in ({"tp_group": None}, {"sequence_parallel": True}):
        with pytest.raises(TypeError, match="parallelize_gpt"):
            GPT(config, **kwargs)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tp_size'"):
        GPT(config, tp_size=2)
