"""pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py (commit
f62b4aec7bff832fc65b59aa62d60e94ddd6b39e), in torch, started by torchrun at two processes.

Lines marked ``CPU:`` are the edits any CPU run of the tutorial needs, under torch too: no
``torch.cuda.set_device``, ``gloo`` for ``nccl``, no ``.to(gpu_id)``, no ``device_ids``, the
snapshot loaded onto the CPU. Lines marked ``compare:`` are the same under both frameworks and
let the porting table compare them step by step: the data drawn with NumPy (the frameworks'
``torch.rand`` differ), four classes under cross-entropy (the tutorial's single output makes
the loss a constant), the sampler not shuffled, the first weights read from a file, each rank's
losses written to one.
"""
import json
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader

from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
import os


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        rng = np.random.default_rng(0)  # compare: NumPy's numbers, the same in both
        self.data = [(torch.from_numpy(rng.random(20, dtype=np.float32)), int(rng.integers(0, 4)))
                     for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    init_process_group(backend="gloo")  # CPU: gloo, and no torch.cuda.set_device


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        losses_out: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model  # CPU: no .to(self.gpu_id)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.losses, self.losses_out = [], losses_out  # compare
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)

        self.model = DDP(self.model)  # CPU: no device_ids

    def _load_snapshot(self, snapshot_path):
        loc = "cpu"  # CPU: not f"cuda:{self.gpu_id}"
        snapshot = torch.load(snapshot_path, map_location=loc)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.item())  # compare

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.gpu_id}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            # CPU: no source.to(self.gpu_id), targets.to(self.gpu_id)
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
        if self.losses_out:  # compare
            with open(f"{self.losses_out}.rank{self.gpu_id}", "w") as f:
                json.dump(self.losses, f)


def load_train_objs(init_weights, save_init):
    train_set = MyTrainDataset(320)  # load your dataset
    model = torch.nn.Linear(20, 4)  # load your model (compare: 4 classes)
    if init_weights:  # compare
        model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(init_weights).items()})
    if save_init and os.environ["RANK"] == "0":  # compare
        np.savez(save_init, **{k: np.asarray(v) for k, v in model.state_dict().items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset, shuffle=False)  # compare: not shuffled
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt",
         init_weights=None, save_init=None, losses_out=None):
    ddp_setup()
    dataset, model, optimizer = load_train_objs(init_weights, save_init)
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, losses_out)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=16, type=int, help='Input batch size on each device (default: 16)')
    parser.add_argument('--init-weights', help='compare: start from these weights (.npz)')
    parser.add_argument('--save-init', help='compare: write the first weights here (.npz)')
    parser.add_argument('--losses-out', help='compare: write the losses here (JSON, one per rank)')
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size, init_weights=args.init_weights,
         save_init=args.save_init, losses_out=args.losses_out)
