"""A GPT split by blocks, and the ``Pipe([...])`` spelling, train like the dense model."""
import numpy as np
import pytest

from dist_harness import run_ranks
from pipeline_cases import (batch, compare, lm_loss, make_gpt, make_mlp, mse, token_batch,
                            train_dense, train_pipeline)

STEPS = 2


def _dense_gpt_loss(out, target):
    return lm_loss(out[0], target)  # the dense GPT returns (logits, loss)


def _gpt(rank, world_size, tie, ckpt=False):
    losses, params, _ = train_pipeline(rank, world_size, make_gpt(tie=tie, checkpointing=ckpt),
                                       "1f1b", 4,
                                       [token_batch(s) for s in range(STEPS)], lm_loss, "adamw")
    return losses, params


@pytest.mark.parametrize("p,tie,ckpt", [(2, True, False), (4, True, False), (2, False, False),
                                        (2, True, True)])
def test_gpt_split_by_blocks_matches_the_dense_gpt(p, tie, ckpt):
    """Tied or not; with activation checkpointing the stages recompute their blocks."""
    results = run_ranks(_gpt, p, "shm", timeout=120, args=(tie, ckpt))
    dense = train_dense(make_gpt(tie=tie, checkpointing=ckpt),
                        [token_batch(s) for s in range(STEPS)], _dense_gpt_loss, "adamw")
    compare(results, *dense)
    if tie:  # both holders of the tied matrix end equal (and equal to the dense one)
        first, last = results[0][1]["wte.weight"], results[-1][1]["wte.weight"]
        assert np.array_equal(first, last)
        assert "lm_head.weight" not in dense[1]  # one parameter under one name
    else:
        assert "wte.weight" not in results[-1][1] and "lm_head.weight" in results[-1][1]


def test_gpt_split_is_balanced_and_shares_the_models_modules():
    from neural_arch.distributed.pipelining import pipeline_split
    model = make_gpt()
    stages = pipeline_split(model, 4)
    assert [len(s.h) for s in stages] == [1, 1, 1, 1]
    assert stages[0].wte is model.wte and stages[-1].lm_head is model.lm_head
    assert stages[0].pipeline_ties["wte.weight"][1] == (0, 3)
    assert stages[1].pipeline_ties == {}
    x, _ = token_batch(0)
    out = x
    for stage in pipeline_split(model, 3):
        out = stage(out)
    np.testing.assert_array_equal(out.array, model(x)[0].array)
    with pytest.raises(ValueError, match="GPT of 4 blocks into 5 stages"):
        pipeline_split(model, 5)


def test_sequential_split_balances_parameters_and_keeps_names():
    from neural_arch.distributed.pipelining import pipeline_split
    model = make_mlp(pairs=5)  # 5 x (Linear, Tanh): Linears hold every parameter
    stages = pipeline_split(model, 3)
    linears = [sum(1 for m in s if type(m).__name__ == "Linear") for s in stages]
    assert sorted(linears) == [1, 2, 2], linears
    names = [name for s in stages for name, _ in s.named_parameters()]
    assert names == [name for name, _ in model.named_parameters()]
    assert stages[0][0].weight is model[0].weight
    # parameters, not layer counts: two Linears then six Tanhs cut after the first Linear
    from neural_arch.nn import Linear, Sequential, Tanh
    lopsided = Sequential(Linear(10, 10), Linear(10, 10), *[Tanh() for _ in range(6)])
    assert [len(s) for s in pipeline_split(lopsided, 2)] == [1, 7]
    with pytest.raises(ValueError, match="10 layers into 11 stages"):
        pipeline_split(model, 11)
    with pytest.raises(TypeError, match="Tanh"):
        pipeline_split(model[1], 1)


def _pipe(rank, world_size, n_parts, schedule):
    from neural_arch.distributed.pipelining import Pipe, pipeline_split
    from pipeline_cases import make_optimizer, named
    model = make_mlp()
    names = named(model)
    pipe = Pipe(pipeline_split(model, n_parts), chunks=4, loss_fn=mse, schedule=schedule)
    opt = make_optimizer(list(pipe.parameters()), "sgd")
    step_losses = []
    for s in range(3):
        x, y = batch(s)
        opt.zero_grad()
        losses = []
        if world_size == 1:
            pipe(x, target=y, losses=losses)
        elif rank == 0:
            pipe(x)
        elif rank == world_size - 1:
            pipe(target=y, losses=losses)
        else:
            pipe()
        opt.step()
        step_losses.append(float(np.mean([loss.item() for loss in losses])) if losses else None)
    last = rank == world_size - 1
    return ((step_losses if last else None),
            {names[id(p)]: np.array(p.array) for p in pipe.parameters()})


@pytest.mark.parametrize("world,n_parts,schedule", [(2, 2, "1f1b"), (2, 4, "1f1b"),
                                                    (3, 3, "gpipe"), (1, 3, "1f1b")])
def test_pipe_spelling_matches_dense(world, n_parts, schedule):
    results = run_ranks(_pipe, world, "shm", timeout=120, args=(n_parts, schedule))
    compare(results, *train_dense(make_mlp(), [batch(s) for s in range(3)], mse, "sgd"))
