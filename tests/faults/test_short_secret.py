"""A job secret too short to keep strangers out (under 16 bytes) is refused with a ValueError
naming the minimum and the length given, wherever a secret is read: the environment, the
per-user cookie file, the store's and the tcp transport's ``secret=``, and the launcher before it
starts any worker. Generated secrets pass."""
from __future__ import annotations

import pytest

from neural_arch.distributed.launch.config import LaunchConfig
from neural_arch.distributed.rendezvous import auth
from neural_arch.distributed.rendezvous.store import TCPStore
from neural_arch.distributed.transports import tcp_mesh

pytestmark = pytest.mark.timeout(60)


def _refused(call, length: int) -> None:
    with pytest.raises(ValueError) as err:
        call()
    assert f"{length} byte(s) long" in str(err.value) and "at least 16 bytes" in str(err.value)


@pytest.mark.parametrize("secret", [b"x", b"fifteen bytes!!"])
def test_a_short_secret_is_refused_wherever_it_is_read(tmp_path, monkeypatch, secret):
    monkeypatch.setenv(auth.SECRET_ENV, secret.decode())
    _refused(auth.job_secret, len(secret))
    script = tmp_path / "train.py"
    script.write_text("")
    _refused(lambda: LaunchConfig(str(script), nproc_per_node=2), len(secret))
    monkeypatch.delenv(auth.SECRET_ENV)
    _refused(lambda: LaunchConfig(str(script), env={auth.SECRET_ENV: secret.decode()}),
             len(secret))
    _refused(lambda: TCPStore("127.0.0.1", 0, is_server=True, secret=secret, timeout=5),
             len(secret))
    _refused(lambda: tcp_mesh.build_mesh(0, 2, None, 5.0, secret=secret), len(secret))
    monkeypatch.setenv("HOME", str(tmp_path))  # a cookie file someone wrote by hand
    cookie = auth.secret_file()
    cookie.parent.mkdir(mode=0o700)
    cookie.write_bytes(secret + b"\n")
    cookie.chmod(0o600)
    _refused(auth.job_secret, len(secret))


def test_secrets_of_sixteen_bytes_and_generated_ones_are_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv(auth.SECRET_ENV, "s" * 16)
    assert auth.job_secret() == b"s" * 16
    monkeypatch.delenv(auth.SECRET_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert len(auth.job_secret()) >= 16  # the per-user cookie this creates
    script = tmp_path / "train.py"
    script.write_text("")
    job_env, _ = LaunchConfig(str(script), nproc_per_node=2).job_environment()
    assert len(auth.check_secret(job_env[auth.SECRET_ENV].encode())) >= 16
