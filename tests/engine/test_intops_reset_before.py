"""The integer semantics of the reset-before cell (docs/numerics.md, "Integer cell, reset before"):
intops.gru_gates_reset_before and gru_candidate_reset_before with rescale.derive_reset_before's
parameters. Held against an independent Python-integer transcription of the formulas (exact, on
random integers and parameters), and, run over whole sequences on grids set from the float cell's
own ranges, against the float reset-before cell on held-out data (int16 / w8a16 / int8). These
functions are not yet wired into calibration and the engines: the integer doors still refuse the
form (tests/importers/test_gru_variants.py)."""

import numpy as np
import pytest

from qtool.core.model import CellForm, GruCell
from qtool.core.qmodel import TensorQ
from qtool.core.tensors import PARAMS_RESET_BEFORE, PRESETS, TENSORS_RESET_BEFORE
from qtool.numerics import rescale as rs
from qtool.numerics.float_gru import run_direction
from qtool.numerics.intops import gru_candidate_reset_before, gru_gates_reset_before, rescale
from qtool.numerics.lut import build_lut
from qtool.numerics.qparams import choose_qparams, dequantize, qrange, quantize

numba = pytest.importorskip("numba")
RESET_BEFORE = CellForm(reset_after=False)
P_INDEX = {n: i for i, n in enumerate(PARAMS_RESET_BEFORE)}
ROW = {n: i for i, n in enumerate(("sh_W", "W_sum_mul_x_zp", "sh_R", "R_sum_mul_h_zp", "qbx", "qbr", "sh_bx",
                                    "sh_br"))}


def test_parameter_constants_follow_the_names():
    """rescale.RB_* index PARAMS_RESET_BEFORE (RH_PROD is rh = r * h_old; RH is Rh = R h)."""
    for name, i in P_INDEX.items():
        const = "RB_" + name.upper().replace("RH", "RH_PROD") if name.endswith("_rh") else "RB_" + name.upper()
        assert getattr(rs, const) == i, name
    assert "rh" in {t.name for t in TENSORS_RESET_BEFORE} and "rRh" not in {t.name for t in TENSORS_RESET_BEFORE}


# ---- exact integers: an independent transcription in Python integers


def _rs(v: int, n: int) -> int:
    return (v + (1 << (n - 1))) >> n if n > 0 else v << -n


def _clamp(v: int, bits: int) -> int:
    lo, hi = qrange(bits)
    return min(max(v, lo), hi)


def _reference_unit(q, P, CH, luts, bits, j, H):
    """One unit of the reset-before cell written out from docs/numerics.md with Python ints (tables
    directly indexed: shift 0)."""
    p = {n: int(P[i]) for n, i in P_INDEX.items()}
    ch = {n: [int(v) for v in CH[i]] for n, i in ROW.items()}
    jz, jr, jg = j, H + j, 2 * H + j

    def Rh(acc, c):
        return _clamp(_rs(acc - ch["R_sum_mul_h_zp"][c], ch["sh_R"][c]) + p["zp_Rh"], bits["Rh"])

    def pre(Wx, Rh_c, c, name):
        v = (_rs(Wx - p["zp_Wx"], p[f"sh_Wx_{name}"]) + _rs(Rh_c - p["zp_Rh"], p[f"sh_Rh_{name}"])
             + _rs(ch["qbx"][c], ch["sh_bx"][c]) + _rs(ch["qbr"][c], ch["sh_br"][c]) + p[f"zp_{name}"])
        return _clamp(v, bits[name])

    out = {"Rh_z": Rh(q["acc_z"], jz), "Rh_r": Rh(q["acc_r"], jr)}
    out["z_pre"] = pre(q["Wx_z"], out["Rh_z"], jz, "z_pre")
    out["r_pre"] = pre(q["Wx_r"], out["Rh_r"], jr, "r_pre")
    out["z"] = int(luts["z"][out["z_pre"] - qrange(bits["z_pre"])[0]])
    out["r"] = int(luts["r"][out["r_pre"] - qrange(bits["r_pre"])[0]])
    out["rh"] = _clamp(_rs((out["r"] - p["zp_r_out"]) * (q["h"] - p["zp_h"]), p["sh_rh"]) + p["zp_rh"], bits["rh"])
    out["Rh_g"] = Rh(q["acc_g"], jg)
    out["g_pre"] = pre(q["Wx_g"], out["Rh_g"], jg, "g_pre")
    out["g"] = int(luts["g"][out["g_pre"] - qrange(bits["g_pre"])[0]])
    old = _clamp(_rs((out["z"] - p["zp_z_out"]) * (q["h"] - p["zp_h"]), p["sh_old_contrib"]) + p["zp_old_contrib"],
                 bits["old_contrib"])
    one_minus_z = _clamp(p["q_1_in_z_scale"] - out["z"] + p["zp_z_out"], bits["z_out"])
    new = _clamp(_rs((one_minus_z - p["zp_z_out"]) * (out["g"] - p["zp_g_out"]), p["sh_new_contrib"])
                 + p["zp_new_contrib"], bits["new_contrib"])
    out["old_contrib"], out["new_contrib"] = old, new
    out["h"] = _clamp(_rs(old - p["zp_old_contrib"], p["sh_old_contrib_h"])
                      + _rs(new - p["zp_new_contrib"], p["sh_new_contrib_h"]) + p["zp_h"], bits["h"])
    return out


