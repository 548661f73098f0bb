"""``save_pretrained`` / ``from_pretrained`` for the TabGPT models, on local folders only.

A folder holds ``config.json`` (the ``TabGPTConfig`` and the class that wrote it),
``model.safetensors`` (the ``state_dict``) and, when one was given, ``preprocessor.json`` (the
fitted column statistics the model was trained on). There is no model hub: a name that is not a
folder is an error, never a download.

Weights move between the TabGPT classes: every class holds the backbone under the same names
(``tabgpt.`` in the models with a head, no prefix in the bare ``TabGPTModel``), so a pretraining
checkpoint loads into a classifier, whose head then starts freshly initialised (listed in
``model.newly_initialized_keys``). A backbone weight missing from the folder is an error.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import numpy as np

from ...data.tabular.preprocessor import PREPROCESSOR_FILE as PREPROCESSOR_NAME
from ...nn import Module, load_state_dict_file, save_state_dict
from .config import TabGPTConfig

__all__ = ["CONFIG_NAME", "PREPROCESSOR_NAME", "WEIGHTS_NAME", "TabGPTPreTrainedModel",
           "pretrained_folder"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def pretrained_folder(name_or_path: Any) -> str:
    """``name_or_path`` as a folder's path; anything else raises ``ValueError``."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"from_pretrained expects a folder path, got "
                        f"{type(name_or_path).__name__}")
    path = os.fspath(name_or_path)
    if not os.path.isdir(path):
        raise ValueError(f"from_pretrained: {path!r} is not a folder. There is no model hub to "
                         f"download from: pass a folder written by save_pretrained")
    for needed in (CONFIG_NAME, WEIGHTS_NAME):
        if not os.path.isfile(os.path.join(path, needed)):
            raise ValueError(f"from_pretrained: the folder {path!r} has no {needed} (a folder "
                             f"written by save_pretrained holds {CONFIG_NAME} and {WEIGHTS_NAME})")
    return path


def _float_dtype(weights: Dict[str, np.ndarray]) -> Any:
    for array in weights.values():
        if array.dtype.kind == "f":
            return array.dtype
    return None


class TabGPTPreTrainedModel(Module):
    """The folder I/O shared by the TabGPT models; subclasses are built as ``cls(config,
    dtype=...)`` and keep their ``TabGPTConfig`` in ``self.config``."""

    base_model_prefix = "tabgpt"
    config: TabGPTConfig

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each block's activations during backward instead of keeping them
        (training only, every block but the last): less memory for one more forward of them."""
        self.config.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.config.gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        return bool(self.config.gradient_checkpointing)

    def save_pretrained(self, save_directory: Any, preprocessor: Any = None) -> None:
        """Write ``config.json``, ``model.safetensors`` and, given a fitted preprocessor (an
        object with ``to_dict()``), ``preprocessor.json`` into ``save_directory``."""
        path = os.fspath(save_directory)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"save_pretrained: {path!r} exists and is not a folder")
        if preprocessor is not None and not callable(getattr(preprocessor, "to_dict", None)):
            raise TypeError(f"save_pretrained: preprocessor must have a to_dict() method, got "
                            f"{type(preprocessor).__name__}")
        os.makedirs(path, exist_ok=True)
        self.config.to_json_file(os.path.join(path, CONFIG_NAME),
                                 architectures=[type(self).__name__])
        save_state_dict(self, os.path.join(path, WEIGHTS_NAME))
        if preprocessor is not None:
            with open(os.path.join(path, PREPROCESSOR_NAME), "w", encoding="utf-8") as handle:
                json.dump(preprocessor.to_dict(), handle, indent=2)
                handle.write("\n")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *, dtype: Any = None,
                        **config_changes: Any) -> "TabGPTPreTrainedModel":
        """The model saved in a local folder. ``dtype`` defaults to the saved weights' dtype;
        keyword arguments replace config fields (``num_labels=3``, ``problem_type=...``) for a
        head that differs from the saved one."""
        path = pretrained_folder(pretrained_model_name_or_path)
        config = TabGPTConfig.from_json_file(os.path.join(path, CONFIG_NAME))
        if config_changes:
            config = TabGPTConfig.from_dict({**config.to_dict(), **config_changes})
        weights = load_state_dict_file(os.path.join(path, WEIGHTS_NAME))
        model = cls(config, dtype=dtype if dtype is not None else _float_dtype(weights))
        model.load_pretrained_weights(weights, source=path)
        return model

    def load_pretrained_weights(self, weights: Dict[str, Any], source: str = "state dict"
                                ) -> List[str]:
        """Load the backbone (required, under either naming) and whichever head weights
        ``weights`` has; returns and records the keys left as initialised."""
        own = self.state_dict()
        prefix = self.base_model_prefix + "."
        bare_model = not hasattr(self, self.base_model_prefix)
        saved_bare = not any(key.startswith(prefix) for key in weights)
        mapped: Dict[str, Any] = {}
        for key, value in weights.items():
            if bare_model and key.startswith(prefix):
                key = key[len(prefix):]
            elif not bare_model and saved_bare:
                key = prefix + key
            mapped[key] = value
        backbone = list(own) if bare_model else [k for k in own if k.startswith(prefix)]
        absent = [key for key in backbone if key not in mapped]
        if absent:
            raise ValueError(f"from_pretrained: {source} lacks {len(absent)} backbone weights "
                             f"of {type(self).__name__}, e.g. {absent[:3]} (was it saved from "
                             f"a model with other columns or layers?)")
        self.load_state_dict({k: v for k, v in mapped.items() if k in own}, strict=False)
        self.newly_initialized_keys = sorted(k for k in own if k not in mapped)
        return self.newly_initialized_keys
