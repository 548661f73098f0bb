"""``python -m neural_arch.train_gpt --device cuda`` on a real GPU: one process, two processes
sharing the GPU through the launcher (data parallel, ZeRO-1, tensor parallel), and a resume,
each against the same run on the CPU (the same weights, batches and order; float32 on both, so
the losses agree to rounding).
Skipped where CuPy or a CUDA device is missing."""
import numpy as np
import pytest

from gpu_testing import needs_gpu
from train_gpt_support import MODEL, losses, records, run, write_text

pytestmark = [needs_gpu, pytest.mark.timeout(300)]
STEPS = ["--batch-size", 8, "--max-steps", 6]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


def _follows(out, reference):
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(losses(out, key), losses(reference, key), rtol=1e-4,
                                   err_msg=key)
    # validation accuracy as on the CPU (under --tp too: the argmax over the split vocabulary)
    accuracy = [[r["val_accuracy"] for r in records(run) if r["kind"] == "val"]
                for run in (out, reference)]
    assert len(accuracy[0]) == len(accuracy[1]) > 0, accuracy
    for gpu, cpu in zip(*accuracy):
        assert gpu is not None and cpu is not None and abs(gpu - cpu) < 0.01, accuracy


@pytest.mark.parametrize("processes,flags", [(1, []), (2, []), (2, ["--zero-stage", 1]),
                                             (2, ["--tp", 2])])
def test_cuda_follows_the_cpu_run(text, tmp_path, processes, flags):
    run("--data", text, *MODEL, *STEPS, *flags, "--out-dir", tmp_path / "cpu",
        launcher=processes)
    run("--data", text, *MODEL, *STEPS, *flags, "--out-dir", tmp_path / "gpu", "--device", "cuda",
        launcher=processes)
    _follows(tmp_path / "gpu", tmp_path / "cpu")


def test_cuda_resume_continues_the_run(text, tmp_path):
    run("--data", text, *MODEL, *STEPS, "--out-dir", tmp_path / "whole", "--device", "cuda")
    half = ["--batch-size", 8, "--max-steps", 3]
    run("--data", text, *MODEL, *half, "--out-dir", tmp_path / "resumed", "--device", "cuda")
    run("--data", text, *MODEL, *STEPS, "--out-dir", tmp_path / "resumed", "--device", "cuda",
        "--resume")
    np.testing.assert_allclose(losses(tmp_path / "resumed"), losses(tmp_path / "whole"),
                               rtol=1e-5)
    sampled = run("--out-dir", tmp_path / "whole", "--sample", 20, "--prompt", "the ").stdout
    assert sampled.startswith("the ")
