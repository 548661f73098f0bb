"""The job's shared secret: ``$NEURAL_ARCH_SECRET`` when set, else a per-user cookie file
(``~/.neural_arch/secret``, mode 600) created on first use. Every rank of a job must hold the
same secret; the handshake (``auth.py``) proves it without sending it.

The cookie is written to a temporary file and hard-linked into place, so ranks that start at
once agree on one cookie and none reads a half-written one.
"""
from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path

from ..errors import AuthenticationError

SECRET_ENV = "NEURAL_ARCH_SECRET"
MIN_SECRET_BYTES = 16  # below this a secret can be guessed; generated ones have 32 or more


def secret_file() -> Path:
    return Path.home() / ".neural_arch" / "secret"


def check_secret(secret, source: str = "the job secret") -> bytes:
    """``secret`` as bytes; a ValueError when it is too short to keep strangers out."""
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError(f"{source} must be bytes, got {type(secret).__name__}")
    secret = bytes(secret)
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{source} is {len(secret)} byte(s) long; a job secret needs at least "
                         f"{MIN_SECRET_BYTES} bytes (e.g. python -c 'import secrets; "
                         f"print(secrets.token_hex(16))')")
    return secret


def job_secret() -> bytes:
    """The job's shared secret: ``$NEURAL_ARCH_SECRET`` if set, else the per-user cookie file."""
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return check_secret(from_env.encode(), SECRET_ENV)
    path = secret_file()
    try:
        cookie = _read_or_create_cookie(path)
    except OSError as e:
        raise AuthenticationError(f"cannot use secret file {path} ({e}); set {SECRET_ENV} to "
                                  "the same value on every rank instead") from None
    return check_secret(cookie, f"secret file {path}")


def _read_or_create_cookie(path: Path) -> bytes:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        _create_cookie_atomically(path)
    deadline = time.monotonic() + 5.0
    while True:
        _check_private(path)
        value = path.read_bytes().strip()
        if value:
            return value
        if time.monotonic() > deadline:  # an O_EXCL creator that died before writing
            raise AuthenticationError(f"secret file {path} is empty; delete it or set "
                                      f"{SECRET_ENV}")
        time.sleep(0.01)


def _create_cookie_atomically(path: Path) -> None:
    """Write a temporary file, then hard-link it into place: whoever links first wins, and
    nobody ever reads a half-written cookie."""
    cookie = secrets.token_hex(32).encode() + b"\n"
    tmp = path.with_name(f".secret.{os.getpid()}.{secrets.token_hex(4)}")
    _write_exclusive(tmp, cookie)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:  # no hard links here: plain O_EXCL; readers wait until the content lands
        try:
            _write_exclusive(path, cookie)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _write_exclusive(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_private(path: Path) -> None:
    info = path.stat()
    if info.st_mode & 0o077:
        raise AuthenticationError(
            f"secret file {path} has mode {stat.filemode(info.st_mode)} and can be read by other "
            f"users; run 'chmod 600 {path}' or set {SECRET_ENV}")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise AuthenticationError(f"secret file {path} belongs to uid {info.st_uid}, not to "
                                  f"uid {os.getuid()}; remove it or set {SECRET_ENV}")
