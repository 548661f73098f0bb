"""metrics.jsonl from a Trainer run, and plot_metrics drawing its loss curves to a PNG."""
import json
import os
import sys

import pytest

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.plot_metrics import main, read_curves
from neural_arch.training import Trainer, TrainingConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_job import problem  # noqa: E402

pytest.importorskip("matplotlib", reason="plot_metrics draws with matplotlib (the dev extra)")


@pytest.fixture
def run_dir(tmp_path):
    manual_seed(0)
    model = MLP([6, 16, 2])
    train, val = problem()
    config = TrainingConfig(epochs=2, log_interval=2, eval_interval=4, metrics_dir=str(tmp_path),
                            verbose=False, tokens_per_sample=1)
    Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy, config).fit(
        DataLoader(train, batch_size=8), DataLoader(val, batch_size=8))
    return tmp_path


def test_metrics_lines_carry_the_documented_fields(run_dir):
    with open(run_dir / "metrics.jsonl") as handle:
        records = [json.loads(line) for line in handle]
    kinds = [r["kind"] for r in records]
    assert kinds.count("train") == 8 and kinds.count("val") == 4 and kinds.count("epoch") == 2
    for record in records:
        assert {"kind", "step", "epoch", "time"} <= set(record)
        if record["kind"] == "train":
            assert {"loss", "lr", "grad_norm", "samples_per_second", "tokens_per_second",
                    "comm_seconds"} <= set(record)
        else:
            assert {"val_loss", "val_accuracy"} <= set(record)


def test_plot_metrics_writes_a_png(run_dir):
    curves = read_curves(str(run_dir))
    assert len(curves["train"][0]) == 8 and len(curves["val"][0]) == 6
    out = run_dir / "curves.png"
    assert main([str(run_dir), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_metrics_reports_a_missing_run(tmp_path, capsys):
    assert main([str(tmp_path / "nothing")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_tensorboard_scalars_when_tensorboardx_is_installed(tmp_path, monkeypatch):
    """A stand-in tensorboardX records what the logger hands it."""
    import types
    from neural_arch.training import MetricsLogger
    calls = []

    class SummaryWriter:
        def __init__(self, logdir):
            calls.append(("logdir", logdir))

        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

        def close(self):
            calls.append(("closed",))

    monkeypatch.setitem(sys.modules, "tensorboardX",
                        types.SimpleNamespace(SummaryWriter=SummaryWriter))
    logger = MetricsLogger(str(tmp_path))
    logger.log("train", 3, {"loss": 1.5, "lr": 0.1, "epoch": 0, "grad_norm": float("nan")})
    logger.close()
    assert calls == [("logdir", str(tmp_path / "tensorboard")), ("train/loss", 1.5, 3),
                     ("train/lr", 0.1, 3), ("closed",)]
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line == {"kind": "train", "step": 3, "loss": 1.5, "lr": 0.1, "epoch": 0,
                    "grad_norm": None}


def _event_scalars(directory):
    """{tag: [(step, value)]} read back from tensorboardX's event files (TFRecord frames:
    8-byte length, 4-byte CRC, an Event protobuf, 4-byte CRC)."""
    import struct

    from tensorboardX.proto import event_pb2
    scalars = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_event_files_hold_the_metrics_lines(tmp_path):
    """The real tensorboardX: what metrics.jsonl says, the event files say too."""
    pytest.importorskip("tensorboardX", reason="TensorBoard output needs tensorboardX")
    from neural_arch.training.metrics import MetricsLogger
    logger = MetricsLogger(str(tmp_path))
    logger.log("train", 2, {"epoch": 0, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.75,
                            "tokens_per_second": 1234.0, "comm_seconds": 0.125})
    logger.log("train", 4, {"epoch": 0, "loss": 2.25, "lr": 5e-4, "grad_norm": None,
                            "tokens_per_second": 1300.0, "comm_seconds": 0.0})
    logger.log("val", 4, {"epoch": 0, "val_loss": 2.75, "val_accuracy": 0.5})
    logger.close()
    scalars = _event_scalars(tmp_path / "tensorboard")
    assert scalars["train/loss"] == [(2, 2.5), (4, 2.25)]
    assert scalars["train/lr"] == [(2, pytest.approx(1e-3)), (4, pytest.approx(5e-4))]
    assert scalars["train/grad_norm"] == [(2, 0.75)]  # None is not a number to plot
    assert scalars["train/tokens_per_second"] == [(2, 1234.0), (4, 1300.0)]
    assert scalars["train/comm_seconds"] == [(2, 0.125), (4, 0.0)]
    assert scalars["val/val_loss"] == [(4, 2.75)]
    assert "train/epoch" not in scalars
