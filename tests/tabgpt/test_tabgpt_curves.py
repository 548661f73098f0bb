"""The training-curve figure: a real (tiny) pretraining and fine-tuning run, drawn from the
runs' own metrics into two PNG files."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(90)


def _train_losses(folder):
    with open(folder / "metrics.jsonl", encoding="utf-8") as handle:
        return [r["loss"] for r in map(json.loads, handle) if r["kind"] == "train"]


@pytest.mark.slow
def test_a_tiny_run_draws_its_pretraining_and_fine_tuning_curves(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib import image as matplotlib_image
    from neural_arch import plot_metrics
    from neural_arch.tabgpt import curves
    drawn = {}
    real_draw = plot_metrics.draw_curves

    def recording_draw(found, title, out, **options):
        drawn[out] = found
        return real_draw(found, title, out, **options)

    monkeypatch.setattr(curves, "draw_curves", recording_draw)
    paths = curves.pretrain_and_fine_tune(str(tmp_path), pretrain_epochs=2, epochs=2,
                                          d_token=8, n_layers=1, n_heads=2, batch_size=48,
                                          contrastive_weight=0.5)
    assert set(paths) == {"pretraining", "fine_tuning"}
    for name, path in paths.items():
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n", name
        pixels = matplotlib_image.imread(path)
        assert pixels.shape[0] > 300 and pixels[..., :3].std() > 0.05  # a drawing, not blank
        # the curves drawn are the run's own records: 2 epochs of 3 batches (142 rows by 48)
        steps, losses = drawn[path]["train"]
        assert steps == list(range(1, 7))
        np.testing.assert_allclose(losses, _train_losses(tmp_path / name))
        assert len(drawn[path]["val"][0]) == 2  # the held-out loss after each epoch
    assert (tmp_path / "pretrained" / "model.safetensors").is_file()


def test_the_command_refuses_zero_epochs_with_one_line(tmp_path, capsys):
    from neural_arch.tabgpt.curves import main
    assert main([str(tmp_path), "--epochs", "0"]) == 2
    assert "epochs must be >= 1" in capsys.readouterr().err
