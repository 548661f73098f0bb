"""scikit-learn's bundled 8x8 handwritten digits (1797 images, no download needed)."""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .dataset import TensorDataset


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Tuple[TensorDataset, TensorDataset]:
    """Train and test ``TensorDataset``s of (64 float32 features in [0, 1], int64 label).

    The split is a random permutation drawn from ``seed``; ``test_fraction`` of the images
    (rounded) go to the test set.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    features = (bunch.data / 16.0).astype(np.float32)
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return (TensorDataset(features[train], labels[train]),
            TensorDataset(features[test], labels[test]))
