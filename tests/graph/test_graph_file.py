"""A quantized whole-model file that is not what qtool wrote is refused in one line, whatever
part of it is wrong (malformed, or what it holds twice disagreeing); one qtool wrote loads to the
very same integers, and its simulation results say what they hold."""

import json
import shutil

import h5py
import numpy as np
import pytest
from conftest import SAMPLES, calibrated, random_model

from qtool import api
from qtool.errors import QtoolError


@pytest.fixture(scope="module")
def qfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("qg") / "q.h5"
    qg = api.calibrate(api.load_model(SAMPLES / "digits.onnx", check=False),
                             np.load(SAMPLES / "calib.npy")[:64], method="minmax")
    api.save(qg, path)
    return path


def flip_low_bytes(ds, count=200):
    """Flip the lowest byte of `count` floats: the values change a little, none becomes NaN."""
    a = ds[()]
    raw = a.view(np.uint8).reshape(-1)
    raw[0:4 * count:4] ^= 0xFF
    ds[...] = a


def scale(ds, by):
    ds[...] = ds[()] * by


def edit_quant(f, change):
    quant = json.loads(f.attrs["quant"])
    change(quant)
    f.attrs["quant"] = json.dumps(quant)


CORRUPTIONS = {
    "graph JSON cut": (lambda f: f.attrs.__setitem__("graph", f.attrs["graph"][:50]), "is not valid JSON"),
    "no quant": (lambda f: f.attrs.__delitem__("quant"), "attribute 'quant' is missing"),
    "grid bits 40": (lambda f: edit_quant(f, lambda q: q["grids"].__setitem__("rows", [40, 7, 0, 0, 1])),
                     "the grid of edge 'rows' is not"),
    "grid missing": (lambda f: edit_quant(f, lambda q: q["grids"].pop("logits")), "has no grid"),
    "node in neither": (lambda f: edit_quant(f, lambda q: q["core"].pop()), "core and tail do not list"),
    "layer bits": (lambda f: edit_quant(f, lambda q: q["info"]["layer_bits"].__setitem__("/head/Gemm", [99, 32, 8])),
                   "the bits of node '/head/Gemm'"),
    "GRU group gone": (lambda f: f.__delitem__("gru"), "the quantized GRU of node"),
    "GRU grid moved": (lambda f: edit_quant(f, lambda q: q["grids"]["rows"].__setitem__(1, 3)),
                       "does not read and write its edges' grids"),
    "param not float": (lambda f: (f.__delitem__("params/2/W"), f.create_dataset("params/2/W", data=np.zeros((10, 64),
                                                                                                          int))),
                        "must be float"),
    # the digits model: node 0 is the GRU, node 2 the dense head
    "GRU float weights flipped": (lambda f: flip_low_bytes(f["gru/0/layer0/fwd/W"]),
                                  "params/0/l0.fwd.W and gru/0/layer0/fwd/W (the float and the quantized GRU"),
    "graph's GRU params scaled": (lambda f: scale(f["params/0/l0.fwd.W"], 3), "params/0/l0.fwd.W and gru/0/layer0"),
    "GRU fingerprint": (lambda f: f["gru/0/quant"].attrs.__setitem__("fingerprint", "0" * 16),
                        "gru/0/quant: the integers' fingerprint is"),
    "dense weights scaled": (lambda f: scale(f["params/2/W"], 3), "the contents' fingerprint is"),
    "fingerprint": (lambda f: f.attrs.__setitem__("fingerprint", "0" * 16), "the file says 0000000000000000"),
}


@pytest.mark.parametrize("what", sorted(CORRUPTIONS))
def test_a_damaged_file_is_one_line(qfile, tmp_path, what):
    change, says = CORRUPTIONS[what]
    path = tmp_path / "bad.h5"
    shutil.copy(qfile, path)
    with h5py.File(path, "r+") as f:
        change(f)
    with pytest.raises(QtoolError) as e:
        api.load(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_file_without_a_fingerprint_loads(qfile, tmp_path):
    """Files written before the root fingerprint lack it; every other check still holds."""
    path = tmp_path / "old.h5"
    shutil.copy(qfile, path)
    with h5py.File(path, "r+") as f:
        stored = f.attrs.pop("fingerprint")
    assert api.load(path).fingerprint() == stored


def test_a_file_qtool_wrote_loads_to_the_same_integers(qfile):
    from qtool.graph.simulate import run_int

    qg = api.load(qfile)
    again = api.calibrate(api.load_model(SAMPLES / "digits.onnx", check=False),
                                np.load(SAMPLES / "calib.npy")[:64], method="minmax")
    x = np.load(SAMPLES / "test.npy")[:50]
    a, b = run_int(qg, x), run_int(again, x)
    assert all(np.array_equal(a[e], b[e]) for e in b)


RESULTS_ATTRS = {"format", "version", "qtool_version", "qmodel_fingerprint", "model", "data_file", "data_sha256",
                 "samples", "mode", "created"}


def test_a_gru_alones_results_file_has_the_attributes_a_whole_models_has(tmp_path):
    qm = calibrated(random_model(), np.random.default_rng(0).normal(size=(8, 5, 5)).astype(np.float32))
    api.simulate(qm, np.zeros((2, 3, 5), np.float32), save=tmp_path / "r.h5")
    with h5py.File(tmp_path / "r.h5") as f:
        assert set(f.attrs) == RESULTS_ATTRS


@pytest.mark.parametrize("mode", ["integer", "fakequant", "both"])
def test_a_whole_models_results_file_says_what_it_holds(qfile, tmp_path, mode):
    out = tmp_path / "r.h5"
    api.simulate(qfile, SAMPLES / "test.npy", limit=20, save=out, mode=mode)
    with h5py.File(qfile) as q, h5py.File(out) as f:
        assert set(f.attrs) == RESULTS_ATTRS
        assert f.attrs["mode"] == mode and f.attrs["model"] == str(qfile) and f.attrs["samples"] == 20
        assert f.attrs["qmodel_fingerprint"] == q.attrs["fingerprint"]


def test_the_results_file_names_an_npz_data_file_and_its_digest(qfile, tmp_path):
    """Data from a .npz: the file's name and digest, not the array's name."""
    from qtool.io.files import sha256_file

    np.savez(tmp_path / "test.npz", x=np.load(SAMPLES / "test.npy")[:20])
    api.simulate(qfile, tmp_path / "test.npz", save=tmp_path / "r.h5")
    with h5py.File(tmp_path / "r.h5") as f:
        assert f.attrs["data_file"] == "test.npz" and f.attrs["data_sha256"] == sha256_file(tmp_path / "test.npz")


def test_the_cli_results_file_names_the_quantized_file(cli, qfile, tmp_path):
    out = tmp_path / "r.h5"
    code, _, err = cli("simulate", qfile, SAMPLES / "test.npy", "--limit", "20", "--save", out, "--mode", "fakequant")
    assert code == 0, err
    with h5py.File(out) as f:
        assert (f.attrs["model"], f.attrs["mode"]) == (str(qfile), "fakequant")


def test_a_calibrated_model_and_its_file_have_one_fingerprint(qfile):
    """The results of a QGraph in memory and of its file carry the same qmodel_fingerprint."""
    qg = api.calibrate(api.load_model(SAMPLES / "digits.onnx", check=False),
                             np.load(SAMPLES / "calib.npy")[:64], method="minmax")
    with h5py.File(qfile) as f:
        assert qg.fingerprint() == f.attrs["fingerprint"] == api.load(qfile).fingerprint()
