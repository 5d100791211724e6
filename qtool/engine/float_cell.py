"""The float GRU cell of the simulator's reference, in float32, for the numba engines (CPU and
CUDA compile the same functions). It is qtool.numerics.float_gru's haste formulation, operation for
operation in the same order:

    z = sigmoid(Wx_z + Rh_z + bx_z + br_z)
    r = sigmoid(Wx_r + Rh_r + bx_r + br_r)
    g = tanh(Wx_g + r * (Rh_g + br_g) + bx_g)
    h = z * h_old + (1 - z) * g

The other cell forms (hard_sigmoid gates, relu and linear candidates, the reset gate before the
recurrent GEMM) are in the functions at the end, for kernels that run them.

Only the GEMMs' summation order and exp/tanh differ from numpy's float32 (by float32 rounding):
exp is Cephes' expf (a degree-6 polynomial after the reduction by ln 2, within 2 ulp), written
without branches so that the compiler vectorises the cell across hidden units, which a call to
the C library's expf would prevent.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from qtool.engine.simd import f32_from_bits

F = np.float32
ONE = F(1.0)


@register_jitable
def floor32(t):
    """floor(t) for float32 t within int32's range, as np.floor gives it; numba.cuda has no
    np.floor on the device. Truncation toward zero, one down where that went up."""
    f = F(np.int32(t))
    return f - ONE if f > t else f


@register_jitable
def exp32(x):
    """e^x in float32 for x in [-87, 88] (clamped outside, where sigmoid and tanh are flat)."""
    x = min(max(x, F(-87.0)), F(88.0))
    n = floor32(x * F(1.44269504) + F(0.5))
    r = x - n * F(0.693359375) - n * F(-2.12194440e-4)
    p = F(1.9875691500e-4)
    p = p * r + F(1.3981999507e-3)
    p = p * r + F(8.3334519073e-3)
    p = p * r + F(4.1665795894e-2)
    p = p * r + F(1.6666665459e-1)
    p = p * r + F(5.0000001201e-1)
    p = p * (r * r) + r + ONE
    return p * f32_from_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))


@register_jitable
def sigmoid32(v):
    return ONE / (ONE + exp32(-v))


@register_jitable
def tanh32(v):
    """Cephes' tanhf: an odd polynomial below |v| = 0.625, 1 - 2 / (e^2|v| + 1) above."""
    a = abs(v)
    z = v * v
    p = F(-5.70498872745e-3)
    p = p * z + F(2.06390887954e-2)
    p = p * z + F(-5.37397155531e-2)
    p = p * z + F(1.33314422036e-1)
    p = p * z + F(-3.33332819422e-1)
    small = p * z * v + v
    big = ONE - F(2.0) / (exp32(a + a) + ONE)
    big = big if v >= 0 else -big
    return small if a < F(0.625) else big


@register_jitable
def float_cell(Wx_z, Wx_r, Wx_g, Rh_z, Rh_r, Rh_g, h_old, bx_z, bx_r, bx_g, br_z, br_r, br_g):
    """One hidden unit at one time step; returns every intermediate tensor, in the order of
    the integer cell's outputs (Rh_z, Rh_r, Rh_g, z_pre, r_pre, g_pre, z, r, g, Rh_add_br, rRh,
    old_contrib, new_contrib, h)."""
    z_pre = Wx_z + Rh_z + bx_z + br_z
    r_pre = Wx_r + Rh_r + bx_r + br_r
    z = sigmoid32(z_pre)
    r = sigmoid32(r_pre)
    Rh_add_br = Rh_g + br_g
    rRh = r * Rh_add_br
    g_pre = Wx_g + rRh + bx_g
    g = tanh32(g_pre)
    old_contrib = z * h_old
    new_contrib = (ONE - z) * g
    h = old_contrib + new_contrib
    return (Rh_z, Rh_r, Rh_g, z_pre, r_pre, g_pre, z, r, g, Rh_add_br, rRh, old_contrib,
            new_contrib, h)


