"""TabGPT against the same model written in torch, from the same weights: outputs, losses and
every parameter's gradient, in float32 and float64; and against finite differences."""
import numpy as np
import pytest

from neural_arch.core import manual_seed
from neural_arch.models.tabgpt import (TabGPTConfig, TabGPTForPreTraining,
                                       TabGPTForSequenceClassification)
from neural_arch.utils.checkpoint import checkpoint
from nn_gradients import check_parameter_gradients

pytestmark = pytest.mark.timeout(60)

TOLERANCES = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def small_config(**changes):
    values = dict(n_numerical=3, categorical_cardinalities=[4, 2], d_token=8, n_layers=2,
                  n_heads=2, attention_dropout=0.0, ffn_dropout=0.0, num_labels=3)
    values.update(changes)
    return TabGPTConfig(**values)


def mixed_rows(rows=6, seed=0):
    """Numbers with two missing cells, codes with one missing cell, labels of 3 classes."""
    rng = np.random.default_rng(seed)
    x_num = rng.standard_normal((rows, 3))
    x_num[1, 2] = x_num[4, 0] = np.nan
    x_cat = np.stack([rng.integers(0, 4, rows), rng.integers(0, 2, rows)], axis=1)
    x_cat[2, 1] = -1
    return x_num, x_cat, rng.integers(0, 3, rows)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", ["reglu", "gelu"])
def test_classifier_matches_torch(dtype, activation):
    torch = pytest.importorskip("torch")
    from tabgpt_torch_reference import Classifier, assert_gradients_equal, load_from
    manual_seed(0)
    config = small_config(activation=activation)
    ours = TabGPTForSequenceClassification(config, dtype=dtype)
    theirs = load_from(Classifier(config), ours, getattr(torch, np.dtype(dtype).name))
    x_num, x_cat, labels = mixed_rows()
    out = ours(x_num.astype(dtype), x_cat, labels=labels)
    out.loss.backward()
    logits, loss = theirs(torch.from_numpy(x_num.astype(dtype)), torch.from_numpy(x_cat),
                          torch.from_numpy(labels))
    loss.backward()
    tol = TOLERANCES[dtype]
    assert out.logits.dtype == dtype
    np.testing.assert_allclose(out.logits.array, logits.detach().numpy(), **tol)
    np.testing.assert_allclose(out.loss.item(), loss.item(), **tol)
    assert_gradients_equal(ours, theirs, **tol)


def test_regression_head_matches_torch():
    torch = pytest.importorskip("torch")
    from tabgpt_torch_reference import Classifier, assert_gradients_equal, load_from
    manual_seed(1)
    config = small_config(problem_type="regression", num_labels=1)
    ours = TabGPTForSequenceClassification(config, dtype=np.float64)
    theirs = load_from(Classifier(config), ours, torch.float64)
    x_num, x_cat, _ = mixed_rows(seed=1)
    target = np.random.default_rng(2).standard_normal(len(x_num))
    out = ours(x_num, x_cat, labels=target)
    out.loss.backward()
    logits, loss = theirs(torch.from_numpy(x_num), torch.from_numpy(x_cat),
                          torch.from_numpy(target))
    loss.backward()
    np.testing.assert_allclose(out.loss.item(), loss.item(), rtol=1e-10)
    assert_gradients_equal(ours, theirs, **TOLERANCES[np.float64])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pretraining_loss_and_gradients_match_torch(dtype):
    torch = pytest.importorskip("torch")
    from tabgpt_torch_reference import PreTraining, assert_gradients_equal, load_from
    manual_seed(2)
    config = small_config()
    ours = TabGPTForPreTraining(config, dtype=dtype)
    theirs = load_from(PreTraining(config), ours, getattr(torch, np.dtype(dtype).name))
    x_num, x_cat, _ = mixed_rows(rows=8, seed=3)
    cell_mask = np.random.default_rng(4).random((8, 5)) < 0.4
    cell_mask[1, 2] = cell_mask[2, 4] = True  # masked cells that are missing: not targets
    out = ours(x_num.astype(dtype), x_cat, cell_mask=cell_mask)
    out.loss.backward()
    loss, _ = theirs(torch.from_numpy(x_num.astype(dtype)), torch.from_numpy(x_cat),
                     torch.from_numpy(cell_mask))
    loss.backward()
    tol = TOLERANCES[dtype]
    np.testing.assert_allclose(out.loss.item(), loss.item(), **tol)
    assert_gradients_equal(ours, theirs, **tol)


def test_gradient_checkpointing_gives_the_same_gradients(monkeypatch):
    from neural_arch.models.tabgpt import backbone
    calls = []

    def counted_checkpoint(block, x):
        calls.append(block)
        return checkpoint(block, x)

    monkeypatch.setattr(backbone, "checkpoint", counted_checkpoint)
    manual_seed(3)
    config = small_config(n_layers=3)
    plain = TabGPTForSequenceClassification(config, dtype=np.float64)
    checkpointed = TabGPTForSequenceClassification(small_config(n_layers=3), dtype=np.float64)
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.gradient_checkpointing_enable()
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    x_num, x_cat, labels = mixed_rows()
    for model in (plain, checkpointed):
        model(x_num, x_cat, labels=labels).loss.backward()
    # every block but the last recomputed, and only in the checkpointed model
    assert calls == list(checkpointed.tabgpt.blocks)[:2]
    grads = dict(plain.named_parameters())
    for name, parameter in checkpointed.named_parameters():
        np.testing.assert_allclose(parameter.grad, grads[name].grad, rtol=1e-12, atol=1e-14,
                                   err_msg=name)


def test_gradients_match_finite_differences():
    manual_seed(4)
    config = small_config(n_layers=1, d_token=4, categorical_cardinalities=[3])
    model = TabGPTForPreTraining(config, dtype=np.float64)
    x_num, _, _ = mixed_rows(rows=5, seed=5)
    x_cat = np.array([[0], [2], [-1], [1], [0]])
    cell_mask = np.array([[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 1, 0], [0, 1, 0, 1]],
                         dtype=bool)

    def forward(module):
        out = module(x_num, x_cat, cell_mask=cell_mask)
        # the per-cell outputs and the loss, so that every parameter reaches the checked sum
        return out.numerical_predictions + out.categorical_logits[0].sum(-1, keepdims=True) \
            + out.loss

    check_parameter_gradients(model, forward, rtol=1e-5, atol=1e-8, max_entries=4)
