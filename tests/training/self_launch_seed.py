"""The seed example of a trainer that launches itself, run as a plain script:
``python self_launch_seed.py OUT.json [CHECKPOINT_DIR]``. The training is the example's (two
"GPUs", 2 epochs, Adam, mixed precision); afterwards the script writes what it printed, the
history and the model's weights to OUT.json (rank 0 only, when a launcher started it)."""
import json
import os
import sys

from self_launch_job import problem

from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.training.ddp_trainer import PyTorchDDPTrainer


class MyModel(MLP):
    def __init__(self):
        super().__init__([6, 8, 2])


if __name__ == "__main__":
    manual_seed(0)
    train_set, val_set = problem()
    train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=8)

    trainer = PyTorchDDPTrainer(model=MyModel(), num_gpus=2, batch_size=4, epochs=2,
                                learning_rate=0.01, mixed_precision=True, verbose=False,
                                progress_bar=False)
    history = trainer.fit(train_loader, val_loader, checkpoint_dir=sys.argv[2])
    print(f"Training time: {history.total_time:.2f}s")
    print(f"Final accuracy: {history.best_accuracy:.4f}")

    if os.environ.get("RANK", "0") == "0":
        with open(sys.argv[1], "w") as handle:
            json.dump({"total_time": history.total_time, "best_accuracy": history.best_accuracy,
                       "epochs": history.epochs,
                       "weights": {k: v.tolist() for k, v in trainer.model.state_dict().items()}},
                      handle)
