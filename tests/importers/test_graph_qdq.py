"""Whole models with fake quantization on their edges: ONNX Runtime's quantize_static (QDQ) and a
torch.ao QAT model exported by torch.onnx. The float graph equals ONNX Runtime on the model
without its fake quantization (a pair clipping at 0 a relu); `calibrate` takes each pair's grid
for its edge (read here from the file with onnx directly), snapped to a power of two."""

import math

import numpy as np
import pytest
from conftest import has

from qtool import api
from qtool.errors import QtoolError
from qtool.numerics.qparams import choose_qparams

pytestmark = pytest.mark.skipif(not (has("torch") and has("onnx") and has("onnxruntime")),
                                reason="needs torch, onnx and onnxruntime")
C, H, K, T = 10, 16, 5, 20


def _classifier():
    import torch

    class Net(torch.nn.Module):  # Linear -> ReLU -> 2-layer GRU -> Linear on the last step
        def __init__(self):
            super().__init__()
            self.fc, self.gru, self.head = torch.nn.Linear(C, H), torch.nn.GRU(H, H, 2, batch_first=True), \
                torch.nn.Linear(H, K)

        def forward(self, x):
            y, _ = self.gru(torch.relu(self.fc(x)))
            return self.head(y[:, -1])

    torch.manual_seed(0)
    return Net().eval()


