"""Distributed hyperparameter search on Optuna, in Ray Tune's spelling::

    from neural_arch import tune

    def train_fn(config):
        ...                                   # build and train with config["lr"], ...
        tune.report(loss=val_loss, step=epoch)

    tuner = tune.DistributedTuner(train_fn, {"lr": tune.loguniform(1e-4, 1e-1),
                                             "hidden": tune.choice([32, 64])},
                                  num_samples=20, metric="loss", mode="min",
                                  processes_per_trial=2, scheduler="asha")
    results = tuner.tune()                    # results.best_config, results.trials

Each trial is a job of ``processes_per_trial`` processes started through the launcher; trials
run side by side; the study lives in Optuna storage (a journal file by default) and resumes
when the tuner is started again. Optuna is needed by the tuner process only (the ``tune``
extra); ``report``, ``trial_dir`` and the search-space spellings import without it.
``backend="ray"`` runs the trials as Ray Tune trials instead (``ray_backend``), and
``tune.run(train_fn, config=..., num_samples=...)`` is Ray Tune's spelling of a search.
"""
from .callback import TuneReportCallback
from .results import TuneResults
from .search_space import choice, loguniform, randint, uniform
from .session import report, trial_dir, trial_number
from .tune_run import ExperimentAnalysis, run
from .tuner import DistributedTuner

__all__ = ["DistributedTuner", "ExperimentAnalysis", "TuneReportCallback", "TuneResults",
           "choice", "loguniform", "randint", "report", "run", "trial_dir", "trial_number",
           "uniform"]
