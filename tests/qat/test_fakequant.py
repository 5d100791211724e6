"""The fake-quant GRU (qtool.numerics.fakequant) against independent references: its grid math against
qparams.quantize / intops.rshift_round, its "integer" rounding against the integer engine on every
tensor, and `qtool simulate --mode fakequant|both` on every preset."""

import json

import numpy as np
import pytest
from conftest import SAMPLES, calibrated, has, random_model

from qtool.core.tensors import TensorConfig, preset_config
from qtool.engine.cpu import run_int
from qtool.numerics.fakequant import qdq, run_fakequant, snap, to_int
from qtool.numerics.intops import rshift_round
from qtool.numerics.qparams import dequantize, quantize
from qtool.simulation.run import int_tensors


def test_qdq_is_quantize_then_dequantize():
    """Rounding half up on both signs, ties included, saturation at both ends."""
    rng = np.random.RandomState(0)
    ties = (np.arange(-300, 300) + 0.5) / 16  # every value a tie on the 2^-4 grid
    v = np.concatenate([rng.randn(2000) * 9, ties, [-1e9, 1e9, 0.0]])
    for e, zp, bits in ((4, -3, 8), (0, 0, 8), (-2, 100, 16), (9, 0, 16), (30, 0, 32)):
        want = dequantize(quantize(v, e, zp, bits), e, zp)
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        assert np.array_equal(qdq(np, v, np.ldexp(1.0, e), zp, lo, hi), want)


def test_snap_is_rshift_round_of_the_term():
    t = np.arange(-1000, 1001)
    for e_src, e_dst in ((7, 4), (5, 5), (3, 6), (12, 1)):
        got = snap(np, t * 2.0 ** -e_src, 2.0 ** e_dst) * 2.0 ** e_dst
        assert np.array_equal(got, [rshift_round(int(x), e_src - e_dst) for x in t])


MIXED = {**preset_config("int8"), "h": TensorConfig(16, False), "g_pre": TensorConfig(12, False),
         "z_out": TensorConfig(10, False), "R": TensorConfig(6, True)}


@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16", "mixed"])
@pytest.mark.parametrize("layers,dirs", [(1, 1), (2, 2)])
def test_integer_rounding_gives_the_engines_integers(preset, layers, dirs):
    """Every tensor of every step of the fake-quant GRU with "integer" rounding, read back as
    integers, equals the integer engine's: the shared cell mirrors intops."""
    model = random_model(C=5, H=6, layers=layers, dirs=dirs, seed=layers + dirs)
    rng = np.random.RandomState(1)
    config = MIXED if preset == "mixed" else preset_config(preset)
    qm = calibrated(model, rng.randn(32, 10, 5).astype(np.float32), config=config)
    x = rng.randn(16, 12, 5).astype(np.float32)  # not the calibration data
    itr, ftr = [], []
    y_int = run_int(qm, x, itr)
    y_fq = run_fakequant(qm, x, ftr, rounding="integer")
    assert np.array_equal(to_int(y_fq, qm.cells[-1][0].spec["h"]), y_int)
    for l, row in enumerate(qm.cells):
        for d, cq in enumerate(row):
            for name, q in int_tensors(itr[l][d]).items():
                assert np.array_equal(to_int(ftr[l][d][name], cq.spec[name]), q), (l, d, name)


