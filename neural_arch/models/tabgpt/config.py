"""``TabGPTConfig``: the shape of a TabGPT model, as a dataclass that round-trips through JSON."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List

__all__ = ["TabGPTConfig"]

ACTIVATIONS = ("reglu", "gelu", "relu")
PROBLEM_TYPES = ("single_label_classification", "regression")
# written into config.json beside the fields, read back without becoming fields
_FILE_ONLY_KEYS = ("model_type", "architectures")


@dataclass
class TabGPTConfig:
    """What a TabGPT is built from: the table's columns, the transformer's size, the head.

    ``n_numerical`` numeric columns and one categorical column per entry of
    ``categorical_cardinalities`` (its number of known categories) become one token each, after a
    [CLS] token. Defaults follow the FT-Transformer's default configuration: tokens of 192,
    3 pre-norm blocks of 8 heads, a ReGLU feed-forward 4/3 as wide as a token, attention dropout
    0.2 and feed-forward dropout 0.1.
    """

    n_numerical: int = 0
    categorical_cardinalities: List[int] = field(default_factory=list)
    d_token: int = 192
    n_layers: int = 3
    n_heads: int = 8
    ffn_factor: float = 4.0 / 3.0
    activation: str = "reglu"
    attention_dropout: float = 0.2
    ffn_dropout: float = 0.1
    residual_dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    # the head: classes for single_label_classification, outputs for regression
    num_labels: int = 2
    problem_type: str = "single_label_classification"
    # masked-cell pretraining: the chance that each observed cell is masked
    mask_probability: float = 0.15
    # SCARF's contrastive view (scarf.py): its InfoNCE loss's weight beside the masked-cell
    # loss (0: off, and no projection head), the share of each row's cells replaced from other
    # rows, and the temperature of the cosine similarities (SCARF's defaults 0.6 and 1.0)
    contrastive_weight: float = 0.0
    corruption_rate: float = 0.6
    contrastive_temperature: float = 1.0
    # recompute the blocks' activations during backward (training only)
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        self.categorical_cardinalities = [int(c) for c in self.categorical_cardinalities]
        for name in ("n_numerical", "d_token", "n_layers", "n_heads", "num_labels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TabGPTConfig.{name} must be an int, got {value!r}")
        if self.n_numerical < 0:
            raise ValueError(f"TabGPTConfig.n_numerical must be >= 0, got {self.n_numerical}")
        bad = [c for c in self.categorical_cardinalities if c < 1]
        if bad:
            raise ValueError(f"TabGPTConfig.categorical_cardinalities must all be >= 1, got "
                             f"{self.categorical_cardinalities}")
        if self.n_features < 1:
            raise ValueError("TabGPTConfig needs at least one column: n_numerical is 0 and "
                             "categorical_cardinalities is empty")
        for name in ("d_token", "n_layers", "n_heads", "num_labels"):
            if getattr(self, name) < 1:
                raise ValueError(f"TabGPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_token % self.n_heads:
            raise ValueError(f"TabGPTConfig.d_token ({self.d_token}) must be divisible by "
                             f"n_heads ({self.n_heads})")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"TabGPTConfig.activation must be one of {ACTIVATIONS}, got "
                             f"{self.activation!r}")
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"TabGPTConfig.problem_type must be one of {PROBLEM_TYPES}, got "
                             f"{self.problem_type!r}")
        for name in ("attention_dropout", "ffn_dropout", "residual_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"TabGPTConfig.{name} must be in [0, 1), got "
                                 f"{getattr(self, name)}")
        if not 0.0 < self.mask_probability < 1.0:
            raise ValueError(f"TabGPTConfig.mask_probability must be in (0, 1), got "
                             f"{self.mask_probability}")
        if not self.contrastive_weight >= 0.0:
            raise ValueError(f"TabGPTConfig.contrastive_weight must be >= 0, got "
                             f"{self.contrastive_weight}")
        if not 0.0 < self.corruption_rate <= 1.0:
            raise ValueError(f"TabGPTConfig.corruption_rate must be in (0, 1], got "
                             f"{self.corruption_rate}")
        if not self.contrastive_temperature > 0.0:
            raise ValueError(f"TabGPTConfig.contrastive_temperature must be > 0, got "
                             f"{self.contrastive_temperature}")
        if self.ffn_factor <= 0 or self.d_ffn < 1:
            raise ValueError(f"TabGPTConfig.ffn_factor must make a hidden width >= 1, got "
                             f"{self.ffn_factor} (d_token {self.d_token})")

    @property
    def n_categorical(self) -> int:
        return len(self.categorical_cardinalities)

    @property
    def n_features(self) -> int:
        return self.n_numerical + self.n_categorical

    @property
    def d_ffn(self) -> int:
        """The feed-forward's hidden width."""
        return int(self.d_token * self.ffn_factor)

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["model_type"] = "tabgpt"
        return out

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TabGPTConfig":
        """The config of ``values``; a key that is not a field is an error naming it."""
        if not isinstance(values, dict):
            raise TypeError(f"TabGPTConfig.from_dict expects a dict, got {type(values).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known - set(_FILE_ONLY_KEYS))
        if unknown:
            raise ValueError(f"TabGPTConfig has no field {unknown[0]!r} (unknown keys {unknown}; "
                             f"fields are {sorted(known)})")
        if values.get("model_type", "tabgpt") != "tabgpt":
            raise ValueError(f"not a TabGPT config: model_type is {values['model_type']!r}")
        return cls(**{k: v for k, v in values.items() if k in known})

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: "os.PathLike[str] | str", **extra: Any) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({**self.to_dict(), **extra}, handle, indent=2, sort_keys=True)
            handle.write("\n")

    @classmethod
    def from_json_file(cls, path: "os.PathLike[str] | str") -> "TabGPTConfig":
        with open(path, encoding="utf-8") as handle:
            try:
                values = json.load(handle)
            except json.JSONDecodeError as error:
                raise ValueError(f"{os.fspath(path)} is not valid JSON: {error}") from None
        return cls.from_dict(values)
