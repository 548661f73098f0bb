"""The SCARF contrastive view of TabGPT's pretraining: the loss and every gradient against the
same computation in torch from the same weights, and the corruption's statistics."""
import numpy as np
import pytest

from neural_arch.core import manual_seed
from neural_arch.models.tabgpt import (TabGPTConfig, TabGPTForPreTraining,
                                       TabGPTForSequenceClassification)
from neural_arch.models.tabgpt.scarf import ScarfCorruption, corrupt_rows, sample_corruption

pytestmark = pytest.mark.timeout(60)

TOLERANCES = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def contrastive_config(**changes):
    values = dict(n_numerical=3, categorical_cardinalities=[4, 2], d_token=8, n_layers=2,
                  n_heads=2, attention_dropout=0.0, ffn_dropout=0.0, contrastive_weight=0.5,
                  corruption_rate=0.6, contrastive_temperature=0.7)
    values.update(changes)
    return TabGPTConfig(**values)


def mixed_rows(rows=8, seed=3):
    rng = np.random.default_rng(seed)
    x_num = rng.standard_normal((rows, 3))
    x_num[1, 2] = x_num[4, 0] = np.nan
    x_cat = np.stack([rng.integers(0, 4, rows), rng.integers(0, 2, rows)], axis=1)
    x_cat[2, 1] = -1
    return x_num, x_cat


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_contrastive_loss_and_gradients_match_torch(dtype):
    torch = pytest.importorskip("torch")
    from tabgpt_torch_reference import PreTraining, assert_gradients_equal, load_from
    manual_seed(5)
    config = contrastive_config()
    ours = TabGPTForPreTraining(config, dtype=dtype)
    theirs = load_from(PreTraining(config), ours, getattr(torch, np.dtype(dtype).name))
    x_num, x_cat = mixed_rows()
    rng = np.random.default_rng(6)
    cell_mask = rng.random((8, 5)) < 0.4
    corruption = sample_corruption(8, 5, config.corruption_rate, rng)
    out = ours(x_num.astype(dtype), x_cat, cell_mask=cell_mask, corruption=corruption)
    out.loss.backward()
    loss, contrastive = theirs(torch.from_numpy(x_num.astype(dtype)), torch.from_numpy(x_cat),
                               torch.from_numpy(cell_mask),
                               torch.from_numpy(corruption.source_rows))
    loss.backward()
    tol = TOLERANCES[dtype]
    assert contrastive.item() > 0.5  # a real term, not a vanishing one
    np.testing.assert_allclose(out.contrastive_loss.item(), contrastive.item(), **tol)
    np.testing.assert_allclose(out.loss.item(), loss.item(), **tol)
    assert_gradients_equal(ours, theirs, **tol)  # the projection head's included


def test_corruption_replaces_a_fixed_share_of_each_row_from_the_same_column():
    rows, columns, rate = 600, 7, 0.3  # floor(0.3 x 7) = 2 cells of each row
    corruption = sample_corruption(rows, columns, rate, np.random.default_rng(0))
    assert (corruption.replaced.sum(axis=1) == 2).all()
    own = np.arange(rows)[:, None].repeat(columns, axis=1)
    replaced = corruption.replaced
    assert (corruption.source_rows[replaced] != own[replaced]).all()  # another row
    assert (corruption.source_rows[~replaced] == own[~replaced]).all()
    # every column is chosen about equally often (2 of 7 per row), within 5 sigma
    per_column = replaced.sum(axis=0)
    expected, sigma = rows * 2 / columns, np.sqrt(rows * (2 / columns) * (5 / columns))
    assert (np.abs(per_column - expected) < 5 * sigma).all(), per_column
    # the source rows are spread over the batch: no row gives more than a few cells
    counts = np.bincount(corruption.source_rows[replaced], minlength=rows)
    assert counts.max() <= 10 and (counts > 0).mean() > 0.75

    rng = np.random.default_rng(1)
    x_num = rng.standard_normal((rows, 4))
    x_num[::9, 1] = np.nan
    x_cat = rng.integers(0, 50, (rows, 3))
    twin_num, twin_cat = corrupt_rows(x_num, x_cat, corruption)
    for twin, original, offset in ((twin_num, x_num, 0), (twin_cat, x_cat, 4)):
        for j in range(original.shape[1]):
            moved = replaced[:, offset + j]
            expect = original[corruption.source_rows[moved, offset + j], j]
            np.testing.assert_array_equal(twin[moved, j], expect)
            np.testing.assert_array_equal(twin[~moved, j], original[~moved, j])
            # a replaced value is one of the column's own values (its empirical marginal)
            kept = twin[moved, j]
            assert np.isin(kept[~np.isnan(kept.astype(float))], original[:, j]).all()
    assert twin_num.shape == x_num.shape and twin_cat.dtype == x_cat.dtype


