"""``save`` / ``load`` of bfloat16 tensors and arrays: bit-exact round trips beside float16 and
integer tensors, safetensors' own ``BF16`` entries (so torch's safetensors reads them as
torch.bfloat16), the file's checks on them, and without ``ml_dtypes`` an error naming the
extra."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.timeout(60)

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(11)
VALUES = RNG.standard_normal((3, 5)).astype(np.float32) * 100


def _bits(array):
    return np.asarray(array).view(np.uint16) if np.asarray(array).dtype == BF16 else array


def _state_dict():
    return OrderedDict([
        ("weight", nn.Parameter(na.tensor(VALUES, dtype=na.bfloat16))),
        ("half", na.tensor(VALUES, dtype=na.float16)),
        ("steps", na.tensor(np.array(7, dtype=np.int64))),
        ("ids", na.tensor(np.arange(6, dtype=np.int32).reshape(2, 3))),
        ("mask", na.tensor(VALUES > 0)),
        ("bias", na.tensor(np.array([np.inf, -np.inf, np.nan, -0.0, 1e-40]),
                           dtype=na.bfloat16)),  # the special values and a subnormal
        ("empty", na.zeros((0, 4), dtype=na.bfloat16)),
        ("raw", VALUES[0].astype(BF16)),
        ("scalar", ml_dtypes.bfloat16(1.5)),
    ])


def _assert_round_trip(saved, loaded):
    assert list(loaded) == list(saved)
    for key, value in saved.items():
        got = loaded[key]
        assert type(got) is type(value), key
        want_array = getattr(value, "array", np.asarray(value))
        got_array = getattr(got, "array", np.asarray(got))
        assert got_array.dtype == want_array.dtype and got_array.shape == want_array.shape, key
        np.testing.assert_array_equal(_bits(got_array), _bits(want_array), err_msg=key)
    assert loaded["weight"].requires_grad


def test_a_state_dict_of_bfloat16_float16_and_int_tensors_round_trips_bit_exactly(tmp_path):
    saved = _state_dict()
    na.save(saved, tmp_path / "sd.pt")
    _assert_round_trip(saved, na.load(tmp_path / "sd.pt"))
    stream = io.BytesIO()
    na.save(saved, stream)
    stream.seek(0)
    _assert_round_trip(saved, na.load(stream))


def test_a_bfloat16_model_loads_into_another(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).bfloat16()
    na.save(model.state_dict(), tmp_path / "model.pt")
    other = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).bfloat16()
    other.load_state_dict(na.load(tmp_path / "model.pt"))
    for (name, want), (_, got) in zip(model.state_dict().items(), other.state_dict().items()):
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(_bits(got.array), _bits(want.array), err_msg=name)
    assert other[1].num_batches_tracked.dtype == np.int64


def _header_length(content: bytes) -> int:
    return int.from_bytes(content[:8], "little")


def _header(content: bytes) -> dict:
    return json.loads(content[8:8 + _header_length(content)])


def _with_header(content: bytes, header: dict) -> bytes:
    """``content`` (a safetensors file) with its header replaced by ``header``."""
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + content[8 + _header_length(content):]


def test_the_file_holds_safetensors_bf16_entries_that_torch_reads(tmp_path):
    path = tmp_path / "w.pt"
    na.save({"w": na.tensor(VALUES, dtype=na.bfloat16)}, path)
    entry = _header(path.read_bytes())["0"]
    assert entry["dtype"] == "BF16" and entry["data_offsets"] == [0, VALUES.size * 2]
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    theirs = safetensors_torch.load_file(str(path))["0"]
    assert theirs.dtype == torch.bfloat16
    assert torch.equal(theirs, torch.tensor(VALUES).bfloat16())  # both round to nearest even


def test_damaged_bfloat16_entries_are_refused(tmp_path):
    path = tmp_path / "w.pt"
    na.save({"w": na.tensor(VALUES, dtype=na.bfloat16)}, path)
    content = path.read_bytes()
    changed = bytearray(content)
    changed[-1] ^= 1  # a bit of the last bfloat16
    path.write_bytes(bytes(changed))
    with pytest.raises(ValueError, match="damaged: its contents do not match the digest"):
        na.load(path)
    from safetensors.numpy import save as safetensors_bytes
    crafted = safetensors_bytes({"0": np.zeros(3, np.uint16)}, metadata={
        "neural_arch.format": "1",
        "neural_arch.structure": '{"tensor": "0", "device": "cpu", "requires_grad": true, '
                                 '"parameter": true}'})
    header = _header(crafted)
    header["0"]["dtype"] = "BF16"
    header["0"]["shape"] = [4]  # 8 bytes declared, 6 held
    path.write_bytes(_with_header(crafted, header))
    with pytest.raises(ValueError, match="damaged: its array '0' of dtype BF16 and shape "
                                         r"\[4\] needs 8 bytes"):
        na.load(path)
    header["0"]["shape"] = [3]  # as declared: a bfloat16 parameter that requires grad loads
    path.write_bytes(_with_header(crafted, header))
    loaded = na.load(path)
    assert isinstance(loaded, nn.Parameter) and loaded.dtype == BF16 and loaded.requires_grad


def test_without_ml_dtypes_a_bfloat16_file_names_the_extra(tmp_path):
    with_bfloat16, without = tmp_path / "bf16.pt", tmp_path / "f32.pt"
    na.save({"w": na.tensor(VALUES, dtype=na.bfloat16)}, with_bfloat16)
    na.save({"w": na.tensor(VALUES)}, without)
    script = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import neural_arch as na\n"
        f"print(na.load({str(without)!r})['w'].dtype)\n"
        "try:\n"
        f"    na.load({str(with_bfloat16)!r})\n"
        "except RuntimeError as exc:\n"
        "    print('raised:', exc)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=50)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "float32", lines
    assert "raised:" in lines[1] and "bf16.pt" in lines[1] and "bfloat16" in lines[1]
    assert "neural-arch[bfloat16]" in lines[1], lines


def test_module_save_and_load_keep_bfloat16(tmp_path):
    model = nn.Linear(3, 2).bfloat16()
    model.save(str(tmp_path / "linear.safetensors"))
    other = nn.Linear(3, 2).bfloat16()
    other.load(str(tmp_path / "linear.safetensors"))
    for name in ("weight", "bias"):
        got, want = getattr(other, name).array, getattr(model, name).array
        assert got.dtype == BF16, name
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)
