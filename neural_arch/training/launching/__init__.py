"""Training that starts its own processes: ``fit_in_processes`` runs a Trainer's ``fit`` in N
worker processes of this host through the project's launcher, unless this process is already
a rank of a job; ``PyTorchDDPTrainer`` (``training.ddp_trainer``) is its one-object face."""
from .fit import FitRecipe, check_num_processes, fit_in_processes, under_launcher
from .processes import run_in_processes
from .main_import import stop_main_import
from .recipe_check import pickle_recipe

__all__ = ["FitRecipe", "check_num_processes", "fit_in_processes", "pickle_recipe",
           "run_in_processes", "stop_main_import", "under_launcher"]
