"""The integer semantics of qtool, written once.

Plain Python functions in the subset that numba compiles for the CPU (`njit`) and for CUDA
(device functions), registered with `register_jitable` so that the CPU engine and the CUDA
kernels call the very same code; the C runtime mirrors them line for line. All arithmetic is on
int64 values, or on int32 lanes where the CPU engine has proven that every value fits
(qtool.numerics.lanes: the primitives compute in the type of the model constant they are given).

Rounding rule for every rescale: add half, then arithmetic right shift (round half up).
Saturation rule: clamp to the target tensor's [qmin, qmax].
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from qtool.numerics.lanes import lane, shl, shr

# RB_*: the reset-before cell's P (rescale.derive_reset_before); RH_PROD there is rh = r * h, RH is Rh
from qtool.numerics.rescale import (
    CH_QBR,
    CH_QBX,
    CH_R_SUM_MUL_H_ZP,
    CH_SH_BR,
    CH_SH_BX,
    CH_SH_R,
    HI_G_PRE,
    HI_H,
    HI_NEW_CONTRIB,
    HI_OLD_CONTRIB,
    HI_R_PRE,
    HI_RH,
    HI_RH_ADD_BR,
    HI_RRH,
    HI_Z_OUT,
    HI_Z_PRE,
    LO_G_PRE,
    LO_H,
    LO_NEW_CONTRIB,
    LO_OLD_CONTRIB,
    LO_R_PRE,
    LO_RH,
    LO_RH_ADD_BR,
    LO_RRH,
    LO_Z_OUT,
    LO_Z_PRE,
    LUT_SHIFT_G,
    LUT_SHIFT_R,
    LUT_SHIFT_Z,
    Q_1_IN_Z_SCALE,
    RB_HI_G_PRE,
    RB_HI_H,
    RB_HI_NEW_CONTRIB,
    RB_HI_OLD_CONTRIB,
    RB_HI_R_PRE,
    RB_HI_RH,
    RB_HI_RH_PROD,
    RB_HI_Z_OUT,
    RB_HI_Z_PRE,
    RB_LO_G_PRE,
    RB_LO_H,
    RB_LO_NEW_CONTRIB,
    RB_LO_OLD_CONTRIB,
    RB_LO_R_PRE,
    RB_LO_RH,
    RB_LO_RH_PROD,
    RB_LO_Z_OUT,
    RB_LO_Z_PRE,
    RB_LUT_SHIFT_G,
    RB_LUT_SHIFT_R,
    RB_LUT_SHIFT_Z,
    RB_Q_1_IN_Z_SCALE,
    RB_SH_NEW_CONTRIB,
    RB_SH_NEW_CONTRIB_H,
    RB_SH_OLD_CONTRIB,
    RB_SH_OLD_CONTRIB_H,
    RB_SH_RH_G_PRE,
    RB_SH_RH_PROD,
    RB_SH_RH_R_PRE,
    RB_SH_RH_Z_PRE,
    RB_SH_WX_G_PRE,
    RB_SH_WX_R_PRE,
    RB_SH_WX_Z_PRE,
    RB_ZP_G_OUT,
    RB_ZP_G_PRE,
    RB_ZP_H,
    RB_ZP_NEW_CONTRIB,
    RB_ZP_OLD_CONTRIB,
    RB_ZP_R_OUT,
    RB_ZP_R_PRE,
    RB_ZP_RH,
    RB_ZP_RH_PROD,
    RB_ZP_WX,
    RB_ZP_Z_OUT,
    RB_ZP_Z_PRE,
    SH_NEW_CONTRIB,
    SH_NEW_CONTRIB_H,
    SH_OLD_CONTRIB,
    SH_OLD_CONTRIB_H,
    SH_RH_R_PRE,
    SH_RH_RH_ADD_BR,
    SH_RH_Z_PRE,
    SH_RRH,
    SH_RRH_G_PRE,
    SH_WX_G_PRE,
    SH_WX_R_PRE,
    SH_WX_Z_PRE,
    ZP_G_OUT,
    ZP_G_PRE,
    ZP_H,
    ZP_NEW_CONTRIB,
    ZP_OLD_CONTRIB,
    ZP_R_OUT,
    ZP_R_PRE,
    ZP_RH,
    ZP_RH_ADD_BR,
    ZP_RRH,
    ZP_WX,
    ZP_Z_OUT,
    ZP_Z_PRE,
)

UINDEX = np.uint32(0)  # the type of table indices


@register_jitable
def rshift_round(v, n):
    """v * 2^-n rounded half up: (v + 2^(n-1)) >> n for n > 0, v << -n otherwise.

    Written without a branch (one of the two shifts is 0, and so is the half for n <= 0) so that
    the compilers vectorise the cell across hidden units.
    """
    r = max(n, 0)
    half = shl(lane(min(r, 1), n), max(r - 1, 0))  # 2^(r-1), or 0 for r = 0
    return shr(lane(shl(lane(v, n), max(-n, 0)) + half, n), r)


def rshift_round_all(v: np.ndarray, n: np.ndarray) -> np.ndarray:
    """rshift_round of each element of the integer arrays `v` and `n` (per-channel constants,
    folded when a model is planned or exported: a plain loop, 3 ms where compiling one took 1.7 s
    of the first run)."""
    return np.array([rshift_round(int(a), int(b)) for a, b in zip(v, n)], np.int64)


@register_jitable
def clamp(v, lo, hi):
    return min(max(lane(v, lo), lo), hi)


@register_jitable
def rescale(v, n, zp, lo, hi):
    """Base operation 1 (Rescale): q_y = S_x/S_y * (q_x - Z_x) + Z_y, with (q_x - Z_x) = v."""
    return clamp(rshift_round(v, n) + zp, lo, hi)


@register_jitable
def lut_eval(table, u, shift):
    """Table lookup at u = q_in - qmin_in. shift = 0: the directly indexed exact table; shift > 0:
    linear interpolation between knots every 2^shift inputs."""
    i = shr(lane(u, shift), shift)
    f = u - shl(i, shift)
    # i >= 0: unsigned indices, for which numba adds no wraparound of negative ones
    a = table[lane(i, UINDEX)]
    return a + rshift_round((table[lane(i + 1, UINDEX)] - a) * f, shift)


@register_jitable
def gate_pre(q_Wx, zp_Wx, sh_Wx, q_Rh, zp_Rh, sh_Rh, CH, j, zp_pre, lo, hi):
    """A gate's pre-activation at channel j: Wx + Rh + bx + br, each term rescaled onto the
    pre-activation's grid, then added and saturated (z_pre and r_pre; the reset-before g_pre)."""
    return clamp(rshift_round(q_Wx - zp_Wx, sh_Wx)
                 + rshift_round(q_Rh - zp_Rh, sh_Rh)
                 + rshift_round(CH[CH_QBX, j], CH[CH_SH_BX, j])
                 + rshift_round(CH[CH_QBR, j], CH[CH_SH_BR, j])
                 + zp_pre, lo, hi)


