"""``Trainer(strategy="horovod")`` and ``HorovodTrainer`` at two real processes train the
one-process model (same losses, same weights) from rank 0's start, with accumulation and
clipping; ``metric_average`` averages over the ranks; ``TrainingConfig(scale_lr=True)``
multiplies the learning rate by the data-parallel ranks once, and says so once."""
import contextlib
import io

import numpy as np
import pytest

from dist_harness import run_ranks
from trainer_job import problem

pytestmark = pytest.mark.timeout(120)
BACKEND = "shm"
GLOBAL_BATCH = 8


def _config(**extra):
    from neural_arch.training import TrainingConfig
    return TrainingConfig(**{"epochs": 2, "seed": 5, "verbose": False, "progress_bar": False,
                             "max_grad_norm": 0.5, "gradient_accumulation_steps": 2, **extra})


def _weights(model):
    return {n: np.array(p.array, copy=True) for n, p in model.named_parameters()}


def train(rank, world_size, strategy):
    """Two epochs of the fixed problem, the global batch split over the ranks. Every rank but
    0 starts from other weights and another learning rate: the strategy must broadcast rank
    0's parameters and optimizer state. Returns (history, final weights, strategy's class,
    lr, whether the optimizer is a DistributedOptimizer)."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer
    manual_seed(rank if strategy == "horovod" else 0)
    model = MLP([6, 16, 2])
    train_set, val_set = problem()
    optimizer = SGD(model.parameters(), lr=0.1 if rank == 0 else 0.7, momentum=0.9)
    trainer = Trainer(model, optimizer, F.cross_entropy, _config(), strategy=strategy)
    history = trainer.fit(DataLoader(train_set, batch_size=GLOBAL_BATCH // world_size,
                                     shuffle=True), DataLoader(val_set, batch_size=8))
    return (history.state_dict(), _weights(model), type(trainer.strategy).__name__,
            trainer.optimizer.param_groups[0]["lr"], hasattr(trainer.optimizer, "synchronize"))


@pytest.fixture(scope="module")
def one_process():
    history, weights, name, _, _ = run_ranks(train, 1, BACKEND, args=("single",))[0]
    assert name == "SingleProcess"
    return history, weights


def assert_trains_like(history, weights, reference, atol=1e-6, rtol=1e-5):
    ref_history, ref_weights = reference
    assert len(history["epochs"]) == len(ref_history["epochs"]) == 2
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose([r[key] for r in history["epochs"]],
                                   [r[key] for r in ref_history["epochs"]], rtol=rtol,
                                   atol=atol, err_msg=key)
    assert weights.keys() == ref_weights.keys()
    for name in ref_weights:
        np.testing.assert_allclose(weights[name], ref_weights[name], rtol=rtol * 10,
                                   atol=atol, err_msg=name)


def test_horovod_strategy_trains_like_one_process(one_process):
    results = run_ranks(train, 2, BACKEND, args=("horovod",))
    for history, weights, name, lr, distributed in results:
        assert (name, lr, distributed) == ("HorovodStrategy", 0.1, True)
        assert_trains_like(history, weights, one_process)
    assert results[0][1].keys() == results[1][1].keys()
    for name in results[0][1]:  # the replicas are equal bit for bit
        np.testing.assert_array_equal(results[0][1][name], results[1][1][name], err_msg=name)


def fit_with_horovod_trainer(rank, world_size, compression):
    import neural_arch.horovod as hvd
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader
    from neural_arch.models import MLP
    from neural_arch.training.horovod_trainer import HorovodTrainer, metric_average
    manual_seed(rank)  # rank 0's weights win: broadcast at set-up
    model = MLP([6, 16, 2])
    train_set, val_set = problem()
    trainer = HorovodTrainer(model, optimizer="sgd", learning_rate=0.1,
                             optimizer_options={"momentum": 0.9},
                             batch_size=GLOBAL_BATCH // world_size, epochs=2, seed=5,
                             max_grad_norm=0.5, gradient_accumulation_steps=2,
                             compression=getattr(hvd.Compression, compression),
                             verbose=False, progress_bar=False)
    history = trainer.fit(DataLoader(train_set, batch_size=3, shuffle=True),
                          DataLoader(val_set, batch_size=8))
    average = metric_average(float(rank * 2 + 1), "rank_metric")  # (1 + 3) / 2
    return history.state_dict(), _weights(model), average


def test_horovod_trainer_fits_like_one_process(one_process):
    for history, weights, average in run_ranks(fit_with_horovod_trainer, 2, BACKEND,
                                               args=("none",)):
        assert average == 2.0
        assert_trains_like(history, weights, one_process)


def test_horovod_trainer_fp16_compression_trains_close(one_process):
    for history, weights, _ in run_ranks(fit_with_horovod_trainer, 2, BACKEND,
                                         args=("fp16",)):
        assert_trains_like(history, weights, one_process, atol=5e-3, rtol=5e-3)


def build_with_scale_lr(rank, world_size, strategy, scale_lr):
    """The optimizer's lr after the Trainer's set-up, and what this rank printed."""
    import neural_arch.functional as F
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer
    model = MLP([6, 4, 2])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        config = _config(verbose=True) if scale_lr is None else _config(verbose=True,
                                                                        scale_lr=scale_lr)
        trainer = Trainer(model, SGD(model.parameters(), lr=0.01), F.cross_entropy, config,
                          strategy=strategy)
    return [g["lr"] for g in trainer.optimizer.param_groups], printed.getvalue()


@pytest.mark.parametrize("strategy", ["ddp", "horovod"])
def test_scale_lr_multiplies_lr_by_data_parallel_ranks_once(strategy):
    results = run_ranks(build_with_scale_lr, 2, BACKEND, args=(strategy, True))
    for rank, (lrs, printed) in enumerate(results):
        assert lrs == [0.02], (rank, lrs)
        expected = ["scale_lr: lr 0.01 x 2 data-parallel ranks = 0.02"] if rank == 0 else []
        assert [line for line in printed.splitlines() if "scale_lr" in line] == expected


def test_scale_lr_is_off_by_default():
    from neural_arch.training import TrainingConfig
    assert TrainingConfig().scale_lr is False
    for lrs, printed in run_ranks(build_with_scale_lr, 2, BACKEND, args=("horovod", None)):
        assert lrs == [0.01] and "scale_lr" not in printed


def test_horovod_strategy_refuses_what_it_cannot_run():
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import TrainingConfig
    from neural_arch.training.strategies import STRATEGIES
    model = MLP([3, 2])
    for config, words in ((TrainingConfig(zero_stage=1), "zero_stage=1"),
                          (TrainingConfig(mixed_precision=True), "mixed_precision=True")):
        with pytest.raises(ValueError, match=words):
            STRATEGIES["horovod"]().setup(model, SGD(model.parameters(), lr=0.1), config)
