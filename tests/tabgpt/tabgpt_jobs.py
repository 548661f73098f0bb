"""A tiny TabGPT on scikit-learn's wine table, for the tests of ``neural_arch.tabgpt``; kept in
a module so that worker processes can import what they are sent."""
from __future__ import annotations

import json
import os

from neural_arch.core import manual_seed
from neural_arch.data.tabular import TabularPreprocessor, load_bundled, split_datasets
from neural_arch.models.tabgpt import TabGPTConfig, TabGPTForSequenceClassification


def wine(seed: int = 0):
    """(train, test) datasets of the wine table (142 and 36 rows) and the model's config."""
    table, target = load_bundled("wine")
    preprocessor = TabularPreprocessor(target=target)
    train, test = split_datasets(table, preprocessor, test_fraction=0.2, seed=seed)
    config = TabGPTConfig(**preprocessor.model_config(), d_token=8, n_layers=1, n_heads=2,
                          attention_dropout=0.0, ffn_dropout=0.0)
    return train, test, config


def tiny_classifier(config: TabGPTConfig, seed: int = 0) -> TabGPTForSequenceClassification:
    manual_seed(seed)
    return TabGPTForSequenceClassification(config)


def records(folder: str, kind: str = "train") -> list:
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r["kind"] == kind]