def test_drawn_views_repeat_under_manual_seed_and_add_to_the_masked_cell_loss():
    config = contrastive_config()
    x_num, x_cat = mixed_rows()
    outputs = []
    for _ in range(2):
        manual_seed(7)
        model = TabGPTForPreTraining(config, dtype=np.float64)
        outputs.append(model(x_num, x_cat))
    first, second = outputs
    np.testing.assert_array_equal(first.corruption.source_rows, second.corruption.source_rows)
    assert first.loss.item() == second.loss.item()
    assert (first.corruption.replaced.sum(axis=1) == 3).all()  # floor(0.6 x 5)
    # the loss is the masked-cell loss plus the weighted contrastive one
    manual_seed(8)
    plain = TabGPTForPreTraining(contrastive_config(contrastive_weight=0.0), dtype=np.float64)
    plain.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.startswith("contrastive_projection.")})
    masked = plain(x_num, x_cat, cell_mask=second.cell_mask)
    assert masked.contrastive_loss is None and masked.corruption is None
    np.testing.assert_allclose(second.loss.item(),
                               masked.loss.item() + 0.5 * second.contrastive_loss.item(),
                               rtol=1e-12)


def test_a_contrastive_checkpoint_loads_into_a_classifier(tmp_path):
    manual_seed(9)
    pretraining = TabGPTForPreTraining(contrastive_config())
    pretraining.save_pretrained(tmp_path / "scarf")
    classifier = TabGPTForSequenceClassification.from_pretrained(tmp_path / "scarf")
    assert classifier.newly_initialized_keys == ["classifier.bias", "classifier.weight"]
    assert classifier.config.contrastive_weight == 0.5


def test_bad_corruption_and_config_values_are_errors_naming_them():
    model = TabGPTForPreTraining(contrastive_config())
    x_num, x_cat = mixed_rows(rows=6)
    wrong = ScarfCorruption(np.zeros((6, 5), bool), np.full((6, 5), 9))
    with pytest.raises(ValueError, match="source_rows must be row numbers in"):
        model(x_num, x_cat, corruption=wrong)
    with pytest.raises(ValueError, match=r"replaced must be a bool array of shape \(6, 5\)"):
        model(x_num, x_cat, corruption=ScarfCorruption(np.zeros((6, 3), bool),
                                                       np.zeros((6, 3), int)))
    for field, value in (("contrastive_weight", -1.0), ("corruption_rate", 0.0),
                         ("corruption_rate", 1.5), ("contrastive_temperature", 0.0)):
        with pytest.raises(ValueError, match=f"TabGPTConfig.{field}"):
            contrastive_config(**{field: value})


def test_the_trainers_pretraining_path_carries_the_contrastive_view():
    """The Trainer's module (packed rows in) gives the model's loss, contrastive term and all."""
    from neural_arch.tabgpt.training.rows import TabularTrainingModule
    config = contrastive_config()
    x_num, x_cat = mixed_rows()
    manual_seed(10)
    model = TabGPTForPreTraining(config, dtype=np.float64)
    packed = np.concatenate([x_num, x_cat.astype(np.float64)], axis=1)
    manual_seed(11)
    _, through_trainer = TabularTrainingModule(model)(packed, None)
    manual_seed(11)
    direct = model(x_num.astype(np.float32), x_cat)
    assert direct.contrastive_loss is not None
    assert through_trainer.item() == direct.loss.item()
