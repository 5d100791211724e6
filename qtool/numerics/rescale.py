"""Every shift and constant of the integer GRU, derived from the spec in this one place
(docs/numerics.md, "Derived parameters"). Engines and exporters only read what `derive` returns.

A ratio of scales S_a * S_b / S_c = 2^-(e_a + e_b - e_c) becomes a rounding right shift by
`e_a + e_b - e_c` (a left shift when negative).

Scalars go into one int64 vector `P` (names in PARAMS, indices as constants below); per-channel
values into `CH [len(CHANNEL_ROWS), 3H]`.
"""

from __future__ import annotations

import numpy as np

from qtool.core.tensors import (
    ACTIVATIONS,
    CHANNEL_ROWS,
    COMPUTED,
    PARAMS,
    PARAMS_RESET_BEFORE,
    TENSORS_RESET_BEFORE,
)
from qtool.errors import QtoolError
from qtool.numerics.qparams import qrange, round_half_up

# unpacked so that numba and CUDA see plain integer constants
(ZP_X, ZP_H, ZP_WX, ZP_RH, ZP_Z_PRE, ZP_R_PRE, ZP_G_PRE, ZP_Z_OUT, ZP_R_OUT,
 ZP_G_OUT, ZP_RH_ADD_BR, ZP_RRH, ZP_OLD_CONTRIB, ZP_NEW_CONTRIB,
 SH_WX_Z_PRE, SH_RH_Z_PRE, SH_WX_R_PRE, SH_RH_R_PRE, SH_RH_RH_ADD_BR, SH_RRH,
 SH_WX_G_PRE, SH_RRH_G_PRE, SH_OLD_CONTRIB, SH_NEW_CONTRIB, SH_OLD_CONTRIB_H,
 SH_NEW_CONTRIB_H,
 Q_1_IN_Z_SCALE,
 LO_WX, HI_WX, LO_RH, HI_RH, LO_Z_PRE, HI_Z_PRE, LO_R_PRE, HI_R_PRE,
 LO_G_PRE, HI_G_PRE, LO_Z_OUT, HI_Z_OUT, LO_R_OUT, HI_R_OUT, LO_G_OUT, HI_G_OUT,
 LO_RH_ADD_BR, HI_RH_ADD_BR, LO_RRH, HI_RRH, LO_OLD_CONTRIB, HI_OLD_CONTRIB,
 LO_NEW_CONTRIB, HI_NEW_CONTRIB, LO_H, HI_H,
 LUT_SHIFT_Z, LUT_SHIFT_R, LUT_SHIFT_G) = range(len(PARAMS))

(CH_SH_W, CH_W_SUM_MUL_X_ZP, CH_SH_R, CH_R_SUM_MUL_H_ZP, CH_QBX, CH_QBR, CH_SH_BX,
 CH_SH_BR) = range(len(CHANNEL_ROWS))

# P of a reset-before cell (PARAMS_RESET_BEFORE); its CH has the rows above, the g rows of sh_R and
# R_sum_mul_h_zp being those of the GEMM on rh (docs/numerics.md, "Integer cell, reset before")
(RB_ZP_X, RB_ZP_H, RB_ZP_WX, RB_ZP_RH, RB_ZP_Z_PRE, RB_ZP_R_PRE, RB_ZP_G_PRE, RB_ZP_Z_OUT, RB_ZP_R_OUT,
 RB_ZP_G_OUT, RB_ZP_RH_PROD, RB_ZP_OLD_CONTRIB, RB_ZP_NEW_CONTRIB,
 RB_SH_WX_Z_PRE, RB_SH_RH_Z_PRE, RB_SH_WX_R_PRE, RB_SH_RH_R_PRE, RB_SH_RH_PROD, RB_SH_WX_G_PRE, RB_SH_RH_G_PRE,
 RB_SH_OLD_CONTRIB, RB_SH_NEW_CONTRIB, RB_SH_OLD_CONTRIB_H, RB_SH_NEW_CONTRIB_H,
 RB_Q_1_IN_Z_SCALE,
 RB_LO_WX, RB_HI_WX, RB_LO_RH, RB_HI_RH, RB_LO_Z_PRE, RB_HI_Z_PRE, RB_LO_R_PRE, RB_HI_R_PRE,
 RB_LO_G_PRE, RB_HI_G_PRE, RB_LO_Z_OUT, RB_HI_Z_OUT, RB_LO_R_OUT, RB_HI_R_OUT, RB_LO_G_OUT, RB_HI_G_OUT,
 RB_LO_RH_PROD, RB_HI_RH_PROD, RB_LO_OLD_CONTRIB, RB_HI_OLD_CONTRIB, RB_LO_NEW_CONTRIB, RB_HI_NEW_CONTRIB,
 RB_LO_H, RB_HI_H,
 RB_LUT_SHIFT_Z, RB_LUT_SHIFT_R, RB_LUT_SHIFT_G) = range(len(PARAMS_RESET_BEFORE))