def _export(m, path, x):
    import torch

    torch.onnx.export(m, (torch.from_numpy(x[:4]),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n", 1: "t"}}, dynamo=False, opset_version=17)


def _reader(batches):
    """ONNX Runtime's calibration reader over `batches` of the input x."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": b} for b in batches)

        def get_next(self):
            return next(self.it, None)

    return Reader()


@pytest.fixture(scope="module")
def ort_qdq(tmp_path_factory):
    """The classifier quantized by ONNX Runtime (QDQ, per-channel int8), calibration and test data."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    d = tmp_path_factory.mktemp("gqdq")
    rng = np.random.default_rng(0)
    calib, test = (rng.standard_normal((n, T, C)).astype(np.float32) for n in (64, 48))
    _export(_classifier(), d / "f.onnx", calib)

    batches = [calib[i:i + 16] for i in range(0, 64, 16)]
    quantize_static(str(d / "f.onnx"), str(d / "q.onnx"), _reader(batches), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    np.save(d / "calib.npy", calib)
    np.save(d / "test.npy", test)
    return d


def _pairs(path) -> dict:
    """Every QuantizeLinear on the data: its input value -> (scale, zero point, qmin, qmax), read with onnx."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node if n.op_type == "Constant"})
    out = {}
    for n in g.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in consts:
            zp = consts[n.input[2]]
            info = np.iinfo(zp.dtype)
            out[n.input[0]] = (float(consts[n.input[1]]), int(zp), info.min, info.max)
    return out


def _ort(path, x, optimize=True):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.log_severity_level = 4
    if not optimize:  # the float model the file stands for: its optimizer runs QDQ as integer kernels of its own
        o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _cos(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_ort_qdq_imports_whole_and_checks_against_the_model_without_fake_quant(ort_qdq):
    g = api.load_model(ort_qdq / "q.onnx")
    assert g.check_result["checked"] and g.check_result["max_abs_diff"] <= 1e-4
    assert g.check_result["fake_quant_pairs"] == len(_pairs(ort_qdq / "q.onnx"))
    # ONNX Runtime's quantizer removed the Relu into a pair whose grid starts at 0: a relu again
    assert "Relu" not in {n.source for n in g.nodes}
    relu = [n for n in g.nodes if n.op == "activation" and n.attrs["kind"] == "relu"]
    assert len(relu) == 1 and "QuantizeLinear" in relu[0].source
    # the float graph is the float model the file stands for (its weights the file's integers dequantized)
    x = np.load(ort_qdq / "test.npy")
    from qtool.layers import run

    assert _cos(run(g, x)[g.outputs[0]], _ort(ort_qdq / "f.onnx", x)) > 0.999


@pytest.mark.parametrize("snap", ["up", "nearest"])
def test_calibration_takes_each_pairs_grid(ort_qdq, snap):
    from qtool.calibration.from_file import _snap_one

    qg = api.calibrate(ort_qdq / "q.onnx", ort_qdq / "calib.npy", method="minmax", snap=snap)
    imported = qg.info["imported"]
    used = {r["edge"]: r for r in imported["rows"] if r["used"]}
    assert imported["kind"] == "ONNX QDQ" and len(used) >= 3
    pairs = _pairs(ort_qdq / "q.onnx").values()
    for edge, row in used.items():
        s, zp, qmin, qmax = next(p for p in pairs if f"scale {p[0]:.6g})" in row["source"])
        lo, hi = (qmin - zp) * s, (qmax - zp) * s
        want = choose_qparams(lo, hi, 8, False) if snap == "up" else _snap_one(lo, hi, 8, False, s, 8, "nearest")
        assert (int(qg.grids[edge].exp2_inv), qg.grids[edge].zp) == tuple(want), edge
        assert qg.info["edge_methods"][edge] == "the file's"
    # a pair rounding a MatMul's values before its bias is named, not used
    assert any("before its bias" in n for n in imported["notes"])


def test_power_of_two_scales_are_the_files_grids_exactly(ort_qdq, tmp_path):
    """Scales rewritten to powers of two: qtool's grid of every such edge is the file's own."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(ort_qdq / "q.onnx"))
    scales = {n.input[1] for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    for t in m.graph.initializer:
        if t.name in scales:
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array(np.exp2(np.round(np.log2(a))).astype(a.dtype), t.name))
    onnx.save(m, str(tmp_path / "p2.onnx"))
    pairs = _pairs(tmp_path / "p2.onnx")
    for snap in ("up", "nearest"):
        qg = api.calibrate(tmp_path / "p2.onnx", ort_qdq / "calib.npy", method="minmax", snap=snap)
        used = [r for r in qg.info["imported"]["rows"] if r["used"]]
        assert used
        for r in used:
            s, zp = next((s, zp) for s, zp, _, _ in pairs.values() if f"scale {s:.6g})" in r["source"])
            assert (int(qg.grids[r["edge"]].exp2_inv), qg.grids[r["edge"]].zp) == (-int(math.log2(s)), zp)
            assert r["moved_db"] == 0.0 and not r["clips"]


def test_integer_model_lands_near_onnx_runtimes_qdq_run(ort_qdq):
    """Near what the QDQ file computes (ONNX Runtime unoptimized: each pair rounds, the rest in float);
    its optimizer's own int8 kernels land further from it (cosine 0.996 with onnxruntime 1.32) and
    are not the file's meaning."""
    qg = api.calibrate(ort_qdq / "q.onnx", ort_qdq / "calib.npy", bits="w8a16")
    x = np.load(ort_qdq / "test.npy")
    y_int = api.simulate(qg, x, outputs=True).y_quant
    assert _cos(y_int, _ort(ort_qdq / "q.onnx", x, optimize=False)) > 0.999


def test_the_graph_file_keeps_the_grids(ort_qdq, tmp_path):
    g = api.load_model(ort_qdq / "q.onnx")
    api.save(g, tmp_path / "g.h5")
    again = api.load_model(tmp_path / "g.h5")
    assert again.ranges.edges == g.ranges.edges and again.ranges.notes == g.ranges.notes
    a = api.calibrate(g, ort_qdq / "calib.npy", method="minmax")
    b = api.calibrate(tmp_path / "g.h5", ort_qdq / "calib.npy", method="minmax")
    assert {e: (int(t.exp2_inv), t.zp) for e, t in a.grids.items()} == \
        {e: (int(t.exp2_inv), t.zp) for e, t in b.grids.items()}


def test_cli_says_which_grids_came_from_the_file(ort_qdq, tmp_path, cli):
    code, text, err = cli("calibrate", ort_qdq / "q.onnx", ort_qdq / "calib.npy", "-o", tmp_path / "q.h5",
                          "--method", "minmax")
    assert code == 0, err
    text = " ".join(text.split())
    assert "grids from the ONNX QDQ file (snap up" in text and "fake quantizer(s) on the data" in text


def test_torch_ao_qat_model_exported_to_onnx(tmp_path):
    """Eager torch.ao QAT around a float GRU, exported with torch.onnx: each FakeQuantize is a pair
    on its edge, each weight fake-quant folds into the weight qtool reads."""
    import torch
    import torch.ao.quantization as tq

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.fc, self.dq = tq.QuantStub(), torch.nn.Linear(C, H), tq.DeQuantStub()
            self.gru = torch.nn.GRU(H, H, batch_first=True)
            self.q2, self.head, self.dq2 = tq.QuantStub(), torch.nn.Linear(H, K), tq.DeQuantStub()

        def forward(self, x):
            y, _ = self.gru(self.dq(torch.relu(self.fc(self.q(x)))))
            return self.dq2(self.head(self.q2(y[:, -1])))

    torch.manual_seed(0)
    m = Net().train()
    act = tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                    dtype=torch.quint8)
    weight = tq.FakeQuantize.with_args(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                                       quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    m.qconfig, m.gru.qconfig = tq.QConfig(activation=act, weight=weight), None
    tq.prepare_qat(m, inplace=True)
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    rng = np.random.default_rng(1)
    calib = rng.standard_normal((48, T, C)).astype(np.float32)
    for k in range(6):
        loss = m(torch.from_numpy(calib[8 * k:8 * k + 8])).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval().apply(tq.disable_observer)
    _export(m, tmp_path / "qat.onnx", calib)
    g = api.load_model(tmp_path / "qat.onnx")
    assert g.check_result["checked"] and g.check_result["fake_quant_pairs"] >= 3
    with torch.no_grad():  # the weight qtool reads is the fake-quantized one
        want = m.fc.weight_fake_quant(m.fc.weight).numpy()
    fc = next(n for n in g.nodes if n.op == "dense" and n.params["W"].shape == (H, C))
    np.testing.assert_allclose(fc.params["W"], want, atol=1e-7)
    qg = api.calibrate(g, calib, method="minmax")
    x_scale = float(m.q.activation_post_process.scale)
    x_zp = int(m.q.activation_post_process.zero_point)
    assert (int(qg.grids["x"].exp2_inv), qg.grids["x"].zp) == choose_qparams(-x_zp * x_scale, (255 - x_zp) * x_scale,
                                                                            8, False)
    with torch.no_grad():
        y = m(torch.from_numpy(calib)).numpy()
    assert _cos(api.simulate(qg, calib, outputs=True).y_quant, y) > 0.99


def test_qoperator_files_and_mismatched_pairs_are_refused(ort_qdq, tmp_path):
    import onnx
    from onnxruntime.quantization import QuantFormat, quantize_static

    calib = np.load(ort_qdq / "calib.npy")
    quantize_static(str(ort_qdq / "f.onnx"), str(tmp_path / "qop.onnx"), _reader([calib[:16]]),
                    quant_format=QuantFormat.QOperator)
    with pytest.raises(QtoolError, match="QOperator|QLinear|not supported"):
        api.load_model(tmp_path / "qop.onnx")
    m = onnx.load(str(ort_qdq / "q.onnx"))
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    dq.input[1] = next(n.input[1] for n in m.graph.node if n.op_type == "QuantizeLinear" and n is not q
                       and n.input[1] != q.input[1])
    onnx.save(m, str(tmp_path / "bad.onnx"))
    with pytest.raises(QtoolError, match="another scale or zero point"):
        api.load_model(tmp_path / "bad.onnx")


def test_a_graph_file_with_ranges_that_are_no_grid_is_refused(ort_qdq, tmp_path):
    import json

    import h5py

    api.save(api.load_model(ort_qdq / "q.onnx"), tmp_path / "g.h5")
    for bad, says in ((lambda r: r["edges"]["x"].__setitem__(2, r["edges"]["x"][2] / 4), "not a grid's range"),
                      (lambda r: r["edges"].__setitem__("nosuch", r["edges"]["x"]), "no edge of the graph")):
        with h5py.File(tmp_path / "g.h5", "r") as f:
            desc = json.loads(f.attrs["graph"])
        bad(desc["ranges"])  # a step that would need 4 x 255 levels; an edge the graph does not have
        with h5py.File(tmp_path / "bad.h5", "w") as f:
            with h5py.File(tmp_path / "g.h5", "r") as src:
                for k, v in src.attrs.items():
                    f.attrs[k] = v
                src.copy("params", f)
            f.attrs["graph"] = json.dumps(desc)
        with pytest.raises(QtoolError, match=says):
            api.load_model(tmp_path / "bad.h5")


def test_unsigned_quantizers_are_named_so(ort_qdq, tmp_path):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    calib = np.load(ort_qdq / "calib.npy")
    quantize_static(str(ort_qdq / "f.onnx"), str(tmp_path / "u8.onnx"), _reader([calib[:16]]),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8)
    sources = [r.source for r in api.load_model(tmp_path / "u8.onnx").ranges.edges.values()]
    assert sources and all("(uint8, scale" in s for s in sources)
