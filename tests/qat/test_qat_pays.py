"""QAT pays on samples/sum100_gru.pt (samples/qat_demo.py --task sum100): int8 calibration with
its best method loses more than a point of task accuracy against the float GRU, and the file QAT
wrote with the task's recipe (samples/sum100_qat.h5, seed 0: cosine-annealed distillation, the
checkpoint best on a validation split of the training sequences) wins most of it back. The
float accuracy is nn.GRU's, the others the integer engine's on the quantized model files, on the
2000 held-out sequences."""

import importlib.util

import numpy as np
import pytest
from conftest import SAMPLES, has

pytestmark = pytest.mark.skipif(not has("torch"), reason="the sample model is a PyTorch checkpoint")


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("qat_demo", SAMPLES / "qat_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_int8_calibration_loses_a_point_and_qat_wins_it_back(demo):
    import torch

    from qtool import api
    from qtool.io.qmodel_file import load_qmodel
    from qtool.qat.module import gru_model

    torch.set_num_threads(1)
    x_tr, _, x_te, y_te = demo.sum100()
    gru, head = demo.load_float("sum100", 1)
    with torch.no_grad():
        float_acc = demo.accuracy(gru(torch.from_numpy(x_te))[0][:, -1].numpy(), head, y_te)
    ptq = demo.int_accuracy(api.calibrate(gru_model(gru), x_tr[:400], bits="int8", method="auto"), x_te, head, y_te)
    qat = demo.int_accuracy(load_qmodel(SAMPLES / "sum100_qat.h5"), x_te, head, y_te)
    # the numbers docs/qat.md reports, to a sequence of 2000 (a float argmax may tip elsewhere)
    assert float_acc == pytest.approx(0.9790, abs=0.0005)
    assert ptq == pytest.approx(0.9455, abs=0.0005)
    assert qat == pytest.approx(0.9720, abs=0.0005)
    assert float_acc - ptq > 0.01
    assert qat - ptq > (float_acc - ptq) / 2  # most of the loss won back


def test_the_recipe_writes_its_best_validated_checkpoint_on_the_calibrated_grids(demo):
    """A short run of the recipe's fine-tune: the module ends on the checkpoint it validated best
    (the calibrated start included, so never below it), and with --grid-lr 0 on the calibration's
    grids."""
    from argparse import Namespace

    import torch

    from qtool import api
    from qtool.qat import QuantGRU
    from qtool.qat.module import gru_model

    torch.set_num_threads(1)
    x_tr, y_tr, _, _ = demo.sum100()
    gru, head = demo.load_float("sum100", 1)
    qm = api.calibrate(gru_model(gru), x_tr[:400], bits="int8", method="mse")
    val = (x_tr[-300:], y_tr[-300:])
    torch.manual_seed(0)
    qgru = QuantGRU(qm, batch_first=True)
    a = Namespace(**{**demo.TASKS["sum100"].qat._asdict(), "epochs": 1}, loss="distill", eval_every=1)
    tuned = demo.fine_tune(qgru, gru, head, x_tr[:192], y_tr[:192], a, val)
    assert tuned.steps == 3 and 0 <= tuned.best_step <= 3
    written = qgru.to_quant_model()
    assert demo.int_accuracy(written, val[0], head, val[1]) == tuned.val
    assert tuned.val >= demo.int_accuracy(qm, val[0], head, val[1])
    assert not any(p.requires_grad for p in qgru.range_parameters())
    for name, t in qm.cells[0][0].spec.items():
        if name not in ("bx", "br"):  # the 32-bit biases' grids follow their values
            w = written.cells[0][0].spec[name]
            assert np.array_equal(w.exp2_inv, t.exp2_inv) and w.zp == t.zp, name
