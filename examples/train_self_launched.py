"""A trainer that starts its own processes: the seeds' PyTorchDDPTrainer example as written (no
``if __name__ == "__main__":``, no launcher), on scikit-learn's 8x8 digits.

    python examples/train_self_launched.py

Two worker processes train the model data parallel on the CPU; this process prints the training
time and the best validation accuracy (about 0.97 after 10 epochs).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.data import DataLoader, load_digits  # noqa: E402
from neural_arch.nn import Linear, Module, ReLU, Sequential  # noqa: E402
from neural_arch.training import PyTorchDDPTrainer  # noqa: E402


class MyModel(Module):
    def __init__(self):
        super().__init__()
        self.layers = Sequential(Linear(64, 128), ReLU(), Linear(128, 10))

    def forward(self, x):
        return self.layers(x)


manual_seed(0)
train_set, val_set = load_digits()
train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
val_loader = DataLoader(val_set, batch_size=64)

# Create trainer
trainer = PyTorchDDPTrainer(
    model=MyModel(),
    num_gpus=2,
    batch_size=32,  # per process
    epochs=10,
    learning_rate=0.003,
    progress_bar=False,
)

# Train - automatically distributed!
history = trainer.fit(train_loader, val_loader)

print(f"Training time: {history.total_time:.2f}s")
print(f"Final accuracy: {history.best_accuracy:.4f}")
