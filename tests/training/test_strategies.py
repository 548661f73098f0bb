"""``Trainer(strategy=...)``: every data-parallel strategy at two (and four) real processes
trains the one-process run's model (same losses, same weights), DDP's communication overlaps
backward by default, and what a strategy cannot run is refused with the values named.

The pipeline strategy is checked end to end by test_train_gpt_pipeline.py (``train_gpt --pp``
runs it), and "tensor_parallel" by test_train_gpt.py's ``--tp 2`` runs."""
import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks
from trainer_job import problem

pytestmark = pytest.mark.timeout(120)
BACKEND = "shm" if "shm" in installed_backends() else "tcp"
GLOBAL_BATCH = 8


def train(rank, world_size, strategy=None, zero_stage=0, watch_launches=False):
    """Three epochs of the fixed problem, the global batch split over the ranks; the history,
    the full final weights and (``watch_launches``) for each bucket all-reduce launched,
    whether a backward was running."""
    import neural_arch.functional as F
    from neural_arch.core import autograd, manual_seed
    from neural_arch.data import DataLoader
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    from neural_arch.training.strategies import DataParallel
    if strategy == "ddp-explicit":
        strategy = DataParallel(overlap=False)
    manual_seed(0)
    model = MLP([6, 16, 2])
    train_set, val_set = problem()
    cfg = TrainingConfig(epochs=3, seed=5, verbose=False, progress_bar=False,
                         zero_stage=zero_stage, max_grad_norm=0.5)
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy,
                      cfg, strategy=strategy)
    launches = []
    if watch_launches:
        ddp = trainer.strategy.wrapper.ddp
        launch = ddp._launch

        def watched(bucket, **how):
            launches.append(autograd.current_backward() is not None)
            launch(bucket, **how)
        ddp._launch = watched
    history = trainer.fit(DataLoader(train_set, batch_size=GLOBAL_BATCH // world_size,
                                     shuffle=True), DataLoader(val_set, batch_size=8))
    weights = {n: np.array(v.array if hasattr(v, "array") else v, copy=True)
               for n, v in trainer.strategy.wrapper.module.state_dict().items()}
    return history.state_dict(), weights, launches, type(trainer.strategy).__name__


@pytest.fixture(scope="module")
def one_process():
    history, weights, _, name = run_ranks(train, 1, BACKEND, args=("single",))[0]
    assert name == "SingleProcess"
    return history, weights


def assert_trains_like(result, reference, weights_too=True):
    (history, weights, _, _), (ref_history, ref_weights) = result, reference
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose([r[key] for r in history["epochs"]],
                                   [r[key] for r in ref_history["epochs"]], rtol=1e-5,
                                   err_msg=key)
    if weights_too:
        assert weights.keys() == ref_weights.keys()
        for name in ref_weights:
            np.testing.assert_allclose(weights[name], ref_weights[name], rtol=1e-4, atol=1e-6,
                                       err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,zero_stage,expected,world", [
    (None, 0, "DataParallel", 2), ("ddp", 0, "DataParallel", 2),
    ("ddp-explicit", 0, "DataParallel", 2), ("zero1", 0, "ZeroOne", 2), (None, 1, "ZeroOne", 2),
    ("fsdp", 2, "FullyShardedDataParallel", 2), ("fsdp", 0, "FullyShardedDataParallel", 2),
    (None, 0, "DataParallel", 4), (None, 3, "FullyShardedDataParallel", 4),
])
def test_several_processes_train_the_one_process_model(one_process, strategy, zero_stage,
                                                       expected, world):
    results = run_ranks(train, world, BACKEND, args=(strategy, zero_stage))
    for result in results:
        assert result[3] == expected
        # FSDP's state_dict names and gathers its own way; the losses cover its weights
        assert_trains_like(result, one_process, weights_too=expected != "FullyShardedDataParallel")


@pytest.mark.slow
def test_ddp_overlaps_backward_and_gives_the_explicit_sync_bit_for_bit():
    overlapped = run_ranks(train, 2, BACKEND, args=(None, 0, True))
    explicit = run_ranks(train, 2, BACKEND, args=("ddp-explicit", 0, True))
    for (_, weights, launches, _), (_, plain, explicit_launches, _) in zip(overlapped, explicit):
        # 24 steps: each bucket launched by DDP's hooks while backward runs
        assert launches and all(launches), "the Trainer's default DDP must overlap backward"
        assert explicit_launches and not any(explicit_launches)
        for name in plain:
            assert weights[name].tobytes() == plain[name].tobytes(), name


def refused(rank, world_size, strategy, zero_stage):
    import neural_arch.functional as F
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    model = MLP([6, 4, 2])
    try:
        Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                TrainingConfig(verbose=False, zero_stage=zero_stage), strategy=strategy)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


@pytest.mark.parametrize("strategy,zero_stage,message", [
    ("single", 0, "ValueError: strategy 'single' trains in one process, but the data group "
                  "has 2 ranks"),
    ("zero1", 2, "ValueError: strategy 'zero1' runs ZeRO stage 1, but TrainingConfig."
                 "zero_stage is 2"),
    ("tensor_parallel", 0, "ValueError: strategy 'tensor_parallel' needs group="),
    ("pipeline", 0, "TypeError: strategy 'pipeline' trains a GPT3D"),
    ("megatron", 0, "ValueError: Trainer: unknown strategy 'megatron'; choose one of"),
    (3, 0, "TypeError: Trainer: strategy must be a name"),
])
def test_what_a_strategy_cannot_run_is_refused(strategy, zero_stage, message):
    for answer in run_ranks(refused, 2, BACKEND, args=(strategy, zero_stage)):
        assert answer.startswith(message), answer
