"""Train an MLP on scikit-learn's 8x8 handwritten digits with Neural Forge (single process).

    python examples/train_digits.py --epochs 30 --lr 0.05 --batch-size 32 --seed 0

Prints a progress bar per epoch and ends with a line like
``final: test_accuracy=0.9750 epochs=30 seconds=4.2``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from neural_arch import functional as F  # noqa: E402
from neural_arch.core import manual_seed, no_grad  # noqa: E402
from neural_arch.data import DataLoader, load_digits  # noqa: E402
from neural_arch.models import MLP  # noqa: E402
from neural_arch.optim import SGD, CosineAnnealingLR  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser.parse_args(argv)


def accuracy(model: MLP, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with no_grad():
        for features, labels in loader:
            predictions = model(features).array.argmax(axis=1)
            correct += int((predictions == labels.array).sum())
            total += len(labels.array)
    model.train()
    return correct / total


def main(argv=None) -> float:
    args = parse_args(argv)
    manual_seed(args.seed)
    train_set, test_set = load_digits(test_fraction=0.2, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    test_loader = DataLoader(test_set, batch_size=256)
    model = MLP([64, args.hidden, 10])
    optimizer = SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs)

    start = time.perf_counter()
    progress = tqdm(range(args.epochs), desc="digits", unit="epoch", disable=args.no_progress)
    for _ in progress:
        losses = []
        for features, labels in train_loader:
            loss = F.cross_entropy(model(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        scheduler.step()
        progress.set_postfix(loss=f"{np.mean(losses):.4f}", lr=f"{scheduler.get_last_lr()[0]:.4f}")
    seconds = time.perf_counter() - start
    test_accuracy = accuracy(model, test_loader)
    print(f"final: test_accuracy={test_accuracy:.4f} epochs={args.epochs} seconds={seconds:.1f}",
          flush=True)
    return test_accuracy


if __name__ == "__main__":
    main()
