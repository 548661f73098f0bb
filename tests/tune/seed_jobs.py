"""The seed's Ray Train snippet as written (apart from its imports), with tiny sizes: what it
leaves to the reader (``create_model``, ``train_loader``, ``val_loader``) is defined here on a
slice of the digits data. Trials import ``train_fn`` from this module."""
from __future__ import annotations

from neural_arch.data import DataLoader, TensorDataset, load_digits
from neural_arch.models import MLP
from neural_arch.ray import RayTrainer

_train, _val = load_digits(seed=0)
train_loader = DataLoader(TensorDataset(*(a[:128] for a in _train.arrays)), batch_size=32,
                          shuffle=True)
val_loader = DataLoader(TensorDataset(*(a[:64] for a in _val.arrays)), batch_size=32)


def create_model(hidden_size):
    return MLP([64, hidden_size, 10])


# ---- the seed's snippet ------------------------------------------------------------------
def train_fn(config):
    model = create_model(config["hidden_size"])
    trainer = RayTrainer(model, config)
    trainer.fit(train_loader, val_loader)
    return {"accuracy": trainer.best_accuracy}
