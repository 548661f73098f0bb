"""``F.scaled_dot_product_attention`` with torch's signature and semantics: values and gradients
against torch for no mask, boolean masks (True = may attend), additive float masks, ``is_causal``
(top-left aligned, also with L != S; an error with a mask), fully masked rows,
``scale`` and ``dropout_p``."""
import numpy as np
import pytest

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch import Tensor

torch = pytest.importorskip("torch")
TF = torch.nn.functional

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(7)


def _qkv(batch=2, heads=3, length=4, source=5, embed=4, value_dim=6):
    return (RNG.standard_normal((batch, heads, length, embed)),
            RNG.standard_normal((batch, heads, source, embed)),
            RNG.standard_normal((batch, heads, source, value_dim)))


def _compare(arrays, dtype=np.float64, rtol=1e-7, atol=1e-9, **kwargs):
    """Our output and q, k, v gradients against torch's for the same inputs and keywords."""
    ours = [Tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    torch_kwargs = {key: (torch.tensor(value) if isinstance(value, np.ndarray) else value)
                    for key, value in kwargs.items()}
    out = F.scaled_dot_product_attention(*ours, **kwargs)
    expected = TF.scaled_dot_product_attention(*theirs, **torch_kwargs)
    assert out.array.dtype == dtype
    np.testing.assert_allclose(out.array, expected.detach().numpy(), rtol=rtol, atol=atol)
    upstream = RNG.standard_normal(out.array.shape).astype(dtype)
    (out * Tensor(upstream)).sum().backward()
    (expected * torch.tensor(upstream)).sum().backward()
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=rtol, atol=atol)


def test_reachable_at_both_paths_with_torch_parameter_names():
    assert (na.nn.functional.scaled_dot_product_attention
            is na.functional.scaled_dot_product_attention)
    q, k, v = (Tensor(a) for a in _qkv())
    mask = np.ones((4, 5), dtype=bool)
    out = F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask, dropout_p=0.0,
                                         is_causal=False, scale=None)
    assert out.shape == (2, 3, 4, 6)


def test_no_mask_float64_and_float32():
    _compare(_qkv())
    _compare(_qkv(), dtype=np.float32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("length,source", [(5, 5), (4, 6), (6, 4)])
def test_is_causal_is_top_left_aligned_like_torch(length, source):
    _compare(_qkv(length=length, source=source), is_causal=True)


def test_boolean_mask_true_takes_part_broadcast_over_batch_and_heads():
    mask = RNG.random((4, 5)) > 0.4
    mask[:, 0] = True
    _compare(_qkv(), attn_mask=mask)
    per_head = RNG.random((2, 3, 4, 5)) > 0.5
    per_head[..., 1] = True
    _compare(_qkv(), attn_mask=per_head)


def test_float_mask_is_added_to_the_scores():
    bias = RNG.standard_normal((1, 3, 4, 5))
    bias[..., 2] = -np.inf
    _compare(_qkv(), attn_mask=bias)


def test_is_causal_with_attn_mask_raises_as_torch_documents():
    q, k, v = (Tensor(a, requires_grad=True) for a in _qkv(length=5))
    mask = np.ones((5, 5), dtype=bool)
    with pytest.raises(RuntimeError, match="attn_mask"):
        TF.scaled_dot_product_attention(*(torch.tensor(t.array, requires_grad=True)
                                          for t in (q, k, v)),
                                        attn_mask=torch.tensor(mask), is_causal=True)
    with pytest.raises(RuntimeError, match="attn_mask.*is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)


def test_the_bottom_right_causal_keyword_combines_with_a_mask():
    mask = RNG.random((4, 6)) > 0.3
    allowed = mask & np.tril(np.ones((4, 6), dtype=bool), k=2)
    _compare(_qkv(length=4, source=6), attn_mask=allowed)
    q, k, v = (Tensor(a) for a in _qkv(length=4, source=6))
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, mask=mask, causal=True).array,
                               F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).array)


def test_fully_masked_rows_give_zeros_and_zero_gradients_like_torch():
    mask = np.ones((4, 5), dtype=bool)
    mask[1] = False
    _compare(_qkv(), attn_mask=mask)
    bias = np.zeros((4, 5))
    bias[2] = -np.inf
    _compare(_qkv(), attn_mask=bias)


def test_explicit_scale():
    _compare(_qkv(), scale=0.3)
    _compare(_qkv(), scale=0.7, is_causal=True)
    _compare(_qkv(), scale=0.5, attn_mask=np.tril(np.ones((4, 5), dtype=bool)))


def test_dropout_zero_is_exact_and_dropout_one_gives_zeros():
    _compare(_qkv(), dropout_p=0.0, is_causal=True)
    q, k, v = (Tensor(a) for a in _qkv())
    assert np.all(F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).array == 0)


def test_dropout_keeps_the_expectation():
    q, k, v = (Tensor(a) for a in _qkv(batch=1, heads=1, length=2, source=3, value_dim=1))
    na.manual_seed(0)
    mean = np.mean([F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).array
                    for _ in range(400)], axis=0)
    np.testing.assert_allclose(mean, F.scaled_dot_product_attention(q, k, v).array, atol=0.25)


def test_wrong_shapes_and_mask_dtypes_raise_with_the_shapes():
    q, k, v = (Tensor(a) for a in _qkv())
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention.*\(2, 3, 5, 3\)"):
        F.scaled_dot_product_attention(q, Tensor(np.zeros((2, 3, 5, 3))), v)
    with pytest.raises(ValueError, match=r"attn_mask.*\(3, 3\)"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 3), dtype=bool))
