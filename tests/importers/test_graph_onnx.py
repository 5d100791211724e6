"""Whole ONNX models as qtool graphs (qtool.importers.onnx.model_graph), for files as torch.onnx.export
writes them: the TorchScript exporter (dynamo=False, with and without dynamic axes) and the default one
(dynamo=True, with and without its optimizer). Each small PyTorch module is trained a few steps, exported
once, imported, checked against ONNX Runtime, and run by qtool.layers.run on held-out data of another
batch size and length, where it must equal the module's own output."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import qtool.layers as L  # noqa: E402
from qtool.errors import QtoolError  # noqa: E402
from qtool.importers.onnx.model_graph import check_onnx_graph, read_onnx_graph  # noqa: E402

F = torch.nn.functional
C, H, N, T = 3, 5, 2, 6  # export sizes
N2, T2 = 4, 9  # held-out sizes


class Classifier(torch.nn.Module):
    """The issue's model: Linear -> ReLU -> 2-layer GRU (batch_first) -> Linear on the last step."""

    def __init__(self):
        super().__init__()
        self.front, self.head = torch.nn.Linear(C, 8), torch.nn.Linear(H, 3)
        self.gru = torch.nn.GRU(8, H, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.head(self.gru(torch.relu(self.front(x)))[0][:, -1])


class Skip(torch.nn.Module):
    """Linear -> GRU -> Linear -> Sigmoid, added to the GRU's output."""

    def __init__(self):
        super().__init__()
        self.front, self.lin = torch.nn.Linear(C, 6), torch.nn.Linear(H, H)
        self.gru = torch.nn.GRU(6, H, batch_first=True)

    def forward(self, x):
        h = self.gru(self.front(x))[0]
        return h + torch.sigmoid(self.lin(h))


class ConvFront(torch.nn.Module):
    """[N, T, C] -> [N, C, T] -> Conv1d (padded) -> BatchNorm1d -> ReLU -> [N, T, C] -> GRU -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv1d(C, 8, 3, padding=1), torch.nn.BatchNorm1d(8)
        self.gru, self.head = torch.nn.GRU(8, H, batch_first=True), torch.nn.Linear(H, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x.transpose(1, 2)))).transpose(1, 2)
        return self.head(self.gru(y)[0])


class Zoo(torch.nn.Module):
    """The other ops: GELU, concat, relu6, a per-channel affine, a grouped strided Conv1d, pools (a padded
    average counting zeros, a padded max), a zero pad, leaky ReLU, hard sigmoid, a bidirectional GRU,
    softplus, a mean over time, softmax, and F.normalize of the last step: two outputs."""

    def __init__(self):
        super().__init__()
        self.front = torch.nn.Linear(C, 4)
        self.conv = torch.nn.Conv1d(8, 6, 3, stride=2, padding=2, groups=2)
        self.bn = torch.nn.BatchNorm1d(6)
        self.gru = torch.nn.GRU(6, H, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(2 * H, 3)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 2.0, 8))

    def forward(self, x):
        h = F.gelu(self.front(x))
        h = torch.cat([h, F.relu6(h)], -1) * self.scale + 1.0
        h = self.bn(self.conv(h.transpose(1, 2)))
        h = F.max_pool1d(F.avg_pool1d(h, 2, padding=1), 2, stride=1, padding=1).transpose(1, 2)
        h = F.hardsigmoid(F.leaky_relu(F.pad(h, (0, 0, 1, 2)), 0.1))
        y = F.softplus(self.gru(h)[0])
        return torch.softmax(self.head(y.mean(1)), -1), F.normalize(y[:, -1], dim=-1)


class TimeFirst(torch.nn.Module):
    """A time-first model: input [T, N, C], GRU (batch_first=False), the last step x[-1]."""

    def __init__(self):
        super().__init__()
        self.front, self.head = torch.nn.Linear(C, 6), torch.nn.Linear(H, 2)
        self.gru = torch.nn.GRU(6, H)

    def forward(self, x):
        return self.head(self.gru(torch.tanh(self.front(x)))[0][-1])


class FinalState(torch.nn.Module):
    """PyTorch's usual head on a GRU's final states: `cat(h_n[-2], h_n[-1])` of a 2-layer bidirectional GRU."""

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(C, H, num_layers=2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(2 * H, 2)

    def forward(self, x):
        h = self.gru(x)[1]
        return self.head(torch.cat([h[-2], h[-1]], 1))


MODELS = {"classifier": Classifier, "skip": Skip, "conv_front": ConvFront, "zoo": Zoo, "time_first": TimeFirst,
          "final_state": FinalState}
EXPORTERS = {
    "torchscript": dict(dynamo=False),  # with dynamic axes for batch and time
    "torchscript_fixed": dict(dynamo=False),
    "torchscript_opset17": dict(dynamo=False, opset_version=17),  # GELU as Div, Erf, Add, Mul, Mul
    "dynamo": dict(dynamo=True),  # weights in external data beside the model
    "dynamo_unoptimized": dict(dynamo=True, optimize=False),  # keeps BatchNormalization, weights as Concat(Slice)
}
CASES = [("classifier", e) for e in ("torchscript", "torchscript_fixed", "dynamo", "dynamo_unoptimized")] + [
    ("skip", "torchscript"), ("skip", "dynamo"),
    ("conv_front", "torchscript"), ("conv_front", "dynamo"), ("conv_front", "dynamo_unoptimized"),
    ("zoo", "torchscript"), ("zoo", "torchscript_opset17"), ("zoo", "dynamo"),
    ("time_first", "torchscript"), ("time_first", "dynamo"), ("final_state", "torchscript"), ("final_state", "dynamo")]


def _sample(n: int, t: int, seed: int) -> np.ndarray:
    """Batch-first data [N, T, C] (qtool's layout; a time-first module reads it transposed)."""
    return np.random.default_rng(seed).standard_normal((n, t, C)).astype(np.float32)


def _torch_in(model: str, x: np.ndarray):
    x = torch.from_numpy(x)
    return x.transpose(0, 1).contiguous() if model == "time_first" else x


def _train(module: torch.nn.Module, model: str) -> torch.nn.Module:
    """A few steps of Adam on random data, so that weights and BatchNorm statistics are not the initial ones."""
    opt = torch.optim.Adam(module.parameters(), lr=0.05)
    module.train()
    for step in range(4):
        out = module(_torch_in(model, _sample(8, T, 100 + step)))
        loss = sum((o ** 2).mean() for o in (out if isinstance(out, tuple) else (out,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(module, path) of a case, trained and exported once; each file in its own folder."""
    root, modules, files = tmp_path_factory.mktemp("graphs"), {}, {}

    def get(model: str, exporter: str):
        if model not in modules:
            torch.manual_seed(len(modules))
            modules[model] = _train(MODELS[model](), model)
        module = modules[model]
        if (model, exporter) not in files:
            path = root / f"{model}_{exporter}" / "model.onnx"
            path.parent.mkdir()
            outputs = ["probs", "unit"] if model == "zoo" else ["y"]
            kw = dict(EXPORTERS[exporter])
            if exporter in ("torchscript", "torchscript_opset17"):  # variable lengths and batch sizes
                axes = {1: "time", 0: "batch"} if model == "time_first" else {0: "batch", 1: "time"}
                kw["dynamic_axes"] = {"x": axes}
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                torch.onnx.export(module, (_torch_in(model, _sample(N, T, 0)),), str(path), input_names=["x"],
                                  output_names=outputs, verbose=False, **kw)
            files[model, exporter] = path
        return module, files[model, exporter]

    return get


def _close(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))


@pytest.mark.parametrize("model,exporter", CASES)
def test_whole_model_matches_torch_and_onnxruntime(exported, model, exporter):
    module, path = exported(model, exporter)
    graph = read_onnx_graph(path)
    check = check_onnx_graph(path, graph)
    assert check["checked"] and check["max_abs_diff"] <= 1e-4, check
    x = _sample(N2, T2, 7)  # held-out data of another batch size and length
    with torch.no_grad():
        want = module(_torch_in(model, x))
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    got = L.run(graph, x)
    assert list(got) == graph.outputs
    for g, w in zip(got.values(), want):
        assert _close(g, w) <= 1e-4


def test_what_the_graphs_hold(exported):
    """Layout-only ops leave no node; each compute op is one node, on channels-last edges."""
    ops = {}
    for model, exporter in (("classifier", "torchscript"), ("classifier", "dynamo"), ("conv_front", "torchscript"),
                            ("conv_front", "dynamo_unoptimized"), ("zoo", "torchscript_opset17"),
                            ("time_first", "dynamo")):
        graph = read_onnx_graph(exported(model, exporter)[1])
        ops[model, exporter] = [n.op for n in graph.nodes]
        assert graph.inputs == {"x": (None, C)}
    assert ops["classifier", "torchscript"] == ops["classifier", "dynamo"] == [
        "dense", "activation", "gru", "gru", "last_step", "dense"]
    assert ops["conv_front", "torchscript"] == ["conv1d", "activation", "gru", "dense"]  # BatchNorm folded by torch
    assert ops["conv_front", "dynamo_unoptimized"] == ["conv1d", "batchnorm", "activation", "gru", "dense"]
    zoo = read_onnx_graph(exported("zoo", "torchscript_opset17")[1])
    assert zoo.outputs == ["probs", "unit"] and zoo.shapes["probs"] == (3,) and zoo.shapes["unit"] == (2 * H,)
    kinds = [n.attrs.get("kind") for n in zoo.nodes if n.op == "activation"]
    assert kinds == ["gelu", "relu6", "leaky_relu", "hard_sigmoid", "softplus"]
    assert {"concat", "batchnorm", "conv1d", "zero_pad1d", "avg_pool1d", "max_pool1d", "global_avg_pool1d",
            "softmax", "l2_normalize", "last_step"} <= {n.op for n in zoo.nodes}
    gru = next(n for n in zoo.nodes if n.op == "gru")
    assert gru.attrs["bidirectional"] and gru.params["l0.bwd.R"].shape == (3 * H, H)
    assert read_onnx_graph(exported("time_first", "dynamo")[1]).source.endswith("input read as [T, N, C]")
    final = read_onnx_graph(exported("final_state", "torchscript")[1])  # layer 1's final states, both directions
    assert [(n.op, n.attrs.get("return_sequences")) for n in final.nodes] == [
        ("gru", True), ("gru", False), ("dense", None)]


def _refused(path) -> str:
    with pytest.raises(QtoolError) as e:
        read_onnx_graph(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def _export(module, path, **kw):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(N, T, C),), str(path), input_names=["x"], output_names=["y"],
                          dynamo=False, dynamic_axes={"x": {0: "batch", 1: "time"}}, **kw)


class Lstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(C, H, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def test_refusals(tmp_path, exported):
    class Gate(torch.nn.Module):  # x times its own mean over time: a vector broadcast over the steps
        def forward(self, x):
            return x * x.mean(1, keepdim=True)

    _export(Lstm(), tmp_path / "lstm.onnx")
    msg = _refused(tmp_path / "lstm.onnx")
    assert "node '/lstm/LSTM' (LSTM) is an LSTM, which qtool does not compute (it quantizes GRUs)" in msg
    _export(Gate(), tmp_path / "gate.onnx")
    msg = _refused(tmp_path / "gate.onnx")
    assert "(Mul)" in msg and "[N, T, C0] and [N, 1, C0]" in msg

    model = onnx.load(str(exported("classifier", "torchscript")[1]))  # self-contained: no external data
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.input[0] = "nowhere"
    onnx.save(model, str(tmp_path / "dangling.onnx"))
    assert "reads 'nowhere', which nothing before it computes" in _refused(tmp_path / "dangling.onnx")

    from onnx import TensorProto, helper

    def tiny(name, nodes, channels=C):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", channels])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        onnx.save(helper.make_model(helper.make_graph(nodes, name, [x], [y])), str(tmp_path / f"{name}.onnx"))
        return tmp_path / f"{name}.onnx"

    cycle = tiny("cycle", [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                           helper.make_node("Identity", ["b"], ["y"])])
    assert "reads 'b', which nothing before it computes (a dangling input or a cycle)" in _refused(cycle)
    assert "2,097,152 channels" in _refused(tiny("huge", [helper.make_node("Relu", ["x"], ["y"])], 1 << 21))
    # [N, C, T] with too many channels: the width is the problem, not a layout
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1 << 30, "t"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "w", [x], [y])),
              str(tmp_path / "wide_nct.onnx"))
    assert "declares 1,073,741,824 channels" in _refused(tmp_path / "wide_nct.onnx")
    other = tiny("domain", [helper.make_node("Relu", ["x"], ["y"], domain="com.microsoft")])
    assert "is an op of domain 'com.microsoft'" in _refused(other)
    # a fixed batch too large to check: one line before anything is allocated; unchecked it imports
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 30, 8, C])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "big", [x], [y])),
              str(tmp_path / "big.onnx"))
    from qtool.importers import import_graph

    with pytest.raises(QtoolError, match="too large to check"):
        import_graph(tmp_path / "big.onnx")
    assert [n.op for n in import_graph(tmp_path / "big.onnx", check=False).nodes] == ["activation"]


def test_without_onnxruntime(exported, monkeypatch):
    import sys

    path = exported("skip", "torchscript")[1]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    check = check_onnx_graph(path)
    assert not check["checked"] and "ONNX Runtime cannot be imported" in check["reason"]


def test_a_pytorch_module_with_an_example_input():
    """qtool.load_model(module, example=x): exported, read and checked against the module itself."""
    import qtool
    from qtool.layers import run

    torch.manual_seed(4)

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.front = torch.nn.Linear(6, 8)
            self.gru = torch.nn.GRU(8, 10, num_layers=2, batch_first=True)
            self.head = torch.nn.Linear(10, 3)

        def forward(self, x):
            y, _ = self.gru(torch.relu(self.front(x)))
            return self.head(y[:, -1])

    module = Classifier().eval()
    graph = qtool.load_model(module, example=np.random.default_rng(0).standard_normal((2, 5, 6)))
    assert graph.check_result["checked"] and "Classifier" in graph.source
    x = np.random.default_rng(1).standard_normal((4, 9, 6)).astype(np.float32)  # another batch and length
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert np.abs(run(graph, x)[graph.outputs[0]] - want).max() < 1e-4
    with pytest.raises(QtoolError, match="needs `example`"):
        qtool.load_model(module)

    class ConvFirst(torch.nn.Module):  # takes [N, C, T], as PyTorch's Conv1d does
        def __init__(self):
            super().__init__()
            self.conv, self.gru = torch.nn.Conv1d(4, 6, 3, padding=1), torch.nn.GRU(6, 5, batch_first=True)

        def forward(self, x):
            return self.gru(self.conv(x).transpose(1, 2))[0]

    conv_first = ConvFirst().train()
    graph = qtool.load_model(conv_first, example=np.zeros((2, 4, 7), np.float32))
    assert conv_first.training and "input read as [N, C, T]" in graph.source  # training mode left as it was
    x = np.random.default_rng(2).standard_normal((3, 4, 11)).astype(np.float32)
    with torch.no_grad():
        want = conv_first.eval()(torch.from_numpy(x)).numpy()
    assert np.abs(run(graph, x.transpose(0, 2, 1))[graph.outputs[0]] - want).max() < 1e-4
    with pytest.raises(QtoolError, match=r"module Lstm: node .*LSTM") as e:
        qtool.load_model(Lstm(), example=np.zeros((2, 5, C), np.float32))
    assert "/tmp/" not in str(e.value)  # no temporary file named
