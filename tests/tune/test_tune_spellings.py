"""The tuner's spellings without running a trial: the search space mapped onto Optuna, the
arguments checked, the slots and GPUs of the seed spelling, ``report`` outside a trial."""
from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna")

from neural_arch import tune  # noqa: E402
from neural_arch.tune.search_space import split_space  # noqa: E402

import tune_jobs  # noqa: E402

pytestmark = pytest.mark.timeout(30)


def test_ray_spellings_become_optuna_distributions():
    space, constants = split_space({"lr": tune.loguniform(1e-4, 1e-1),
                                    "dropout": tune.uniform(0.0, 0.5),
                                    "layers": tune.randint(1, 4),
                                    "act": tune.choice(["relu", "gelu"]), "epochs": 3})
    assert constants == {"epochs": 3}
    found = {name: domain.distribution() for name, domain in space.items()}
    assert found == {
        "lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
        "dropout": optuna.distributions.FloatDistribution(0.0, 0.5),
        "layers": optuna.distributions.IntDistribution(1, 3),  # upper bound excluded
        "act": optuna.distributions.CategoricalDistribution(["relu", "gelu"])}


@pytest.mark.parametrize("make, error, text", [
    (lambda: tune.uniform(1.0, 1.0), ValueError, "lower must be below upper, got 1.0 and 1.0"),
    (lambda: tune.loguniform(0.0, 1.0), ValueError, "lower must be > 0, got 0.0"),
    (lambda: tune.randint(3, 3), ValueError, r"lower must be below upper \(excluded\)"),
    (lambda: tune.randint(0, 2.5), TypeError, "upper must be an int, got 2.5"),
    (lambda: tune.choice([]), ValueError, "categories must be a non-empty list"),
    (lambda: tune.choice([[1, 2]]), TypeError, r"got \[1, 2\]"),
    (lambda: tune.uniform("a", 1), TypeError, "lower must be a finite number, got 'a'"),
])
def test_bad_ranges_are_refused_with_their_values(make, error, text):
    with pytest.raises(error, match=text):
        make()


@pytest.mark.parametrize("kwargs, text", [
    ({"search_space": {"epochs": 3}}, r"no hyperparameter to search .*\['epochs'\]"),
    ({"search_space": {"opt": {"lr": tune.uniform(0, 1)}}}, "nests hyperparameters"),
    ({"mode": "minimum"}, "mode must be 'min' or 'max', got 'minimum'"),
    ({"scheduler": "hyperband"}, r"scheduler must be one of \['asha', 'median'\]"),
    ({"processes_per_trial": 0}, "processes_per_trial must be a positive integer, got 0"),
    ({"num_gpus": 1, "trials_per_gpu": 2, "processes_per_trial": 2}, "trials_per_gpu=2"),
    ({"points_to_evaluate": [{"y": 1}]}, r"points_to_evaluate names \['y'\], which are not"),
])
def test_bad_arguments_are_refused(kwargs, text):
    arguments = {"train_fn": tune_jobs.curve, "search_space": {"x": tune.uniform(0, 1)},
                 **kwargs}
    with pytest.raises(ValueError, match=text):
        tune.DistributedTuner(**arguments)


def test_gpu_slots_each_see_their_own_devices():
    def tuner(**kwargs):
        return tune.DistributedTuner(tune_jobs.curve, {"x": tune.uniform(0, 1)}, **kwargs)

    four = tuner(num_gpus=4, processes_per_trial=2)
    assert four.max_concurrent_trials == 2
    assert [four._environment(s)["CUDA_VISIBLE_DEVICES"] for s in (0, 1)] == ["0,1", "2,3"]
    shared = tuner(num_gpus=2, trials_per_gpu=2)
    assert shared.max_concurrent_trials == 4
    assert [shared._environment(s)["CUDA_VISIBLE_DEVICES"] for s in range(4)] == [
        "0", "0", "1", "1"]
    assert tuner(num_gpus=2, max_concurrent_trials=8).max_concurrent_trials == 2
    assert "CUDA_VISIBLE_DEVICES" not in tuner(max_concurrent_trials=3)._environment(2)


def test_report_outside_a_trial_says_where_it_belongs():
    with pytest.raises(RuntimeError, match=r"tune.report\(\) is called inside a train_fn "
                                           r"that DistributedTuner runs"):
        tune.report(loss=1.0)