@register_jitable
def gru_cell(q_Wx_z, q_Wx_r, q_Wx_g, acc_Rh_z, acc_Rh_r, acc_Rh_g, q_h_old, jz, jr, jg,
             P, CH, lut_z, lut_r, lut_g):
    """One hidden unit at one time step: z, r, g and h_new from the spec's integer formulas
    (docs/numerics.md, "Integer cell").

    q_Wx_*: Wx already rescaled to (S_Wx, Z_Wx); acc_Rh_*: the raw integer GEMM R @ q_h;
    jz, jr, jg: the unit's channel in each gate block. Returns every intermediate tensor.
    """
    zp_Wx = P[ZP_WX]
    zp_Rh = P[ZP_RH]
    # Rh rescale, with zero-point compensation: S_R[c] S_h / S_Rh (acc - R_sum_mul_h_zp[c]) + Z_Rh
    q_Rh_z = rescale(acc_Rh_z - CH[CH_R_SUM_MUL_H_ZP, jz], CH[CH_SH_R, jz], zp_Rh, P[LO_RH], P[HI_RH])
    q_Rh_r = rescale(acc_Rh_r - CH[CH_R_SUM_MUL_H_ZP, jr], CH[CH_SH_R, jr], zp_Rh, P[LO_RH], P[HI_RH])
    q_Rh_g = rescale(acc_Rh_g - CH[CH_R_SUM_MUL_H_ZP, jg], CH[CH_SH_R, jg], zp_Rh, P[LO_RH], P[HI_RH])

    # 1. update gate: z_pre = Wx_z + Rh_z + bx_z + br_z (each term rescaled, then added)
    q_z_pre = gate_pre(q_Wx_z, zp_Wx, P[SH_WX_Z_PRE], q_Rh_z, zp_Rh, P[SH_RH_Z_PRE], CH, jz,
                       P[ZP_Z_PRE], P[LO_Z_PRE], P[HI_Z_PRE])
    q_z = lut_eval(lut_z, q_z_pre - P[LO_Z_PRE], P[LUT_SHIFT_Z])

    # 2. reset gate
    q_r_pre = gate_pre(q_Wx_r, zp_Wx, P[SH_WX_R_PRE], q_Rh_r, zp_Rh, P[SH_RH_R_PRE], CH, jr,
                       P[ZP_R_PRE], P[LO_R_PRE], P[HI_R_PRE])
    q_r = lut_eval(lut_r, q_r_pre - P[LO_R_PRE], P[LUT_SHIFT_R])

    # 3. candidate gate: g = tanh(Wx_g + r * (Rh_g + br_g) + bx_g)
    q_Rh_add_br = clamp(rshift_round(q_Rh_g - zp_Rh, P[SH_RH_RH_ADD_BR])
                        + rshift_round(CH[CH_QBR, jg], CH[CH_SH_BR, jg])
                        + P[ZP_RH_ADD_BR], P[LO_RH_ADD_BR], P[HI_RH_ADD_BR])
    q_rRh = rescale((q_r - P[ZP_R_OUT]) * (q_Rh_add_br - P[ZP_RH_ADD_BR]), P[SH_RRH],
                    P[ZP_RRH], P[LO_RRH], P[HI_RRH])
    q_g_pre = clamp(rshift_round(q_Wx_g - zp_Wx, P[SH_WX_G_PRE])
                    + rshift_round(q_rRh - P[ZP_RRH], P[SH_RRH_G_PRE])
                    + rshift_round(CH[CH_QBX, jg], CH[CH_SH_BX, jg])
                    + P[ZP_G_PRE], P[LO_G_PRE], P[HI_G_PRE])
    q_g = lut_eval(lut_g, q_g_pre - P[LO_G_PRE], P[LUT_SHIFT_G])

    # 4. h_new = z * h_old + (1 - z) * g, with (1 - z) in z_out's own quantization
    q_old_contrib = rescale((q_z - P[ZP_Z_OUT]) * (q_h_old - P[ZP_H]), P[SH_OLD_CONTRIB],
                            P[ZP_OLD_CONTRIB], P[LO_OLD_CONTRIB], P[HI_OLD_CONTRIB])
    q_one_minus_z = clamp(P[Q_1_IN_Z_SCALE] - q_z + P[ZP_Z_OUT], P[LO_Z_OUT], P[HI_Z_OUT])
    q_new_contrib = rescale((q_one_minus_z - P[ZP_Z_OUT]) * (q_g - P[ZP_G_OUT]), P[SH_NEW_CONTRIB],
                            P[ZP_NEW_CONTRIB], P[LO_NEW_CONTRIB], P[HI_NEW_CONTRIB])
    q_h_new = clamp(rshift_round(q_old_contrib - P[ZP_OLD_CONTRIB], P[SH_OLD_CONTRIB_H])
                    + rshift_round(q_new_contrib - P[ZP_NEW_CONTRIB], P[SH_NEW_CONTRIB_H])
                    + P[ZP_H], P[LO_H], P[HI_H])
    return (q_Rh_z, q_Rh_r, q_Rh_g, q_z_pre, q_r_pre, q_g_pre, q_z, q_r, q_g, q_Rh_add_br,
            q_rRh, q_old_contrib, q_new_contrib, q_h_new)


