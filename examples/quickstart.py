"""The quick start from the project's guide, runnable as printed.

    python -m neural_arch.distributed.launcher examples/quickstart.py --nproc_per_node=2

The block between the two ``---`` comments is the guide's code (only its comment on
``sync_gradients()`` is newer: the call is now optional); the lines above it only define
what the guide leaves to the reader: ``num_epochs``, ``load_batch``, ``criterion`` and
``optimizer``. The data is a synthetic 10-class problem with 10,000 samples of 784 features
whose labels come from a fixed random linear "teacher", so the loss visibly falls.
"""
import numpy as np

from neural_arch.core import Tensor
from neural_arch.distributed import (
    init_process_group, DistributedDataParallel, DistributedSampler, get_rank, get_world_size,
    all_reduce, ReduceOp, destroy_process_group
)
from neural_arch.nn import Sequential, Linear, ReLU, CrossEntropyLoss
from neural_arch.optim import SGD

num_epochs = 1
_rng = np.random.default_rng(0)
_features = _rng.standard_normal((10000, 784)).astype(np.float32)
_labels = (_features @ _rng.standard_normal((784, 10)).astype(np.float32)).argmax(axis=1)


def load_batch(idx):
    """One sample as a batch of one: features (1, 784) float32, label (1,) int64."""
    return Tensor(_features[idx:idx + 1]), Tensor(_labels[idx:idx + 1])


criterion = CrossEntropyLoss()

# --- the guide's code -------------------------------------------------------------------------
# Initialize distributed training
init_process_group(backend="gloo")  # CPU backend - fully validated

# Create model
model = Sequential(
    Linear(784, 256),
    ReLU(),
    Linear(256, 10)
)

# Wrap with DDP
ddp_model = DistributedDataParallel(model)

optimizer = SGD(ddp_model.parameters(), lr=0.01)  # (the guide assumes an optimizer exists)

# Create distributed sampler
sampler = DistributedSampler(
    dataset_size=10000,
    num_replicas=get_world_size(),
    rank=get_rank(),
    shuffle=True
)

# Training loop (validated pattern)
for epoch in range(num_epochs):
    sampler.set_epoch(epoch)
    running = np.zeros(2)  # (not in the guide) loss sum and count, for the report below

    for idx in sampler:
        # Load batch
        batch_x, batch_y = load_batch(idx)

        # Forward pass
        output = ddp_model(batch_x)
        loss = criterion(output, batch_y)

        # Backward pass
        loss.backward()

        # Optional: backward() has already averaged the gradients, so this does nothing
        # (it is needed only with DistributedDataParallel(model, auto_sync=False))
        ddp_model.sync_gradients()

        # Optimizer step
        optimizer.step()
        optimizer.zero_grad()
        # --- end of the guide's code ----------------------------------------------------------
        running += (loss.item(), 1)
        if running[1] == 1000:
            all_reduce(running, ReduceOp.SUM)
            if get_rank() == 0:
                print(f"epoch {epoch}: mean loss over the last {int(running[1])} samples "
                      f"(all ranks) = {running[0] / running[1]:.4f}", flush=True)
            running[:] = 0

destroy_process_group()
