"""``neural_arch.save`` / ``load``: torch.save's containers round-trip, nothing is unpickled."""
from __future__ import annotations

import io
import math
import os
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn, optim
from neural_arch.backends import get_backend

pytestmark = pytest.mark.timeout(60)

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
          np.uint16, np.uint32, np.uint64, np.bool_]


def _cuda_available() -> bool:
    return get_backend("cupy").is_available()


def roundtrip(obj, tmp_path, **load_kwargs):
    path = tmp_path / "obj.nf"
    na.save(obj, path)
    return na.load(path, **load_kwargs)


def test_scalars_and_containers_keep_their_types(tmp_path):
    obj = {"int": 3, "big": 2 ** 70, "float": 3.0, "tiny": 1e-310, "true": True, "none": None,
           "str": "é ü", "nan": math.nan, "inf": -math.inf, "tuple": (1, (2.5, "x"), []),
           "list": [1, [2, {"k": 0}]], 7: "int key", False: "bool key", "empty": {},
           "ordered": OrderedDict([("b", 1), ("a", 2)])}
    out = roundtrip(obj, tmp_path)
    assert list(out) == list(obj)
    for key in ("int", "big", "float", "tiny", "true", "none", "str", "tuple", "list", "empty"):
        assert out[key] == obj[key] and type(out[key]) is type(obj[key]), key
    assert type(out["int"]) is int and type(out["float"]) is float
    assert type(out["tuple"][1]) is tuple and type(out["list"][1][1]) is dict
    assert math.isnan(out["nan"]) and out["inf"] == -math.inf
    assert out[7] == "int key" and out[False] == "bool key"
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["b", "a"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_arrays_keep_dtype_shape_and_values(tmp_path, dtype):
    rng = np.random.default_rng(0)
    arrays = {"matrix": (rng.random((3, 4)) * 100).astype(dtype),
              "zero_d": np.asarray(7, dtype=dtype), "empty": np.zeros((0, 5), dtype=dtype),
              "transposed": (rng.random((4, 3)) * 100).astype(dtype).T,
              "scalar": np.dtype(dtype).type(1)}
    out = roundtrip(arrays, tmp_path)
    for key, array in arrays.items():
        assert type(out[key]) is type(array), key
        assert out[key].dtype == array.dtype and out[key].shape == array.shape, key
        np.testing.assert_array_equal(out[key], array)
    out["matrix"][0, 0] = 1  # writable, as an array from torch.load


def test_big_endian_arrays_come_back_native(tmp_path):
    out = roundtrip({"a": np.arange(3, dtype=">i4")}, tmp_path)
    assert out["a"].dtype == np.int32 and out["a"].tolist() == [0, 1, 2]


def test_tensors_and_parameters_keep_class_dtype_and_requires_grad(tmp_path):
    layer = nn.Linear(3, 2)
    obj = {"param": layer.weight, "frozen": nn.Parameter(np.ones(2), requires_grad=False),
           "tensor": na.tensor([1.0, 2.0], requires_grad=True), "ints": na.tensor([1, 2]),
           "half": na.Tensor(np.ones(2, np.float16)), "nonleaf": layer.weight * 2}
    out = roundtrip(obj, tmp_path)
    assert type(out["param"]) is nn.Parameter and out["param"].requires_grad
    assert type(out["frozen"]) is nn.Parameter and not out["frozen"].requires_grad
    assert type(out["tensor"]) is na.Tensor and out["tensor"].requires_grad
    assert out["nonleaf"].requires_grad and out["nonleaf"].is_leaf
    assert out["ints"].dtype == np.int64 and not out["ints"].requires_grad
    assert out["half"].dtype == np.float16
    for key in obj:
        np.testing.assert_array_equal(out[key].numpy(), obj[key].numpy())


def test_the_tutorial_snapshot_restores_a_model(tmp_path):
    source, target = nn.Linear(20, 1), nn.Linear(20, 1)
    snapshot = roundtrip({"MODEL_STATE": source.state_dict(), "EPOCHS_RUN": 3}, tmp_path,
                         map_location="cpu")
    assert snapshot["EPOCHS_RUN"] == 3 and type(snapshot["EPOCHS_RUN"]) is int
    target.load_state_dict(snapshot["MODEL_STATE"])
    np.testing.assert_array_equal(target.weight.numpy(), source.weight.numpy())
    np.testing.assert_array_equal(target.bias.numpy(), source.bias.numpy())


def _train(model, optimizer, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = na.Tensor(rng.random((8, 4)).astype(np.float32))
        loss = (model(x) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("make", [
    lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
    lambda p: optim.Adam(p, lr=0.01, betas=(0.8, 0.9), amsgrad=True),
    lambda p: optim.AdamW([{"params": p[:1], "lr": 0.02}, {"params": p[1:]}], lr=0.01),
], ids=["sgd", "adam", "adamw-groups"])
def test_optimizer_state_round_trips_and_resumes_identically(tmp_path, make):
    na.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    optimizer = make(list(model.parameters()))
    _train(model, optimizer, 3, seed=1)
    saved = roundtrip({"model": model.state_dict(), "opt": optimizer.state_dict()}, tmp_path)
    assert saved["opt"]["param_groups"] == optimizer.state_dict()["param_groups"]
    assert set(saved["opt"]["state"]) == set(optimizer.state_dict()["state"])

    resumed = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    resumed.load_state_dict(saved["model"])
    resumed_optimizer = make(list(resumed.parameters()))
    resumed_optimizer.load_state_dict(saved["opt"])
    _train(model, optimizer, 2, seed=2)
    _train(resumed, resumed_optimizer, 2, seed=2)
    for a, b in zip(model.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_file_objects_work_like_paths():
    buffer = io.BytesIO()
    na.save({"w": np.arange(4.0), "n": 1}, buffer)
    buffer.seek(0)
    out = na.load(buffer)
    assert out["n"] == 1 and out["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("value, path, kind", [
    ({"opt": {"state": {3: {1, 2}}}}, r"obj\['opt'\]\['state'\]\[3\]", "builtins.set"),
    ([1, (2, object())], r"obj\[1\]\[1\]", "builtins.object"),
    ({"lr": lambda epoch: 1.0}, r"obj\['lr'\]", "builtins.function"),
    ({"x": np.array(["a"])}, r"obj\['x'\]", "dtype <U1"),
    ({"z": np.zeros(2, np.complex64)}, r"obj\['z'\]", "dtype complex64"),
])
def test_anything_else_is_a_type_error_naming_where_it_is(tmp_path, value, path, kind):
    with pytest.raises(TypeError, match=rf"save: {path} is a.*{kind}"):
        na.save(value, tmp_path / "bad.nf")
    assert not os.listdir(tmp_path)  # nothing written, not even a temporary file


def test_bad_keys_and_cycles_are_refused(tmp_path):
    with pytest.raises(TypeError, match=r"obj\['a'\] has a key \(1, 2\) of type tuple"):
        na.save({"a": {(1, 2): 0}}, tmp_path / "x")
    cycle = [1]
    cycle.append(cycle)
    with pytest.raises(ValueError, match=r"obj\[1\] contains itself"):
        na.save(cycle, tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        na.save(1, tmp_path / "no" / "such" / "dir.nf")


def test_a_failed_save_keeps_the_previous_file(tmp_path):
    path = tmp_path / "snapshot.nf"
    na.save({"EPOCHS_RUN": 1}, path)
    with pytest.raises(TypeError):
        na.save({"EPOCHS_RUN": 2, "bad": {1}}, path)
    assert na.load(path) == {"EPOCHS_RUN": 1} and os.listdir(tmp_path) == ["snapshot.nf"]


def test_a_saved_file_gets_the_mode_a_plain_open_gives(tmp_path):
    na.save({"a": 1}, tmp_path / "saved.nf")
    (tmp_path / "plain").write_bytes(b"")
    assert (tmp_path / "saved.nf").stat().st_mode == (tmp_path / "plain").stat().st_mode


class _Exploit:
    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("content, reason", [
    (b"", "fewer than a safetensors header needs"),
    (b"PK\x03\x04" + bytes(60), "zip archive"),
    (b"\xff" * 64, "announce a"),
    (b"\x08\x00\x00\x00\x00\x00\x00\x00not json", "not safetensors JSON"),
])
def test_foreign_or_corrupt_files_are_refused(tmp_path, content, reason):
    path = tmp_path / "foreign"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"not a file written by neural_arch.save.*{reason}"):
        na.load(path)


def test_a_pickle_is_never_unpickled(tmp_path):
    exploit = _Exploit()
    exploit.marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(exploit))
    with pytest.raises(ValueError, match="starts like a pickle.*never unpickles"):
        na.load(path)
    assert not (tmp_path / "pwned").exists()


def test_other_safetensors_files_and_damage_are_named(tmp_path):
    plain = tmp_path / "weights.safetensors"
    nn.save_state_dict({"w": np.zeros(2, np.float32)}, plain)
    with pytest.raises(ValueError, match="neural_arch.format=None.*load_state_dict_file"):
        na.load(plain)
    path = tmp_path / "cut.nf"
    na.save({"w": np.arange(100.0)}, path)
    path.write_bytes(path.read_bytes()[:-16])
    with pytest.raises(ValueError, match="cut.nf' is damaged"):
        na.load(path)
    with pytest.raises(FileNotFoundError, match="no file at"):
        na.load(tmp_path / "missing.nf")


def _nested(depth: int):
    obj = 1
    for level in range(depth):
        obj = [obj] if level % 3 == 0 else ((obj,) if level % 3 == 1 else {"k": obj})
    return obj


def test_nesting_up_to_the_limit_round_trips_and_deeper_is_refused_naming_where(tmp_path):
    assert roundtrip(_nested(100), tmp_path) == _nested(100)
    for depth in (101, 5000):
        with pytest.raises(ValueError, match=r"save: obj(\[0\]|\['k'\]){100} is nested deeper "
                                             r"than 100 containers"):
            na.save(_nested(depth), tmp_path / "deep.nf")
    assert os.listdir(tmp_path) == ["obj.nf"]


def test_a_changed_byte_anywhere_is_refused_by_the_digest(tmp_path):
    path = tmp_path / "w.nf"
    na.save({"w": np.arange(100.0), "lr": 0.5}, path)
    content = path.read_bytes()
    for index in (len(content) - 3, content.index(b"0.5") + 2):  # array data, a structure digit
        changed = bytearray(content)
        changed[index] ^= 1
        path.write_bytes(bytes(changed))
        with pytest.raises(ValueError, match="w.nf' is damaged: its contents do not match the "
                                             "digest"):
            na.load(path)


def test_files_written_without_a_digest_still_load(tmp_path):
    from safetensors.numpy import save_file
    path = tmp_path / "older.nf"
    save_file({"0": np.arange(3.0)}, path, metadata={
        "neural_arch.format": "1",
        "neural_arch.structure": '{"dict": [["w", {"array": "0", "device": "cpu"}]], '
                                 '"ordered": false}'})
    assert na.load(path)["w"].tolist() == [0.0, 1.0, 2.0]


def test_map_location(tmp_path):
    path = tmp_path / "t.nf"
    na.save({"t": na.tensor([1.0, 2.0]), "a": np.ones(2)}, path)
    for location in (None, "cpu", {"cuda:0": "cpu"}):
        out = na.load(path, map_location=location)
        assert out["t"].device == "cpu" and isinstance(out["a"], np.ndarray)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        na.load(path, map_location="tpu")
    with pytest.raises(TypeError, match="map_location must be None, a device"):
        na.load(path, map_location=lambda storage, loc: storage)
    for location in ("cuda", "cuda:0", 0):
        if _cuda_available():
            out = na.load(path, map_location=location)
            assert out["t"].device == "cuda" and not isinstance(out["a"], np.ndarray)
        else:
            with pytest.raises(RuntimeError, match=rf"map_location={location!r}.*'cuda' is not "
                                                   rf"available.*map_location='cpu'"):
                na.load(path, map_location=location)


def test_save_and_load_are_torch_style_top_level_names():
    assert "save" in na.__all__ and "load" in na.__all__
    assert na.save.__module__ == "neural_arch.serialization"
