"""``tabgpt.models``: the TabGPT models (``neural_arch.models.tabgpt``) under the guide's path.
``from_pretrained`` takes a local folder written by ``save_pretrained``; there is no hub."""
from ..models.tabgpt import (TabGPTConfig, TabGPTForPreTraining, TabGPTForRegression,
                             TabGPTForSequenceClassification, TabGPTModel)

__all__ = ["TabGPTConfig", "TabGPTForPreTraining", "TabGPTForRegression",
           "TabGPTForSequenceClassification", "TabGPTModel"]