# The reset-before cell (docs/numerics.md, "Integer cell, reset before"): R's g rows multiply
# rh = r * h_old, which needs every unit's r first, so a step is two passes over the units with
# the g rows' GEMM between them: gru_gates_reset_before for every unit, the GEMM
# acc_Rh_g = R_g @ q_rh, then gru_candidate_reset_before for every unit. P is in
# PARAMS_RESET_BEFORE's order (rescale.RB_*).


@register_jitable
def gru_gates_reset_before(q_Wx_z, q_Wx_r, acc_Rh_z, acc_Rh_r, q_h_old, jz, jr, P, CH, lut_z, lut_r):
    """z, r and rh = r * h_old of one hidden unit: (q_Rh_z, q_Rh_r, q_z_pre, q_r_pre, q_z, q_r, q_rh).
    acc_Rh_*: the raw integer GEMM R @ q_h of the z and r rows."""
    zp_Wx = P[RB_ZP_WX]
    zp_Rh = P[RB_ZP_RH]
    q_Rh_z = rescale(acc_Rh_z - CH[CH_R_SUM_MUL_H_ZP, jz], CH[CH_SH_R, jz], zp_Rh, P[RB_LO_RH], P[RB_HI_RH])
    q_Rh_r = rescale(acc_Rh_r - CH[CH_R_SUM_MUL_H_ZP, jr], CH[CH_SH_R, jr], zp_Rh, P[RB_LO_RH], P[RB_HI_RH])

    # 1. update gate: z_pre = Wx_z + Rh_z + bx_z + br_z (each term rescaled, then added)
    q_z_pre = gate_pre(q_Wx_z, zp_Wx, P[RB_SH_WX_Z_PRE], q_Rh_z, zp_Rh, P[RB_SH_RH_Z_PRE], CH, jz,
                       P[RB_ZP_Z_PRE], P[RB_LO_Z_PRE], P[RB_HI_Z_PRE])
    q_z = lut_eval(lut_z, q_z_pre - P[RB_LO_Z_PRE], P[RB_LUT_SHIFT_Z])

    # 2. reset gate
    q_r_pre = gate_pre(q_Wx_r, zp_Wx, P[RB_SH_WX_R_PRE], q_Rh_r, zp_Rh, P[RB_SH_RH_R_PRE], CH, jr,
                       P[RB_ZP_R_PRE], P[RB_LO_R_PRE], P[RB_HI_R_PRE])
    q_r = lut_eval(lut_r, q_r_pre - P[RB_LO_R_PRE], P[RB_LUT_SHIFT_R])

    # 3. rh = r * h_old onto rh's own grid: the input of the g rows' GEMM
    q_rh = rescale((q_r - P[RB_ZP_R_OUT]) * (q_h_old - P[RB_ZP_H]), P[RB_SH_RH_PROD],
                   P[RB_ZP_RH_PROD], P[RB_LO_RH_PROD], P[RB_HI_RH_PROD])
    return q_Rh_z, q_Rh_r, q_z_pre, q_r_pre, q_z, q_r, q_rh


