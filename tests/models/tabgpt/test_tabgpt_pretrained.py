"""TabGPT's folders (save_pretrained / from_pretrained), its config's JSON, its input checks,
and masked-cell pretraining learning on a bundled table."""
import json
import os

import numpy as np
import pytest

from neural_arch.core import manual_seed, no_grad
from neural_arch.data.tabular import TabularPreprocessor, load_bundled, split_datasets
from neural_arch.models.tabgpt import (TabGPTConfig, TabGPTForPreTraining,
                                       TabGPTForRegression, TabGPTForSequenceClassification,
                                       TabGPTModel)
from neural_arch.optim import AdamW

pytestmark = pytest.mark.timeout(60)


def tiny_config(**changes):
    values = dict(n_numerical=2, categorical_cardinalities=[3], d_token=8, n_layers=2,
                  n_heads=2, num_labels=2)
    values.update(changes)
    return TabGPTConfig(**values)


ROWS = (np.array([[0.5, -1.0], [np.nan, 2.0], [1.5, 0.0]]), np.array([[0], [2], [-1]]))


def test_save_and_from_pretrained_give_identical_outputs(tmp_path):
    manual_seed(0)
    table = {"size": np.array([1.0, 2.0, np.nan, 4.0]), "age": np.array([3.0, 1.0, 2.0, 5.0]),
             "city": np.array(["a", "b", "a", None], dtype=object), "y": np.array([0, 1, 1, 0])}
    prep = TabularPreprocessor(target="y").fit(table)
    model = TabGPTForSequenceClassification(TabGPTConfig(**prep.model_config(), d_token=8,
                                                         n_layers=2, n_heads=2))
    model.eval()
    model.save_pretrained(tmp_path / "run", preprocessor=prep)
    assert sorted(os.listdir(tmp_path / "run")) == ["config.json", "model.safetensors",
                                                    "preprocessor.json"]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["architectures"] == ["TabGPTForSequenceClassification"]
    loaded = TabGPTForSequenceClassification.from_pretrained(tmp_path / "run")
    loaded.eval()
    assert loaded.config == model.config and loaded.newly_initialized_keys == []
    prep_again = TabularPreprocessor.from_pretrained(tmp_path / "run")
    rows, again = prep.transform(table), prep_again.transform(table)
    np.testing.assert_array_equal(rows.x_cat, again.x_cat)
    np.testing.assert_array_equal(rows.x_num, again.x_num)
    with no_grad():
        np.testing.assert_array_equal(model(rows.x_num, rows.x_cat).logits.array,
                                      loaded(again.x_num, again.x_cat).logits.array)


def test_float64_round_trip_keeps_the_dtype(tmp_path):
    model = TabGPTModel(tiny_config(), dtype=np.float64)
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = TabGPTModel.from_pretrained(tmp_path)
    loaded.eval()
    assert loaded.cls_token.dtype == np.float64
    with no_grad():
        np.testing.assert_array_equal(model(*ROWS).array, loaded(*ROWS).array)


def test_pretrained_backbone_loads_under_a_new_head(tmp_path):
    manual_seed(1)
    pretrained = TabGPTForPreTraining(tiny_config())
    pretrained.save_pretrained(tmp_path)
    classifier = TabGPTForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert classifier.config.num_labels == 4
    assert classifier.newly_initialized_keys == ["classifier.bias", "classifier.weight"]
    theirs = pretrained.state_dict()
    for name, value in classifier.state_dict().items():
        if name.startswith("tabgpt."):
            np.testing.assert_array_equal(value, theirs[name], err_msg=name)
    bare = TabGPTModel.from_pretrained(tmp_path)  # the backbone alone, prefix dropped
    np.testing.assert_array_equal(bare.cls_token.array, pretrained.tabgpt.cls_token.array)
    regression = TabGPTForRegression.from_pretrained(tmp_path, problem_type="regression",
                                                     num_labels=1)
    assert regression.classifier.weight.shape == (1, 8)


def test_from_pretrained_refuses_what_is_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match=r"'tabgpt-base' is not a folder.*no model hub"):
        TabGPTForPreTraining.from_pretrained("tabgpt-base")
    (tmp_path / "file.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a folder"):
        TabGPTModel.from_pretrained(tmp_path / "file.json")
    with pytest.raises(ValueError, match=r"has no config\.json"):
        TabGPTModel.from_pretrained(tmp_path)
    TabGPTModel(tiny_config()).save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match=r"lacks \d+ backbone weights"):
        TabGPTModel.from_pretrained(tmp_path / "small", n_layers=3)


def test_config_json_round_trip_and_unknown_fields(tmp_path):
    config = tiny_config(activation="gelu", problem_type="regression", num_labels=1)
    assert TabGPTConfig.from_dict(json.loads(config.to_json_string())) == config
    with pytest.raises(ValueError, match="no field 'hidden_size'"):
        TabGPTConfig.from_dict({**config.to_dict(), "hidden_size": 8})
    with pytest.raises(ValueError, match=r"d_token \(10\) must be divisible by n_heads \(4\)"):
        tiny_config(d_token=10, n_heads=4)
    with pytest.raises(ValueError, match="at least one column"):
        TabGPTConfig()


def test_bad_inputs_raise_with_their_values():
    model = TabGPTForSequenceClassification(tiny_config())
    x_num, x_cat = ROWS
    with pytest.raises(TypeError, match="x_cat must hold integer category codes.*float64"):
        model(x_num, x_cat.astype(np.float64))
    with pytest.raises(ValueError, match=r"x_cat\[1, 0\] = 3 is outside \[-1, 3\)"):
        model(x_num, np.array([[0], [3], [1]]))
    with pytest.raises(ValueError, match=r"x_num must have shape \(rows, 2\), got \(3, 3\)"):
        model(np.zeros((3, 3)), x_cat)
    with pytest.raises(TypeError, match="x_num must hold numbers"):
        model(np.array([["a", "b"]] * 3), x_cat)
    with pytest.raises(ValueError, match="x_cat is required"):
        model(x_num)
    with pytest.raises(TypeError, match="labels must be integer class indices"):
        model(x_num, x_cat, labels=np.array([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 2\), got values from 0 to 5"):
        model(x_num, x_cat, labels=np.array([0, 5, 1]))
    with pytest.raises(ValueError, match=r"cell_mask must have shape \(3, 3\)"):
        TabGPTForPreTraining(tiny_config())(x_num, x_cat, cell_mask=np.zeros((3, 2), bool))


def test_masked_cell_pretraining_learns_on_wine():
    manual_seed(0)
    table, target = load_bundled("wine")
    prep = TabularPreprocessor(target=target)
    train, _ = split_datasets(table, prep, test_fraction=0.2, seed=0)
    config = TabGPTConfig(**prep.model_config(), d_token=16, n_layers=1, n_heads=2,
                          attention_dropout=0.0, ffn_dropout=0.0, mask_probability=0.3)
    model = TabGPTForPreTraining(config)
    x_num, x_cat, _ = train.arrays()
    probe = np.random.default_rng(0).random(x_num.shape) < 0.3  # one fixed mask to score

    def probe_loss():
        model.eval()
        with no_grad():
            loss = model(x_num, x_cat, cell_mask=probe).loss.item()
        model.train()
        return loss

    before = probe_loss()
    optimizer = AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(40):  # a freshly drawn mask each step
        loss = model(x_num, x_cat).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = probe_loss()
    # an untrained model predicts about 0 for standardised values (loss ~1); learning to read
    # a masked cell from the other columns must bring it clearly below that
    assert after < 0.75 * before, (before, after)
