"""``python -m neural_arch.tabgpt.curves OUT_DIR``: pretrain a TabGPT on a bundled table,
fine-tune it from the pretrained folder, and draw both runs' loss curves.

Both runs go through ``setup_distributed_training(...).train()`` in this process, so their
``metrics.jsonl`` (the training loss of every logging interval, the held-out loss after every
epoch) is what ``neural_arch.plot_metrics`` reads and draws: ``OUT_DIR/pretraining.png`` (the
masked-cell loss, plus SCARF's contrastive term with ``--contrastive-weight``) and
``OUT_DIR/fine_tuning.png`` (cross-entropy, or squared error for a regression table). The
runs' folders stay in ``OUT_DIR`` (``pretraining/``, ``pretrained/``, ``fine_tuning/``).
matplotlib is needed for the pictures only.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

from ..core import manual_seed
from ..data.tabular import BUNDLED_TABLES, TabularPreprocessor, load_bundled, split_datasets
from ..models.tabgpt import TabGPTConfig, TabGPTForPreTraining, TabGPTForSequenceClassification
from ..plot_metrics import draw_curves, read_curves
from .training import DistributedConfig, TrainingConfig, setup_distributed_training

__all__ = ["pretrain_and_fine_tune"]


def _train(model, train, test, folder: str, epochs: int, batch_size: int, lr: float,
           seed: int) -> None:
    config = TrainingConfig(batch_size=batch_size, num_epochs=epochs, learning_rate=lr,
                            weight_decay=1e-5, logging_steps=1, output_dir=folder, seed=seed)
    setup_distributed_training(model, train, test, training_config=config,
                               distributed_config=DistributedConfig(
                                   world_size=1, monitor_communication=False)).train()


def pretrain_and_fine_tune(out_dir: str, table: str = "wine", pretrain_epochs: int = 20,
                           epochs: int = 30, d_token: int = 32, n_layers: int = 2,
                           n_heads: int = 4, batch_size: int = 32, learning_rate: float = 1e-3,
                           contrastive_weight: float = 0.0, seed: int = 0) -> Dict[str, str]:
    """Run both trainings into ``out_dir`` and draw them; returns the two pictures' paths."""
    if pretrain_epochs < 1 or epochs < 1:
        raise ValueError(f"pretrain_and_fine_tune: pretrain_epochs and epochs must be >= 1, got "
                         f"{pretrain_epochs} and {epochs}")
    columns, target = load_bundled(table)
    preprocessor = TabularPreprocessor(target=target)
    train, test = split_datasets(columns, preprocessor, test_fraction=0.2, seed=seed)
    config = TabGPTConfig(**preprocessor.model_config(), d_token=d_token, n_layers=n_layers,
                          n_heads=n_heads, contrastive_weight=contrastive_weight)
    folders = {name: os.path.join(out_dir, name)
               for name in ("pretraining", "pretrained", "fine_tuning")}
    manual_seed(seed)
    pretraining = TabGPTForPreTraining(config)
    _train(pretraining, train, test, folders["pretraining"], pretrain_epochs, batch_size,
           learning_rate, seed)
    pretraining.save_pretrained(folders["pretrained"], preprocessor=preprocessor)
    model = TabGPTForSequenceClassification.from_pretrained(folders["pretrained"])
    _train(model, train, test, folders["fine_tuning"], epochs, batch_size, learning_rate, seed)
    objective = "masked-cell" + (f" + {contrastive_weight:g} x contrastive"
                                 if contrastive_weight else "")
    task_loss = "squared error" if config.problem_type == "regression" else "cross-entropy"
    return {
        "pretraining": draw_curves(read_curves(folders["pretraining"]),
                                   f"TabGPT pretraining on {table}: {objective}",
                                   os.path.join(out_dir, "pretraining.png"),
                                   ylabel=f"{objective} loss"),
        "fine_tuning": draw_curves(read_curves(folders["fine_tuning"]),
                                   f"TabGPT fine-tuning on {table}, from the pretrained weights",
                                   os.path.join(out_dir, "fine_tuning.png"),
                                   ylabel=f"{task_loss} loss"),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neural_arch.tabgpt.curves",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="the folder for the runs and the two PNG files")
    parser.add_argument("--table", default="wine", choices=sorted(BUNDLED_TABLES))
    parser.add_argument("--pretrain-epochs", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--d-token", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--contrastive-weight", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = pretrain_and_fine_tune(
            args.out_dir, args.table, args.pretrain_epochs, args.epochs, args.d_token,
            args.layers, args.heads, args.batch_size, args.lr, args.contrastive_weight,
            args.seed)
    except (OSError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
