"""The check of an import against its framework: a file read otherwise than the framework reads it
is refused as a wrong import; a model whose own output float32 rounding moves beyond the
tolerance is refused saying that the check cannot tell the two apart."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qtool.errors import QtoolError  # noqa: E402


@pytest.mark.parametrize("conditioned", [True, False])
def test_the_check_tells_a_misread_file_from_an_ill_conditioned_model(tmp_path, monkeypatch, conditioned):
    """x @ W1 @ W2 with W2 = W1's inverse: well conditioned, a graph that differs from ONNX Runtime
    is refused as a wrong import; with W1's singular values over 7 decades, float32 rounding alone
    moves the output by more than the tolerance, and the refusal says that instead."""
    import qtool.layers
    from qtool.importers import import_graph

    rng = np.random.default_rng(0)
    c = 16
    U, _ = np.linalg.qr(rng.normal(size=(c, c)))
    V, _ = np.linalg.qr(rng.normal(size=(c, c)))
    W1 = (U * np.logspace(0, -1 if conditioned else -7, c)) @ V.T
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", c])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(W.astype(np.float32), n) for W, n in ((W1, "W1"), (np.linalg.inv(W1), "W2"))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"]), helper.make_node("MatMul", ["a", "W2"], ["y"])]
    onnx.save(helper.make_model(helper.make_graph(nodes, "m", [x], [y], inits)), str(tmp_path / "m.onnx"))
    if conditioned:
        run = qtool.layers.run  # a misreading: every output off by 0.5
        monkeypatch.setattr(qtool.layers, "run", lambda g, v, **kw: {k: a + 0.5 for k, a in run(g, v, **kw).items()})
        wrong = (r"differs from ONNX Runtime by up to [0-9.]+ \(relative where above 1; tolerance 0.0001\); "
                 "refusing a wrong import$")
        with pytest.raises(QtoolError, match=wrong):
            import_graph(tmp_path / "m.onnx")
        return
    with pytest.raises(QtoolError) as e:
        import_graph(tmp_path / "m.onnx")
    assert "when its inputs move by one float32 rounding step" in str(e.value)
    assert str(e.value).endswith("(`check=False` imports it unchecked)")
    assert [n.op for n in import_graph(tmp_path / "m.onnx", check=False).nodes] == ["dense", "dense"]