def test_tensor_rounding_differs_only_where_sums_round_per_term():
    """At the first step (h = 0, so Rh is the same in both) the GEMM Wx and the table-free
    tensors agree; only sums with a shift onto a coarser grid can differ."""
    model = random_model(C=5, H=8, seed=3)
    rng = np.random.RandomState(2)
    qm = calibrated(model, rng.randn(64, 6, 5).astype(np.float32))
    x = rng.randn(64, 6, 5).astype(np.float32)
    itr, ftr = [], []
    run_int(qm, x, itr)
    run_fakequant(qm, x, ftr, rounding="tensor")
    spec, ints = qm.cells[0][0].spec, int_tensors(itr[0][0])
    for name in ("Wx", "Rh"):
        assert np.array_equal(to_int(ftr[0][0][name][0], spec[name]), ints[name][0])
    differs = {n for n in ("z_pre", "r_pre", "g_pre", "h")
               if not np.array_equal(to_int(ftr[0][0][n][0], spec[n]), ints[n][0])}
    assert differs  # the per-term rounding shows
    P = dict(zip(__import__("qtool.numerics.rescale", fromlist=["PARAMS"]).PARAMS, qm.cells[0][0].P))
    if P["sh_Wx_z_pre"] <= 0 and P["sh_Rh_z_pre"] <= 0:
        assert "z_pre" not in differs


@pytest.fixture(scope="module")
def sample_qmodels(tmp_path_factory):
    from qtool.cli.app import main

    d = tmp_path_factory.mktemp("fq")
    for preset in ("int8", "w8a16", "int16"):
        with pytest.raises(SystemExit) as e:
            main(["calibrate", str(SAMPLES / "digits_gru.safetensors"), str(SAMPLES / "calib.npy"),
                  "-o", str(d / f"{preset}.h5"), "--bits", preset])
        assert e.value.code in (0, None)
    return d


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
@pytest.mark.parametrize("preset", ["int8", "w8a16", "int16"])
def test_simulate_mode_both_on_every_preset(cli, sample_qmodels, preset):
    code, out, err = cli("simulate", sample_qmodels / f"{preset}.h5", SAMPLES / "test.npy", "--mode",
                         "both", "--limit", "50", "--json")
    assert code == 0, err
    res = json.loads(out)
    fq, agree = res["fakequant"], res["fakequant"]["agreement"]
    assert res["mode"] == "both" and set(fq["tensors"]) == set(res["tensors"])
    # layer 0's x and Wx see the same inputs and are rounded once in both
    for name in ("layer0.fwd.x", "layer0.fwd.Wx"):
        assert agree[name] == {"identical": 1.0, "max_lsb": 0}
    assert agree["output"]["identical"] < 1.0  # the sums' per-term rounding shows at the output
    assert fq["output"]["cosine"] > 0.99 and fq["output"]["count"] == res["output"]["count"]
    code, out, err = cli("simulate", sample_qmodels / f"{preset}.h5", SAMPLES / "test.npy", "--mode",
                         "both", "--limit", "20")
    assert code == 0 and "fakequant" in out and "arithmetic itself costs" in out


@pytest.mark.skipif(not has("safetensors"), reason="the sample is .safetensors")
def test_simulate_mode_fakequant_and_bad_mode(cli, sample_qmodels, tmp_path):
    code, out, err = cli("simulate", sample_qmodels / "int8.h5", SAMPLES / "test.npy", "--mode",
                         "fakequant", "--limit", "30", "--json", "--save", tmp_path / "r.h5")
    assert code == 0, err
    res = json.loads(out)
    assert res["mode"] == "fakequant" and "agreement" not in res and res["output"]["count"] == 30 * 8 * 64
    from qtool.core.tensors import NAMES

    assert set(res["tensors"]) == {f"layer{l}.fwd.{name}" for l in range(2) for name in NAMES}  # activations too
    import h5py

    with h5py.File(tmp_path / "r.h5") as f:
        yq, yi = f["quant/y"][()], f["quant/y_int"][()]
    from qtool.io.qmodel_file import load_qmodel

    s = load_qmodel(sample_qmodels / "int8.h5").cells[-1][0].spec["h"]
    assert np.array_equal(dequantize(yi, s.exp2_inv, s.zp).astype(np.float32), yq)  # on the grid
    code, out, err = cli("simulate", sample_qmodels / "int8.h5", SAMPLES / "test.npy", "--mode", "fq")
    assert code == 2 and "unknown --mode 'fq'" in err and len(err.strip().splitlines()) == 1
