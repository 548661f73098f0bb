"""TabGPT: a transformer for tables (the FT-Transformer design), pretrained by masked-cell
modelling (optionally with SCARF's contrastive view) and fine-tuned with a classification or
regression head.

``neural_arch.data.tabular`` turns columns into the model's inputs (standardised numbers with
NaN for missing, category codes with -1 for missing); ``save_pretrained`` / ``from_pretrained``
keep a model, its config and that preprocessing in one local folder.
"""
from .backbone import TabGPTBlock, TabGPTFeedForward, TabGPTModel
from .config import TabGPTConfig
from .heads import TabGPTForRegression, TabGPTForSequenceClassification, TabGPTOutput
from .pretrained import TabGPTPreTrainedModel
from .pretraining import TabGPTForPreTraining, TabGPTPreTrainingOutput
from .scarf import ScarfCorruption, ScarfProjection
from .tokenizer import FeatureTokenizer

__all__ = ["TabGPTConfig", "TabGPTModel", "TabGPTBlock", "TabGPTFeedForward", "FeatureTokenizer",
           "TabGPTPreTrainedModel", "TabGPTForPreTraining", "TabGPTPreTrainingOutput",
           "TabGPTForSequenceClassification", "TabGPTForRegression", "TabGPTOutput",
           "ScarfCorruption", "ScarfProjection"]