MAX_RIGHT, MAX_LEFT = 62, 24  # right shifts beyond 62 or left beyond 24 mean broken ranges


def sum_mul_zp(q_w: np.ndarray, zp: int) -> np.ndarray:
    """Zero-point compensation: sum_k q_w[c, k] (q_in[k] - zp) = (q_w @ q_in)[c] - zp * sum_k q_w[c, k]."""
    return zp * np.asarray(q_w, np.int64).sum(axis=1)


def derive(spec: dict, qW: np.ndarray, qR: np.ndarray, qbx: np.ndarray, qbr: np.ndarray,
           lut_shifts: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Build (P, CH) for one layer direction from its spec (name -> TensorQ) and integer weights."""
    e = {n: spec[n].exp2_inv for n in spec}
    zp = {n: spec[n].zp for n in spec}
    H = qR.shape[1]
    p = {f"zp_{n}": zp[n] for n in ACTIVATIONS}
    p.update(
        _gates_and_update(e, zp, lut_shifts),
        sh_Rh_Rh_add_br=e["Rh"] - e["Rh_add_br"],
        sh_rRh=e["r_out"] + e["Rh_add_br"] - e["rRh"],
        sh_Wx_g_pre=e["Wx"] - e["g_pre"], sh_rRh_g_pre=e["rRh"] - e["g_pre"],
    )
    for n in COMPUTED:  # every computed tensor saturates to its bits
        p[f"lo_{n}"], p[f"hi_{n}"] = qrange(spec[n].bits)
    P = np.array([p[name] for name in PARAMS], np.int64)

    gate = np.repeat(np.arange(3), H)  # 0: z, 1: r, 2: g block of the 3H axis
    bx_target = np.array([e["z_pre"], e["r_pre"], e["g_pre"]])[gate]
    br_target = np.array([e["z_pre"], e["r_pre"], e["Rh_add_br"]])[gate]
    rows = {
        "sh_W": spec["W"].exp2_inv + e["x"] - e["Wx"],
        "W_sum_mul_x_zp": sum_mul_zp(qW, zp["x"]),
        "sh_R": spec["R"].exp2_inv + e["h"] - e["Rh"],
        "R_sum_mul_h_zp": sum_mul_zp(qR, zp["h"]),
        "qbx": qbx, "qbr": qbr,
        "sh_bx": spec["bx"].exp2_inv - bx_target,
        "sh_br": spec["br"].exp2_inv - br_target,
    }
    CH = np.stack([np.asarray(rows[r], np.int64) for r in CHANNEL_ROWS])
    _check_shifts(P, CH)
    return P, CH


def _gates_and_update(e: dict, zp: dict, lut_shifts: tuple[int, int, int]) -> dict:
    """The scalar params both cell forms share: the z and r pre-activations' shifts, the update's
    (old_contrib, new_contrib, h) and the tables' input shifts."""
    return dict(
        sh_Wx_z_pre=e["Wx"] - e["z_pre"], sh_Rh_z_pre=e["Rh"] - e["z_pre"],
        sh_Wx_r_pre=e["Wx"] - e["r_pre"], sh_Rh_r_pre=e["Rh"] - e["r_pre"],
        sh_old_contrib=e["z_out"] + e["h"] - e["old_contrib"],
        sh_new_contrib=e["z_out"] + e["g_out"] - e["new_contrib"],
        sh_old_contrib_h=e["old_contrib"] - e["h"], sh_new_contrib_h=e["new_contrib"] - e["h"],
        # q_1 = round(1.0 * 2^exp2_inv_z_out) + zp_z_out
        q_1_in_z_scale=int(round_half_up(np.ldexp(1.0, e["z_out"]))) + zp["z_out"],
        lut_shift_z=lut_shifts[0], lut_shift_r=lut_shifts[1], lut_shift_g=lut_shifts[2],
    )


def derive_reset_before(spec: dict, qW: np.ndarray, qR: np.ndarray, qbx: np.ndarray, qbr: np.ndarray,
                        lut_shifts: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(P, CH) of a reset-before cell (P in PARAMS_RESET_BEFORE's order). Its g channels differ
    from the haste cell's: R's g rows multiply rh, so their shift and zero-point compensation are
    rh's (`sh_R = e_R + e_rh - e_Rh`, `R_sum_mul_h_zp = zp_rh sum_k q_R`), and both biases of g
    go straight to g_pre."""
    e = {n: spec[n].exp2_inv for n in spec}
    zp = {n: spec[n].zp for n in spec}
    H = qR.shape[1]
    p = {f"zp_{t.name}": zp[t.name] for t in TENSORS_RESET_BEFORE if t.kind == "activation"}
    p.update(
        _gates_and_update(e, zp, lut_shifts),
        sh_rh=e["r_out"] + e["h"] - e["rh"],
        sh_Wx_g_pre=e["Wx"] - e["g_pre"], sh_Rh_g_pre=e["Rh"] - e["g_pre"],
    )
    for t in TENSORS_RESET_BEFORE:
        if t.kind == "activation" and t.name != "x":  # every computed tensor saturates to its bits
            p[f"lo_{t.name}"], p[f"hi_{t.name}"] = qrange(spec[t.name].bits)
    P = np.array([p[name] for name in PARAMS_RESET_BEFORE], np.int64)

    gate = np.repeat(np.arange(3), H)  # 0: z, 1: r, 2: g block of the 3H axis
    pre = np.array([e["z_pre"], e["r_pre"], e["g_pre"]])[gate]
    R_input_e = np.array([e["h"], e["h"], e["rh"]])[gate]  # what each row of R multiplies
    R_input_zp = np.array([zp["h"], zp["h"], zp["rh"]])[gate]
    rows = {
        "sh_W": spec["W"].exp2_inv + e["x"] - e["Wx"],
        "W_sum_mul_x_zp": sum_mul_zp(qW, zp["x"]),
        "sh_R": spec["R"].exp2_inv + R_input_e - e["Rh"],
        "R_sum_mul_h_zp": R_input_zp * np.asarray(qR, np.int64).sum(axis=1),
        "qbx": qbx, "qbr": qbr,
        "sh_bx": spec["bx"].exp2_inv - pre,
        "sh_br": spec["br"].exp2_inv - pre,
    }
    CH = np.stack([np.asarray(rows[r], np.int64) for r in CHANNEL_ROWS])
    _check_shifts(P, CH, PARAMS_RESET_BEFORE)
    return P, CH


def _check_shifts(P: np.ndarray, CH: np.ndarray, names: tuple[str, ...] = PARAMS) -> None:
    shifts = [(n, int(P[i])) for i, n in enumerate(names) if n.startswith("sh_")]
    for r in ("sh_W", "sh_R", "sh_bx", "sh_br"):
        row = CH[CHANNEL_ROWS.index(r)]
        shifts += [(r, int(row.min())), (r, int(row.max()))]
    for name, s in shifts:
        if s > MAX_RIGHT or s < -MAX_LEFT:
            raise QtoolError(f"shift {name} = {s} is out of range; the calibrated ranges are "
                             "inconsistent (check the calibration data)")


def derive_cell(form, spec: dict, qW: np.ndarray, qR: np.ndarray, qbx: np.ndarray, qbr: np.ndarray,
                lut_shifts: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(P, CH) of a cell of this form (qtool.core.model.CellForm): `derive`, or `derive_reset_before`."""
    return (derive if form.reset_after else derive_reset_before)(spec, qW, qR, qbx, qbr, lut_shifts)
