"""Datasets and mini-batch loading."""
from .char_dataset import CharDataset
from .dataloader import DataLoader, default_collate
from .dataset import Dataset, Subset, TensorDataset, random_split
from .digits import load_digits
from .idx import MNIST, read_idx
from .worker import WorkerInfo, get_worker_info

__all__ = ["Dataset", "TensorDataset", "Subset", "random_split", "DataLoader", "default_collate",
           "load_digits", "MNIST", "read_idx", "CharDataset"]
__all__ += ["get_worker_info", "WorkerInfo"]
