"""RayTrainer and ``neural_arch.cli train --backend ray`` through Ray Client (``ray://``) on a
running two-node cluster (``conftest.ray_client_cluster``), whose nodes do not have the tests'
folders on their search path, as a cluster elsewhere would not:

- a loop from a module only the driver has fails at once, saying how to ship it;
- shipped (``runtime_env={"py_modules": [...]}``), the digits MLP on 2 workers trains to the
  launcher run's losses (1e-6);
- the command line ships the script's folder itself: the workers run a copy of it, which
  imports a module beside it, and the run's folder goes to ``NEURAL_ARCH_RAY_STORAGE``.

The fixture checks that the cluster leaves no process behind once it is shut down."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import launcher_losses, run_cli, trainer

pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]


def test_a_loop_the_cluster_cannot_import_fails_saying_how_to_ship_it(ray_client_cluster,
                                                                       tmp_path):
    import ray
    import ray_jobs
    _, address = ray_client_cluster
    with pytest.raises(RuntimeError) as caught:
        trainer(ray_jobs.digits_loop, tmp_path, "unshipped", address=address).fit()
    message = str(caught.value)
    assert "module 'ray_jobs'" in message and ray_jobs.__file__ in message, message
    assert "No module named 'ray_jobs'" in message, message
    assert f"runtime_env={{'py_modules': [{ray_jobs.__file__!r}]}}" in message, message
    assert not ray.is_initialized()  # the connection the run opened is closed


def test_digits_through_ray_client_equals_the_launcher_run(ray_client_cluster, tmp_path):
    import ray
    import ray_jobs
    from neural_arch.ray.runtime import ensure_ray
    _, address = ray_client_cluster
    # ray.init(address, runtime_env=...), as the error says, with ensure_ray's retry of a
    # connection Ray Client's server refuses now and then
    assert ensure_ray(address, runtime_env={"py_modules": [ray_jobs.__file__]})
    try:
        result = trainer(ray_jobs.digits_loop, tmp_path, "digits").fit()
    finally:
        ray.shutdown()
    assert result.error is None and result.attempts == 1
    reference = launcher_losses(tmp_path)
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose(result.metrics[key], reference[key], rtol=1e-6, err_msg=key)
    assert reference["train_loss"][-1] < reference["train_loss"][0]  # it learns


def test_the_command_line_ships_the_script_through_ray_client(ray_client_cluster, tmp_path):
    _, address = ray_client_cluster
    records, script, done = run_cli(tmp_path, "--address", address)
    for record in records:
        # a copy of the script's folder, unpacked by Ray, is the worker's working directory
        assert record["file"] != script, record
        assert record["file"] == record["argv"][0] == f"{record['cwd']}/train.py", record
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [
        line.rsplit("/", 1)[1] for line in done.stdout.splitlines() if "run folder" in line]
