"""ONNX files made the way users make them: `torch.onnx.export` with the TorchScript exporter
(dynamo=False, dynamic axes: each layer's state is Slice(ConstantOfShape(Shape(x)))) and with the
default one (dynamo=True: weights in external data beside the model, or computed by Concat/Slice of
the PyTorch tensors when its optimizer is off). Each imports with the ONNX Runtime check on and equals
the PyTorch module's own GRU on held-out data; each Stack says what it took and what it left out."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from qtool.errors import QtoolError  # noqa: E402
from qtool.importers import import_model, read_stacks  # noqa: E402
from qtool.numerics.float_gru import run_float  # noqa: E402

C, H, T, N = 3, 4, 5, 2
EXTERNAL = 1  # TensorProto.EXTERNAL


class Gru(torch.nn.Module):
    def __init__(self, h0=False, **kw):
        super().__init__()
        self.gru, self.h0 = torch.nn.GRU(C, H, **kw), h0

    def forward(self, x, *h0):
        return self.gru(x, *h0)[0]


class LinearGruLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.front, self.head = torch.nn.Linear(C, 6), torch.nn.Linear(H, 2)
        self.gru = torch.nn.GRU(6, H, batch_first=True)

    def forward(self, x):
        return self.head(self.gru(self.front(x))[0])


MODELS = {
    "1_layer": lambda: Gru(),
    "2_layers_batch_first": lambda: Gru(num_layers=2, batch_first=True),
    "bidirectional_2_layers": lambda: Gru(num_layers=2, bidirectional=True),
    "h0_input": lambda: Gru(h0=True, num_layers=2, bidirectional=True, batch_first=True),
    "linear_gru_linear": LinearGruLinear,
}
EXPORTERS = {
    "torchscript": dict(dynamo=False),
    "dynamo": dict(dynamo=True),  # external_data=True is its default
    "dynamo_unoptimized": dict(dynamo=True, optimize=False),  # weights as Concat(Slice(initializer), ...)
}
CASES = [(m, e) for m in MODELS for e in ("torchscript", "dynamo")] + [
    ("bidirectional_2_layers", "dynamo_unoptimized"), ("linear_gru_linear", "dynamo_unoptimized")]


def _export(module, path, exporter):
    gru = module.gru
    x = torch.randn(N, T, C) if gru.batch_first else torch.randn(T, N, C)
    args, names = (x,), ["x"]
    if getattr(module, "h0", False):
        args, names = (x, torch.zeros(gru.num_layers * (1 + gru.bidirectional), N, H)), ["x", "h0"]
    kw = dict(EXPORTERS[exporter])
    if not kw["dynamo"]:  # variable lengths and batch sizes, as users export for deployment
        kw["dynamic_axes"] = {"x": {0: "a", 1: "b"}, **({"h0": {1: "n"}} if len(names) > 1 else {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=names, output_names=["y"], verbose=False, **kw)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(module, path) of a case, exported once; each file in its own folder (external data beside it)."""
    root, cache = tmp_path_factory.mktemp("exports"), {}

    def get(model, exporter):
        if (model, exporter) not in cache:
            torch.manual_seed(len(cache))
            module = MODELS[model]().eval()
            (root / f"{model}-{exporter}").mkdir()
            path = root / f"{model}-{exporter}" / "m.onnx"
            _export(module, path, exporter)
            cache[model, exporter] = module, path
        return cache[model, exporter]

    return get


def torch_gru(gru, x: np.ndarray) -> np.ndarray:
    """The PyTorch GRU on batch-first `x` from h = 0, batch-first out ([N, T, dirs * H], forward | backward)."""
    with torch.no_grad():
        xt = torch.from_numpy(x)
        y = gru(xt if gru.batch_first else xt.transpose(0, 1))[0]
        return (y if gru.batch_first else y.transpose(0, 1)).numpy()


def matches_pytorch(model, gru, seed=7):
    """Held-out data of another length and batch size than the export's, against the module's own GRU."""
    assert model.extra["check"]["checked"] and model.extra["check"]["max_abs_diff"] <= 1e-4
    assert model.num_layers == gru.num_layers and model.bidirectional == gru.bidirectional
    x = np.random.default_rng(seed).standard_normal((N + 1, T + 4, gru.input_size)).astype(np.float32)
    assert np.abs(run_float(model, x) - torch_gru(gru, x)).max() < 1e-4


@pytest.mark.parametrize("model_name, exporter", CASES)
def test_exported_gru_imports_and_equals_pytorch(exported, model_name, exporter):
    module, path = exported(model_name, exporter)
    if model_name == "h0_input":  # each layer's state a Slice of this input: refused, not taken as zero
        assert "h0" in [i.name for i in onnx.load(str(path), load_external_data=False).graph.input]
        with pytest.raises(QtoolError, match="read from the model's input 'h0': a state carried in from outside"):
            import_model(path)
        return
    model = import_model(path)  # the ONNX Runtime check is on
    matches_pytorch(model, module.gru)
    took = model.extra["import"]["took"]
    assert len(took) == module.gru.num_layers
    if model_name == "linear_gru_linear":  # the GRU is taken; the Linear layers are named, not dropped silently
        left_out = model.extra["import"]["left_out"]
        ops = sorted(s.rsplit(" (", 1)[1].rstrip(")") for s in left_out)
        assert ops in (["Add", "Add", "MatMul", "MatMul"], ["Gemm", "Gemm"]), left_out
        assert model.extra["import"]["input_from"] in left_out  # the front Linear feeds the GRU
        assert model.extra["import"]["input_from"].endswith(("(Add)", "(Gemm)"))
    else:
        stack = f"GRU node '{took[0]}' starts a stack of {len(took)} GRU layers: took them all"
        notes = [stack] if len(took) > 1 else []
        assert model.extra["import"] == {"took": took, "left_out": [], "input_from": None, "notes": notes}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_each_layer_of_an_exported_stack_says_what_feeds_it(exported, exporter):
    _, path = exported("bidirectional_2_layers", exporter)
    stacks = read_stacks(path, "onnx")
    first, second = stacks[""].took
    assert stacks[first].input_from is None and stacks[second].input_from == f"{first} (GRU)"
    # naming the first GRU node takes the stack it starts, and says so; the second is its last layer alone
    assert stacks[first].took == [first, second] and stacks[first].left_out == []
    assert "starts a stack of 2 GRU layers" in stacks[first].notes[0]
    assert stacks[second].left_out == [f"{first} (GRU)"] and stacks[second].took == [second]


def test_the_default_exporter_writes_weights_to_external_data(exported):
    module, path = exported("bidirectional_2_layers", "dynamo")
    m = onnx.load(str(path), load_external_data=False)
    assert any(t.data_location == EXTERNAL for t in m.graph.initializer)  # what this test is about
    matches_pytorch(import_model(path), module.gru)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo_unoptimized"])
def test_every_tensor_in_one_external_file(exported, exporter, tmp_path):
    """onnx.save(save_as_external_data=True, all_tensors_to_one_file=True, size_threshold=0): every
    initializer's bytes in one file beside the model, read at its offset."""
    module, path = exported("bidirectional_2_layers", exporter)
    m = onnx.load(str(path))
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    m = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    assert m.graph.initializer and all(t.data_location == EXTERNAL for t in m.graph.initializer)
    matches_pytorch(import_model(tmp_path / "m.onnx"), module.gru)
