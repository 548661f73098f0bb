"""Every data-parallel strategy at two real processes trains scikit-learn's digits as one dense
process does with the global batch: the same epoch losses, the same validation loss and
accuracy, and the same final weights (FSDP's gathered from its shards).

An MLP 64-32-10 on 256 training images (batch 16, split over the ranks) and 64 validation
images, 2 epochs of SGD with momentum, clipped by the global norm so that clipping is compared
too (every strategy computes the norm of the whole averaged gradient its own way)."""
import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

pytestmark = pytest.mark.timeout(180)
BACKEND = "shm" if "shm" in installed_backends() else "tcp"
GLOBAL_BATCH, TRAIN_ROWS, VAL_ROWS = 16, 256, 64


def digits_rows():
    """The training and validation rows every run uses, as arrays. Loaded once, here, and
    passed to each rank: importing scikit-learn for ``load_digits`` takes about 2 s a process."""
    from neural_arch.data import load_digits
    train_set, val_set = load_digits(seed=0)
    return (tuple(a[:TRAIN_ROWS] for a in train_set.arrays),
            tuple(a[:VAL_ROWS] for a in val_set.arrays))


def train(rank, world_size, strategy, zero_stage, rows):
    """(the epochs' records, the final weights by name, the strategy's class name)."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    train_set, val_set = (TensorDataset(*arrays) for arrays in rows)
    manual_seed(0)
    model = MLP([64, 32, 10])
    config = TrainingConfig(epochs=2, seed=3, zero_stage=zero_stage, max_grad_norm=1.0,
                            verbose=False, progress_bar=False)
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy,
                      config, strategy=strategy)
    history = trainer.fit(DataLoader(train_set, batch_size=GLOBAL_BATCH // world_size,
                                     shuffle=True), DataLoader(val_set, batch_size=16))
    wrapper = getattr(trainer.strategy, "wrapper", None)
    if strategy == "fsdp":  # the parameters are shards (stage 3) or flat buffers: gather them
        state = wrapper.module.full_state_dict()
    else:
        state = model.state_dict()
    weights = {name: np.array(getattr(v, "array", v), copy=True) for name, v in state.items()}
    return history.state_dict()["epochs"], weights, type(trainer.strategy).__name__


@pytest.fixture(scope="module")
def rows():
    return digits_rows()


@pytest.fixture(scope="module")
def one_process(rows):
    epochs, weights, name = run_ranks(train, 1, BACKEND, timeout=120,
                                      args=("single", 0, rows))[0]
    assert name == "SingleProcess" and len(epochs) == 2
    assert 0.3 < epochs[-1]["val_accuracy"] <= 1  # it learns: the comparison means something
    return epochs, weights


@pytest.mark.slow
@pytest.mark.parametrize("strategy,zero_stage,expected", [
    ("ddp", 0, "DataParallel"), ("zero1", 0, "ZeroOne"),
    ("fsdp", 2, "FullyShardedDataParallel"), ("fsdp", 3, "FullyShardedDataParallel"),
    ("horovod", 0, "HorovodStrategy"),
])
def test_two_processes_train_the_one_process_model(one_process, rows, strategy, zero_stage,
                                                  expected):
    ref_epochs, ref_weights = one_process
    results = run_ranks(train, 2, BACKEND, timeout=120, args=(strategy, zero_stage, rows))
    for rank, (epochs, weights, name) in enumerate(results):
        assert name == expected
        for key in ("train_loss", "val_loss"):
            np.testing.assert_allclose([r[key] for r in epochs], [r[key] for r in ref_epochs],
                                       rtol=1e-5, err_msg=f"rank {rank}: {key}")
        np.testing.assert_allclose([r["val_accuracy"] for r in epochs],
                                   [r["val_accuracy"] for r in ref_epochs], rtol=0, atol=1e-6,
                                   err_msg=f"rank {rank}: val_accuracy")
        assert weights.keys() == ref_weights.keys(), (rank, sorted(weights))
        for key, value in ref_weights.items():
            np.testing.assert_allclose(weights[key], value, rtol=1e-4, atol=1e-6,
                                       err_msg=f"rank {rank}: {key}")
