"""``neural_arch.nn.utils``: torch's ``torch.nn.utils`` path (gradient clipping, parameters as
one vector)."""
from .clip_grad import clip_grad_norm_, clip_grad_value_
from .convert_parameters import parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector",
           "vector_to_parameters"]
