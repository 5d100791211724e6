"""A quantized whole-model file that is not what qtool wrote is refused in one line, whatever
part of it is wrong; one qtool wrote loads to the very same integers."""

import json
import shutil

import h5py
import numpy as np
import pytest
from conftest import SAMPLES

from qtool import api
from qtool.errors import QtoolError


@pytest.fixture(scope="module")
def qfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("qg") / "q.h5"
    qg = api.calibrate_graph(api.load_graph(SAMPLES / "digits.onnx", check=False),
                             np.load(SAMPLES / "calib.npy")[:64], method="minmax")
    api.save_graph(qg, path)
    return path


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
}


@pytest.mark.parametrize("what", sorted(CORRUPTIONS))
def test_a_damaged_file_is_one_line(qfile, tmp_path, what):
    change, says = CORRUPTIONS[what]
    path = tmp_path / "bad.h5"
    shutil.copy(qfile, path)
    with h5py.File(path, "r+") as f:
        change(f)
    with pytest.raises(QtoolError) as e:
        api.load_qgraph(path)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_file_qtool_wrote_loads_to_the_same_integers(qfile):
    from qtool.graph.simulate import run_int

    qg = api.load_qgraph(qfile)
    again = api.calibrate_graph(api.load_graph(SAMPLES / "digits.onnx", check=False),
                                np.load(SAMPLES / "calib.npy")[:64], method="minmax")
    x = np.load(SAMPLES / "test.npy")[:50]
    a, b = run_int(qg, x), run_int(again, x)
    assert all(np.array_equal(a[e], b[e]) for e in b)