@register_jitable
def gru_candidate_reset_before(q_Wx_g, acc_Rh_g, q_h_old, q_z, jg, P, CH, lut_g):
    """g and h_new of one hidden unit once acc_Rh_g = sum_k q_R[jg, k] q_rh[k] is known:
    (q_Rh_g, q_g_pre, q_g, q_old_contrib, q_new_contrib, q_h_new)."""
    zp_Rh = P[RB_ZP_RH]
    # R_g rh on Rh's grid: the compensation and shift of row jg are rh's (rescale.derive_reset_before)
    q_Rh_g = rescale(acc_Rh_g - CH[CH_R_SUM_MUL_H_ZP, jg], CH[CH_SH_R, jg], zp_Rh, P[RB_LO_RH], P[RB_HI_RH])

    # 4. candidate: g = tanh(Wx_g + R_g rh + bx_g + br_g)
    q_g_pre = gate_pre(q_Wx_g, P[RB_ZP_WX], P[RB_SH_WX_G_PRE], q_Rh_g, zp_Rh, P[RB_SH_RH_G_PRE], CH, jg,
                       P[RB_ZP_G_PRE], P[RB_LO_G_PRE], P[RB_HI_G_PRE])
    q_g = lut_eval(lut_g, q_g_pre - P[RB_LO_G_PRE], P[RB_LUT_SHIFT_G])

    # 5. h_new = z * h_old + (1 - z) * g, as the haste cell's
    q_old_contrib = rescale((q_z - P[RB_ZP_Z_OUT]) * (q_h_old - P[RB_ZP_H]), P[RB_SH_OLD_CONTRIB],
                            P[RB_ZP_OLD_CONTRIB], P[RB_LO_OLD_CONTRIB], P[RB_HI_OLD_CONTRIB])
    q_one_minus_z = clamp(P[RB_Q_1_IN_Z_SCALE] - q_z + P[RB_ZP_Z_OUT], P[RB_LO_Z_OUT], P[RB_HI_Z_OUT])
    q_new_contrib = rescale((q_one_minus_z - P[RB_ZP_Z_OUT]) * (q_g - P[RB_ZP_G_OUT]), P[RB_SH_NEW_CONTRIB],
                            P[RB_ZP_NEW_CONTRIB], P[RB_LO_NEW_CONTRIB], P[RB_HI_NEW_CONTRIB])
    q_h_new = clamp(rshift_round(q_old_contrib - P[RB_ZP_OLD_CONTRIB], P[RB_SH_OLD_CONTRIB_H])
                    + rshift_round(q_new_contrib - P[RB_ZP_NEW_CONTRIB], P[RB_SH_NEW_CONTRIB_H])
                    + P[RB_ZP_H], P[RB_LO_H], P[RB_HI_H])
    return q_Rh_g, q_g_pre, q_g, q_old_contrib, q_new_contrib, q_h_new
