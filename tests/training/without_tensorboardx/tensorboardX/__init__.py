"""First on the PYTHONPATH of a ``train_gpt_support.run(..., tensorboard=False)``: tensorboardX
fails to import, as where it is not installed, so that the metrics logger writes metrics.jsonl
alone and rank 0 does not spend seconds importing torch (which tensorboardX imports)."""
raise ImportError("tensorboardX is blocked here: this test reads metrics.jsonl only")
