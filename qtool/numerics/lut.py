"""The cell's activations (sigmoid, hard_sigmoid, tanh, relu, linear) as integer tables, from one
quantized domain to another.

Inputs up to LUT_INDEX_BITS wide get the exact table, directly indexed (256 entries for int8).
Wider inputs get knots every 2^shift inputs, shift = bits_in - LUT_INDEX_BITS, evaluated by
linear interpolation in integers (`intops.lut_eval`); its max error against the exact table is
measured over every input and stored with the model.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from qtool.numerics.intops import lut_eval
from qtool.numerics.qparams import qrange, round_half_up

LUT_INDEX_BITS = 10  # 1025 knots for int16 inputs: 2 KiB per int16 table
# (table, function, input tensor, output tensor) of the three gates
GATES = (("lut_z", "sigmoid", "z_pre", "z_out"), ("lut_r", "sigmoid", "r_pre", "r_out"),
         ("lut_g", "tanh", "g_pre", "g_out"))


def sigmoid(v):
    with np.errstate(over="ignore"):  # exp(-v) overflows to inf for v << 0: sigmoid is 0 there
        return 1.0 / (1.0 + np.exp(-v))


FUNCS = {"sigmoid": sigmoid, "tanh": np.tanh, "relu": lambda v: np.maximum(v, 0.0), "linear": lambda v: v}


def hard_sigmoid_name(alpha: float, beta: float) -> str:
    """A hard_sigmoid's table function by name: `hard_sigmoid:0.2:0.5` (repr: exact round trip)."""
    return f"hard_sigmoid:{float(alpha)!r}:{float(beta)!r}"


def function(func: str):
    """The float64 function a table is built from, by name (FUNCS, or `hard_sigmoid_name`)."""
    if func.startswith("hard_sigmoid:"):
        alpha, beta = (float(v) for v in func.split(":")[1:])
        return lambda v: np.clip(alpha * np.asarray(v, np.float64) + beta, 0.0, 1.0)
    return FUNCS[func]


def cell_gates(form) -> tuple[tuple[str, str, str, str], ...]:
    """GATES for a cell of this form (qtool.core.model.CellForm): each table's function follows
    the form's gate and candidate activations. Every activation is an exact table (directly
    indexed up to LUT_INDEX_BITS inputs): hard_sigmoid, relu and linear need no other arithmetic."""
    gate = "sigmoid" if form.gate == "sigmoid" else hard_sigmoid_name(form.gate_alpha, form.gate_beta)
    return tuple((lut, gate if f == "sigmoid" else form.candidate, src, dst) for lut, f, src, dst in GATES)


def exact_outputs(func: str, q_in: np.ndarray, e_in: int, zp_in: int,
                  bits_out: int, e_out: int, zp_out: int) -> np.ndarray:
    """The correctly rounded, saturated output integer for each input integer."""
    x = np.ldexp(np.asarray(q_in, np.float64) - zp_in, -e_in)
    qmin, qmax = qrange(bits_out)
    return np.clip(round_half_up(np.ldexp(function(func)(x), e_out)) + zp_out, qmin, qmax).astype(np.int64)


def build_lut(func: str, bits_in: int, e_in: int, zp_in: int,
              bits_out: int, e_out: int, zp_out: int) -> tuple[np.ndarray, int, float]:
    """Return (table, shift, max_error_lsb) mapping q_in - qmin_in to q_out."""
    shift = max(0, bits_in - LUT_INDEX_BITS)
    qmin_in, _ = qrange(bits_in)
    knots = qmin_in + (np.arange((1 << (bits_in - shift)) + 1, dtype=np.int64) << shift)
    table = exact_outputs(func, knots, e_in, zp_in, bits_out, e_out, zp_out)
    q_all = np.arange(qmin_in, qmin_in + (1 << bits_in), dtype=np.int64)
    exact = exact_outputs(func, q_all, e_in, zp_in, bits_out, e_out, zp_out)
    approx = lut_values(table, shift, q_all - qmin_in)
    return table, shift, float(np.abs(approx - exact).max())


@njit(cache=True)
def lut_values(table, shift, u):
    """`lut_eval` at every u (1-D): what the engines compute, for measuring and for the layers'
    interpolated tables (qtool.layers.activation)."""
    out = np.empty(u.size, np.int64)
    for k in range(u.size):
        out[k] = lut_eval(table, u[k], shift)
    return out
