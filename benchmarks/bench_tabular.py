"""TabGPT fine-tuned against what tabular users pick instead, on the same cross-validation folds.

For each bundled table (scikit-learn's wine, breast cancer, optionally diabetes) and each of
``--folds`` stratified folds (plain folds for regression): a ``TabularPreprocessor`` fitted on
the fold's training rows, then
- TabGPT fine-tuned for ``--epochs`` (AdamW, mini-batches), optionally after ``--pretrain-epochs``
  of masked-cell pretraining on the same training rows (never the held-out ones), with SCARF's
  contrastive view added at ``--contrastive-weight``;
- scikit-learn's ``HistGradientBoostingClassifier`` / ``Regressor`` (defaults, seeded);
- logistic regression (``LogisticRegression`` after ``StandardScaler``) / linear regression.
Scores: accuracy for wine, ROC AUC for breast cancer, RMSE for diabetes; mean and standard
deviation over the folds. There is no early stopping or tuning: the epochs are fixed, small.

    python benchmarks/bench_tabular.py [--sets wine breast_cancer] [--folds 5] [--epochs 30]
        [--pretrain-epochs 0] [--contrastive-weight 0] [--d-token 32] [--layers 2] [--heads 4]
        [--batch 32] [--lr 1e-3] [--seed 0]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List, Sequence  # noqa: E402

import numpy as np  # noqa: E402

from neural_arch.core import manual_seed, no_grad  # noqa: E402
from neural_arch.data import DataLoader  # noqa: E402
from neural_arch.data.tabular import (TabularDataset, TabularPreprocessor, load_bundled,  # noqa
                                      take_rows)
from neural_arch.models.tabgpt import (TabGPTConfig, TabGPTForPreTraining,  # noqa: E402
                                       TabGPTForSequenceClassification)
from neural_arch.optim import AdamW  # noqa: E402

METRICS = {"wine": "accuracy", "breast_cancer": "ROC AUC", "diabetes": "RMSE"}


def score(name: str, truth: np.ndarray, scores: np.ndarray) -> float:
    """``scores``: class probabilities (rows, classes), or predictions for regression."""
    from sklearn.metrics import accuracy_score, mean_squared_error, roc_auc_score
    if name == "diabetes":
        return float(np.sqrt(mean_squared_error(truth, scores)))
    if name == "breast_cancer":
        return float(roc_auc_score(truth, scores[:, 1]))
    return float(accuracy_score(truth, scores.argmax(axis=1)))


def _train(model, optimizer, dataset, epochs: int, batch: int, step: Callable) -> None:
    loader = DataLoader(dataset, batch_size=batch, shuffle=True)
    model.train()
    for _ in range(epochs):
        for fields in loader:
            loss = step(*fields)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def tabgpt_scores(name: str, train_table, test_table, target: str, args) -> np.ndarray:
    prep = TabularPreprocessor(target=target).fit(train_table)  # the training rows only
    train, test = TabularDataset(train_table, prep), TabularDataset(test_table, prep)
    config = TabGPTConfig(**prep.model_config(), d_token=args.d_token, n_layers=args.layers,
                          n_heads=args.heads, contrastive_weight=args.contrastive_weight)
    model = TabGPTForSequenceClassification(config)
    if args.pretrain_epochs:
        pretraining = TabGPTForPreTraining(config)
        optimizer = AdamW(pretraining.parameters(), lr=args.lr, weight_decay=1e-5)
        _train(pretraining, optimizer, train, args.pretrain_epochs, args.batch,
               lambda x_num, x_cat, _y: pretraining(x_num, x_cat).loss)
        model.load_pretrained_weights(pretraining.state_dict())
    optimizer = AdamW(model.parameters(), lr=args.lr, weight_decay=1e-5)
    _train(model, optimizer, train, args.epochs, args.batch,
           lambda x_num, x_cat, y: model(x_num, x_cat, labels=y).loss)
    model.eval()
    with no_grad():
        logits = model(test.x_num, test.x_cat).logits.numpy().astype(np.float64)
    if prep.task == "regression":
        return prep.decode_target(logits[:, 0])
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    return probabilities / probabilities.sum(axis=1, keepdims=True)


def sklearn_scores(kind: str, regression: bool, x_train, y_train, x_test, seed: int):
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    if kind == "boosting":
        model = HistGradientBoostingRegressor(random_state=seed) if regression else \
            HistGradientBoostingClassifier(random_state=seed)
    else:
        model = make_pipeline(StandardScaler(), LinearRegression() if regression else
                              LogisticRegression(max_iter=5000))
    model.fit(x_train, y_train)
    return model.predict(x_test) if regression else model.predict_proba(x_test)


def run_set(name: str, args) -> Dict[str, List[float]]:
    from sklearn.model_selection import KFold, StratifiedKFold
    table, target = load_bundled(name)
    regression = name == "diabetes"
    y = table[target]
    features = np.stack([v for k, v in table.items() if k != target], axis=1)
    splitter = (KFold if regression else StratifiedKFold)(n_splits=args.folds, shuffle=True,
                                                          random_state=args.seed)
    results: Dict[str, List[float]] = {"TabGPT": [], "gradient boosting": [], "linear": []}
    for fold, (train_rows, test_rows) in enumerate(splitter.split(features, y)):
        manual_seed(args.seed + fold)
        started = time.perf_counter()
        results["TabGPT"].append(score(name, y[test_rows], tabgpt_scores(
            name, take_rows(table, train_rows), take_rows(table, test_rows), target, args)))
        seconds = time.perf_counter() - started
        for kind, label in (("boosting", "gradient boosting"), ("linear", "linear")):
            results[label].append(score(name, y[test_rows], sklearn_scores(
                kind, regression, features[train_rows], y[train_rows], features[test_rows],
                args.seed)))
        print(f"  {name} fold {fold}: " + ", ".join(f"{k} {v[-1]:.4f}"
                                                     for k, v in results.items())
              + f" (TabGPT {seconds:.1f} s)", flush=True)
    return results


def table_lines(all_results: Dict[str, Dict[str, List[float]]]) -> List[str]:
    lines = ["| set | metric | TabGPT | gradient boosting | logistic / linear |",
             "|---|---|---|---|---|"]
    for name, results in all_results.items():
        cells = [f"{np.mean(v):.4f} ± {np.std(v):.4f}" for v in results.values()]
        lines.append(f"| {name} | {METRICS[name]} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["wine", "breast_cancer"],
                        choices=sorted(METRICS))
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--pretrain-epochs", type=int, default=0)
    parser.add_argument("--contrastive-weight", type=float, default=0.0,
                        help="pretraining adds SCARF's contrastive loss with this weight")
    parser.add_argument("--d-token", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print("python benchmarks/bench_tabular.py " + " ".join(sys.argv[1:] if argv is None
                                                             else argv), flush=True)
    all_results = {name: run_set(name, args) for name in args.sets}
    print(f"\n{args.folds}-fold cross-validation, TabGPT d_token {args.d_token}, "
          f"{args.layers} layers, {args.epochs} epochs"
          + (f" after {args.pretrain_epochs} of masked-cell pretraining"
             + (f" (+ {args.contrastive_weight:g} x contrastive)" if args.contrastive_weight
                else "")
             if args.pretrain_epochs else ", no pretraining")
          + " (RMSE: lower is better; the others higher)")
    print("\n".join(table_lines(all_results)))


if __name__ == "__main__":
    main()
