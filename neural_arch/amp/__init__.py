"""Automatic mixed precision with torch's names: ``autocast`` and ``GradScaler``."""
from .autocast import autocast, get_autocast_dtype, is_autocast_enabled
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype"]
