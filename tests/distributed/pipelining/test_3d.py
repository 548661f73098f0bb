"""Pipeline over tensor parallel: a tensor-parallel GPT cut into pipeline stages on a
(pp, tp) device mesh trains like the dense GPT (float64), tied embedding included.

Every rank builds the dense GPT under one seed and the tensor-parallel GPT over its ``tp``
group loaded from it, cuts the latter with ``pipeline_split`` and keeps the stage of its
``pp`` coordinate; the schedule runs over the ``pp`` group, the loss is the vocabulary-parallel
cross-entropy over the ``tp`` group.
"""
import numpy as np

from dist_harness import run_ranks

SIZES = dict(block_size=8, vocab_size=32, n_layer=4, n_head=2, n_embd=16)
STEPS, MICRO = 2, 4


def _tokens(step):
    rng = np.random.default_rng(900 + step)
    return rng.integers(0, 32, (8, 8)), rng.integers(0, 32, (8, 8))


def _dense(seed=3):
    from neural_arch.core.random import manual_seed
    from neural_arch.models.gpt import GPT, GPTConfig
    manual_seed(seed)
    model = GPT(GPTConfig(**SIZES))
    for p in {id(p): p for p in model.parameters()}.values():
        p.array = p.array.astype(np.float64)
    return model


def _train_dense():
    from neural_arch.optim import SGD
    model = _dense()
    opt = SGD(list({id(p): p for p in model.parameters()}.values()), lr=0.5)
    losses = []
    for s in range(STEPS):
        x, y = _tokens(s)
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, {k: np.array(v) for k, v in model.state_dict().items()}


def _three_d(rank, world_size):
    from neural_arch.distributed import init_device_mesh
    from neural_arch.distributed.pipelining import PipelineStage, Schedule1F1B, pipeline_split
    from neural_arch.distributed.tensor_parallel.gpt import parallelize_gpt, tensor_parallel_loss
    from neural_arch.models.gpt import GPT, GPTConfig
    from neural_arch.optim import SGD
    mesh = init_device_mesh((2, 2), mesh_dim_names=("pp", "tp"))
    pp, tp = mesh.get_group("pp"), mesh.get_group("tp")
    pp_rank = mesh.get_local_rank("pp")
    dense = _dense()
    model = parallelize_gpt(GPT(GPTConfig(**SIZES)), tp)
    for p in {id(p): p for p in model.parameters()}.values():
        p.array = p.array.astype(np.float64)
    model.load_dense_state_dict(dense.state_dict())
    names = {id(p): n for n, p in model.named_parameters()}
    part = pipeline_split(model, 2)[pp_rank]
    stage = PipelineStage(part, pp_rank, 2, group=pp)
    schedule = Schedule1F1B(stage, MICRO, lambda logits, y: tensor_parallel_loss(logits, y, tp))
    mine = list({id(p): p for p in part.parameters()}.values())
    opt = SGD(mine, lr=0.5)
    step_losses = []
    for s in range(STEPS):
        x, y = _tokens(s)
        opt.zero_grad()
        losses = []
        schedule.step(x) if pp_rank == 0 else schedule.step(target=y, losses=losses)
        opt.step()
        if losses:
            step_losses.append(float(np.mean([loss.item() for loss in losses])))
    full = model.dense_state_dict()  # gathers the tp shards; only this stage's are trained
    return step_losses, {names[id(p)]: full[names[id(p)]] for p in mine}


def test_tensor_parallel_gpt_in_pipeline_stages_matches_dense():
    results = run_ranks(_three_d, 4, "shm", timeout=180)
    dense_losses, dense_state = _train_dense()
    for rank, (losses, params) in enumerate(results):
        if losses:
            np.testing.assert_allclose(losses, dense_losses, rtol=0, atol=1e-10)
        for name, value in params.items():
            np.testing.assert_allclose(value, dense_state[name], rtol=0, atol=1e-10,
                                       err_msg=f"rank {rank}: {name}")
    assert any(r[0] for r in results)
    covered = set().union(*(r[1] for r in results))
    assert covered == {name for name, _ in _dense().named_parameters()}