def _random_spec(rng, H: int, C: int, bits: int) -> dict[str, TensorQ]:
    """A spec of random grids (8-bit activations here: directly indexed tables)."""
    spec = {}
    for t in TENSORS_RESET_BEFORE:
        if t.kind == "activation":
            b = bits
            lo, hi = qrange(b)
            zp = 0 if t.symmetric else int(rng.integers(lo // 2, hi // 2))
            spec[t.name] = TensorQ(b, t.symmetric, int(rng.integers(2, 9)), zp, 0.0, 0.0)
        else:
            b = 32 if t.kind == "bias" else 8
            spec[t.name] = TensorQ(b, True, rng.integers(4, 12, 3 * H), 0, 0.0, 0.0)
    spec["z_out"] = TensorQ(bits, False, bits - 2, 0, 0.0, 0.0)  # holds 1 and 1 - z
    return spec


def test_the_cell_functions_give_the_integers_of_the_formulas():
    rng = np.random.default_rng(0)
    H, C, bits = 6, 4, 8
    gates, candidate = numba.njit(gru_gates_reset_before), numba.njit(gru_candidate_reset_before)
    for trial in range(20):
        spec = _random_spec(rng, H, C, bits)
        qW, qR = rng.integers(-127, 128, (3 * H, C)), rng.integers(-127, 128, (3 * H, H))
        qbx, qbr = rng.integers(-2000, 2000, 3 * H), rng.integers(-2000, 2000, 3 * H)
        luts = {}
        for k, func, src, dst in (("z", "sigmoid", "z_pre", "z_out"), ("r", "sigmoid", "r_pre", "r_out"),
                                  ("g", "tanh", "g_pre", "g_out")):
            a, b = spec[src], spec[dst]
            luts[k] = build_lut(func, a.bits, a.exp2_inv, a.zp, b.bits, b.exp2_inv, b.zp)[0]
        P, CH = rs.derive_reset_before(spec, qW, qR, qbx, qbr, (0, 0, 0))
        lo, hi = qrange(bits)
        for j in range(H):
            q = {k: int(rng.integers(lo, hi + 1)) for k in ("Wx_z", "Wx_r", "Wx_g", "h")}
            q.update({k: int(rng.integers(-60000, 60000)) for k in ("acc_z", "acc_r", "acc_g")})
            want = _reference_unit(q, P, CH, luts, {n: spec[n].bits for n in spec}, j, H)
            got_gates = gates(q["Wx_z"], q["Wx_r"], q["acc_z"], q["acc_r"], q["h"], j, H + j, P, CH,
                              luts["z"], luts["r"])
            assert list(got_gates) == [want[k] for k in ("Rh_z", "Rh_r", "z_pre", "r_pre", "z", "r", "rh")], trial
            got = candidate(q["Wx_g"], q["acc_g"], q["h"], got_gates[4], 2 * H + j, P, CH, luts["g"])
            assert list(got) == [want[k] for k in ("Rh_g", "g_pre", "g", "old_contrib", "new_contrib", "h")], trial


def test_derived_parameters_of_the_g_rows_are_rhs():
    rng = np.random.default_rng(1)
    H, C = 3, 2
    spec = _random_spec(rng, H, C, 8)
    qR = rng.integers(-127, 128, (3 * H, H))
    P, CH = rs.derive_reset_before(spec, rng.integers(-127, 128, (3 * H, C)), qR, np.zeros(3 * H, int),
                                   np.zeros(3 * H, int), (0, 0, 0))
    e = {n: spec[n].exp2_inv for n in spec}
    rows = qR.sum(axis=1)
    assert list(CH[ROW["R_sum_mul_h_zp"]]) == list(np.r_[spec["h"].zp * rows[:2 * H], spec["rh"].zp * rows[2 * H:]])
    assert list(CH[ROW["sh_R"]]) == list(e["R"] + np.r_[[e["h"]] * 2 * H, [e["rh"]] * H] - e["Rh"])
    assert list(CH[ROW["sh_br"]][2 * H:]) == list(e["br"][2 * H:] - e["g_pre"])  # br_g goes straight to g_pre
    assert P[P_INDEX["sh_rh"]] == e["r_out"] + e["h"] - e["rh"]
    assert P[P_INDEX["sh_Rh_g_pre"]] == e["Rh"] - e["g_pre"]


# ---- whole sequences against the float reset-before cell


@numba.njit(cache=False)
def _run_int(qx, qW, qR, P, CH, lut_z, lut_r, lut_g, zp_Wx, lo_Wx, hi_Wx):
    """The reset-before cell over qx [T, N, C]: the W GEMM rescaled per channel (the spec's Step 1),
    then per step the gates of every unit, the g rows' GEMM on q_rh, the candidate of every unit."""
    T, N, C = qx.shape
    H = qR.shape[1]
    out = np.empty((T, N, H), np.int64)
    for n in range(N):
        h = np.full(H, P[rs.RB_ZP_H], np.int64)
        z, rh = np.empty(H, np.int64), np.empty(H, np.int64)
        for t in range(T):
            Wx = np.empty(3 * H, np.int64)
            for c in range(3 * H):
                acc = np.int64(0)
                for k in range(C):
                    acc += qW[c, k] * qx[t, n, k]
                Wx[c] = rescale(acc - CH[1, c], CH[0, c], zp_Wx, lo_Wx, hi_Wx)
            for j in range(H):
                acc_z, acc_r = np.int64(0), np.int64(0)
                for k in range(H):
                    acc_z += qR[j, k] * h[k]
                    acc_r += qR[H + j, k] * h[k]
                res = gru_gates_reset_before(Wx[j], Wx[H + j], acc_z, acc_r, h[j], j, H + j, P, CH, lut_z, lut_r)
                z[j], rh[j] = res[4], res[6]
            h_new = np.empty(H, np.int64)
            for j in range(H):
                acc_g = np.int64(0)
                for k in range(H):
                    acc_g += qR[2 * H + j, k] * rh[k]
                h_new[j] = gru_candidate_reset_before(Wx[2 * H + j], acc_g, h[j], z[j], 2 * H + j, P, CH, lut_g)[5]
            h[:] = h_new
            out[t, n] = h
    return out


def _grids(cell: GruCell, x: np.ndarray, preset: str) -> dict[str, TensorQ]:
    """Every tensor's grid from the float cell's min/max over `x` (the calibration's rule, written
    out here because calibration does not run this form yet); z_out holds 1 - z too."""
    w_bits, b_bits, a_bits = PRESETS[preset]
    trace: dict = {}
    run_direction(cell, x, trace)
    spec = {}
    for t in TENSORS_RESET_BEFORE:
        if t.kind == "activation":
            v = trace[t.name]
            lo, hi = float(v.min()), float(v.max())
            if t.name == "z_out":
                lo, hi = min(lo, 1 - hi), max(hi, 1 - lo, 1.0)
            e, zp = choose_qparams(lo, hi, a_bits, t.symmetric)
            spec[t.name] = TensorQ(a_bits, t.symmetric, e, zp, lo, hi)
        else:
            a = getattr(cell, t.name).reshape(3 * cell.R.shape[1], -1)
            bits = b_bits if t.kind == "bias" else w_bits
            e = np.array([choose_qparams(r.min(), r.max(), bits, True)[0] for r in a], np.int64)
            spec[t.name] = TensorQ(bits, True, e, 0, a.min(axis=1), a.max(axis=1))
    return spec


@pytest.mark.parametrize("preset, cosine", [("int16", 0.9999), ("w8a16", 0.999), ("int8", 0.99)])
def test_integer_reset_before_cell_follows_the_float_cell_on_held_out_data(preset, cosine):
    rng = np.random.default_rng(7)
    H, C = 8, 5
    cell = GruCell(rng.normal(0, 0.5, (3 * H, C)), rng.normal(0, 0.4, (3 * H, H)), rng.normal(0, 0.3, 3 * H),
                   rng.normal(0, 0.3, 3 * H), RESET_BEFORE)
    calib = rng.standard_normal((40, 16, C)).astype(np.float32).transpose(1, 0, 2).copy()
    test = rng.standard_normal((20, 16, C)).astype(np.float32).transpose(1, 0, 2).copy()
    spec = _grids(cell, calib, preset)
    q = {n: quantize(getattr(cell, n), spec[n].exp2_inv, 0, spec[n].bits).astype(np.int64)
         for n in ("W", "R", "bx", "br")}
    luts, shifts = {}, []
    for k, func, src, dst in (("z", "sigmoid", "z_pre", "z_out"), ("r", "sigmoid", "r_pre", "r_out"),
                              ("g", "tanh", "g_pre", "g_out")):
        a, b = spec[src], spec[dst]
        table, shift, _ = build_lut(func, a.bits, a.exp2_inv, a.zp, b.bits, b.exp2_inv, b.zp)
        luts[k] = table
        shifts.append(shift)
    P, CH = rs.derive_reset_before(spec, q["W"], q["R"], q["bx"], q["br"], tuple(shifts))
    x, h = spec["x"], spec["h"]
    qx = quantize(test, x.exp2_inv, x.zp, x.bits).astype(np.int64)
    lo_Wx, hi_Wx = qrange(spec["Wx"].bits)
    q_h = _run_int(qx, q["W"], q["R"], P, CH, luts["z"], luts["r"], luts["g"], spec["Wx"].zp, lo_Wx, hi_Wx)
    got = dequantize(q_h, h.exp2_inv, h.zp).reshape(-1)
    want = run_direction(cell, test).reshape(-1).astype(np.float64)
    cos = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos >= cosine, (preset, cos)
