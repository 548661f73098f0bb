"""``train_gpt --pp`` reports the validation accuracy of the one-process run of the same global
batch: the last pipeline stage counts the correct next-token predictions (over the vocabulary
split across its tensor-parallel ranks when ``--tp`` is given too), the counts are summed over
the data-parallel replicas and sent along the pipeline, as the loss is.

Real processes under the launcher, the tiny GPT of ``train_gpt_support``; one validation, at
step 3."""
import functools

import numpy as np
import pytest

from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test
import train_gpt_support
from train_gpt_support import MODEL, records, write_text

# the runs are checked by their metrics.jsonl: without tensorboardX (and the torch it imports)
run = functools.partial(train_gpt_support.run, tensorboard=False)

STEPS = ["--max-steps", 3]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


def validation(out_dir):
    """(val_loss, val_accuracy) of each validation record of a run."""
    return [(r["val_loss"], r["val_accuracy"]) for r in records(out_dir) if r["kind"] == "val"]


@pytest.fixture(scope="module")
def one_process(text, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "one"
    run("--data", text, *MODEL, *STEPS, "--batch-size", 8, "--out-dir", out)
    expected = validation(out)
    assert len(expected) == 1 and 0 < expected[0][1] < 1, expected
    return expected


@pytest.mark.timeout(200)
@pytest.mark.parametrize("flags,processes,batch", [
    (["--pp", 2], 2, 8),                         # dp 1 x tp 1 x pp 2
    (["--pp", 2, "--tp", 2], 4, 8),              # the last stage's vocabulary split over tp
    (["--pp", 2, "--zero-stage", 1], 4, 4),      # dp 2 (4 rows each): counts summed over dp
])
def test_pipeline_reports_the_one_process_val_accuracy(text, one_process, tmp_path, flags,
                                                       processes, batch):
    run("--data", text, *MODEL, *STEPS, "--batch-size", batch, "--out-dir", tmp_path, *flags,
        launcher=processes)
    got = validation(tmp_path)
    assert len(got) == 1 and got[0][1] is not None, got
    np.testing.assert_allclose(got[0][0], one_process[0][0], rtol=1e-5)
    np.testing.assert_allclose(got[0][1], one_process[0][1], rtol=0, atol=1e-6)
