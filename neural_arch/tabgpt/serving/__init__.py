"""``tabgpt.serving``: ``DynamicBatcher`` (requests of different sizes and lengths into padded
batches), ``BatchingWorker`` (a thread that runs a model on them and answers each caller) and
``TabularPredictionService`` (a trained TabGPT behind both). Model code only: nothing here
imports the distributed package."""
from .batcher import PADDING_STRATEGIES, DynamicBatcher, PaddedBatch
from .service import TabularPredictionService
from .worker import BatchingWorker

__all__ = ["BatchingWorker", "DynamicBatcher", "PADDING_STRATEGIES", "PaddedBatch",
           "TabularPredictionService"]