# The other cell forms (qtool.core.model.CellForm), by the codes of `form_codes`; the haste
# cell above stays as it is, the one the integer engines run beside their integers.
GATE_SIGMOID, GATE_HARD_SIGMOID = 0, 1
CANDIDATE_TANH, CANDIDATE_RELU, CANDIDATE_LINEAR = 0, 1, 2


def form_codes(form) -> tuple[int, np.float32, np.float32, int]:
    """(gate, alpha, beta, candidate) of a CellForm as the jitted functions below take them."""
    gate = GATE_HARD_SIGMOID if form.gate == "hard_sigmoid" else GATE_SIGMOID
    alpha, beta = (form.gate_alpha, form.gate_beta) if gate == GATE_HARD_SIGMOID else (0.0, 0.0)
    candidate = ("tanh", "relu", "linear").index(form.candidate)
    return gate, F(alpha), F(beta), candidate


@register_jitable
def gate32(v, gate, alpha, beta):
    """z's and r's activation: sigmoid, or hard_sigmoid clip(alpha v + beta, 0, 1)."""
    if gate == GATE_HARD_SIGMOID:
        return min(max(alpha * v + beta, F(0.0)), ONE)
    return sigmoid32(v)


@register_jitable
def candidate32(v, candidate):
    """g's activation: tanh, relu or linear."""
    if candidate == CANDIDATE_RELU:
        return max(v, F(0.0))
    if candidate == CANDIDATE_LINEAR:
        return v
    return tanh32(v)


@register_jitable
def float_gates(Wx_z, Wx_r, Rh_z, Rh_r, bx_z, bx_r, br_z, br_r, gate, alpha, beta):
    """z_pre, r_pre, z and r of one hidden unit at one time step, in any form."""
    z_pre = Wx_z + Rh_z + bx_z + br_z
    r_pre = Wx_r + Rh_r + bx_r + br_r
    return z_pre, r_pre, gate32(z_pre, gate, alpha, beta), gate32(r_pre, gate, alpha, beta)


@register_jitable
def float_candidate_reset_before(Wx_g, Rrh_g, h_old, z, bx_g, br_g, candidate):
    """The rest of a reset-before unit, once the GEMM `Rrh_g = R_g (r * h_old)` over every unit's
    r is done (so a kernel runs float_gates for all units, the GEMM, then this): g_pre, g,
    old_contrib, new_contrib, h."""
    g_pre = Wx_g + Rrh_g + bx_g + br_g
    g = candidate32(g_pre, candidate)
    old_contrib = z * h_old
    new_contrib = (ONE - z) * g
    return g_pre, g, old_contrib, new_contrib, old_contrib + new_contrib


@register_jitable
def float_cell_form(Wx_z, Wx_r, Wx_g, Rh_z, Rh_r, Rh_g, h_old, bx_z, bx_r, bx_g, br_z, br_r, br_g, form,
                    alpha_beta):
    """`float_cell` for a reset-after cell with other activations (hard_sigmoid gates, a relu or
    linear candidate; `form` [reset_before, gate, candidate] and `alpha_beta` as the engines'
    plans hold them): the same outputs in the same order."""
    z_pre, r_pre, z, r = float_gates(Wx_z, Wx_r, Rh_z, Rh_r, bx_z, bx_r, br_z, br_r, form[1], alpha_beta[0],
                                     alpha_beta[1])
    Rh_add_br = Rh_g + br_g
    rRh = r * Rh_add_br
    g_pre = Wx_g + rRh + bx_g
    g = candidate32(g_pre, form[2])
    old_contrib = z * h_old
    new_contrib = (ONE - z) * g
    return (Rh_z, Rh_r, Rh_g, z_pre, r_pre, g_pre, z, r, g, Rh_add_br, rRh, old_contrib, new_contrib,
            old_contrib + new_contrib)
