"""The integer semantics every layer type shares (docs/graph.md, "Integer semantics").

An edge's integers `q` stand for `(q - zp) * 2^-exp2_inv` on its grid (a TensorQ, as every GRU
tensor's). Weights are per output channel symmetric, `W ~ q_W * 2^-exp2_inv_W[c]`; a bias is held
at its accumulator's exponent `exp2_inv_x + exp2_inv_W[c]` on `bias` bits. A ratio of
power-of-two scales is a shift, rounded half up as in the GRU (qtool.numerics.intops):

    q_y = clamp(rshift_round(acc, exp2_inv_acc - exp2_inv_y) + zp_y, qmin_y, qmax_y)

Integers are int64 here, so no sum a layer makes can wrap (each module states its bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qtool.calibrators import make_observer
from qtool.core.qmodel import TensorQ
from qtool.numerics.qparams import choose_qparams, dequantize, qrange, quantize
from qtool.numerics.rescale import sum_mul_zp

EXACT_FLOAT32 = 1 << 24  # integer sums below this are exact in float32, so sgemm may compute them
EXACT_FLOAT = 1 << 53  # integer sums below this are exact in float64, so BLAS may compute them
GEMM_CHUNK_BYTES = 1 << 22  # a GEMM's rows and results taken at a time (to stay in cache while rescaled)


@dataclass(frozen=True)
class LayerBits:
    """The bits of a layer's weights, biases (its accumulator's grid) and activations."""

    weight: int = 8
    bias: int = 32
    activation: int = 8
    weight_method: str = "minmax"  # the range method of each output channel's weights (`weights`)


def rshift_round(v, n):
    """v * 2^-n rounded half up: (v + 2^(n-1)) >> n for n > 0, v << -n otherwise; `n` may be per
    channel (broadcast over the last axis). For |v| < 2^62 (every sum here), exactly so for any
    n: a shift right by 63 or more gives 0 (int64 shifts of 64 do not), and a shift left stops at
    +-2^62, beyond every grid, instead of wrapping (grids in E_MIN..E_MAX are up to 64 apart)."""
    v, n = np.asarray(v, np.int64), np.asarray(n, np.int64)
    r, left = np.clip(n, 0, 63), np.clip(-n, 0, 62)
    half = np.where(r > 0, np.left_shift(np.int64(1), np.maximum(r - 1, 0)), 0)
    if np.any(left > 0):  # only then can a value leave int64
        big = np.right_shift(np.int64(1 << 62), left)  # the largest |v| that shifts left within 2^62
        v = np.left_shift(np.where(left > 0, np.clip(v, -big, big), v), left)
    return np.right_shift(v + half, r)


def saturate(v, g: TensorQ) -> np.ndarray:
    lo, hi = qrange(g.bits)
    return np.clip(v, lo, hi)


def rescale(acc, n, g_out: TensorQ) -> np.ndarray:
    """Base operation Rescale: q_y = clamp(rshift_round(acc, n) + zp_y)."""
    return saturate(rshift_round(acc, n) + g_out.zp, g_out)


def same_grid(a: TensorQ, b: TensorQ) -> bool:
    return (a.bits, a.zp, int(a.exp2_inv)) == (b.bits, b.zp, int(b.exp2_inv))


def requantize(q, g_in: TensorQ, g_out: TensorQ) -> np.ndarray:
    """q from grid g_in onto g_out; the integers themselves where the grids agree."""
    if same_grid(g_in, g_out):
        return np.asarray(q, np.int64)
    return rescale(np.asarray(q, np.int64) - g_in.zp, int(g_in.exp2_inv) - int(g_out.exp2_inv), g_out)


def average(s, count, gx: TensorQ, gy: TensorQ) -> np.ndarray:
    """The mean `s / count` of integers on gx's grid (s a sum of q - zp_x) on gy's, rounded half
    up exactly: floor((2 s 2^d + n) / 2n), d = exp2_inv_y - exp2_inv_x (C: qlayers_average)."""
    d = int(gy.exp2_inv) - int(gx.exp2_inv)
    # |s| < count * 2^bits_x: below -(bits_x + 2) the result is 0, above bits_y + 1 + bitlen(count) it
    # saturates (or is 0), exactly as at those ends
    width = int(np.max(count)).bit_length()
    d = min(max(d, -(gx.bits + 2)), gy.bits + 1 + width)
    # 2 * s * 2^d + n needs about 2 * bitlen(count) + bits_x + bits_y + 3 bits: Python's integers
    # beyond int64 (windows of millions of steps at extreme grids), int64 otherwise
    kind = object if 2 * width + gx.bits + gy.bits + 3 > 62 else np.int64
    num = np.asarray(s, kind) * (1 << max(d, 0))
    n = np.asarray(count, kind) * (1 << max(-d, 0))
    return saturate(np.floor_divide(2 * num + n, 2 * n) + gy.zp, gy).astype(np.int64)


def weights(W: np.ndarray, bits: int, method: str = "minmax") -> tuple[np.ndarray, np.ndarray]:
    """Per output channel (axis 0) symmetric weights: (q_W, exp2_inv_W [C_out]), each channel's
    grid from its min and max, or from `method`'s observer of its values (mse: the grid of least
    squared error, clipping included), as a GRU's W and R take theirs."""
    rows = np.asarray(W, np.float64).reshape(W.shape[0], -1)
    exp2_inv_W = np.array([_row_exp2_inv(r, bits, method) for r in rows], np.int64)
    return quantize(rows, exp2_inv_W, 0, bits).reshape(W.shape), exp2_inv_W


def _row_exp2_inv(row: np.ndarray, bits: int, method: str) -> int:
    if method == "minmax" or not row.any():
        return choose_qparams(row.min(), row.max(), bits, True)[0]
    o = make_observer(method, "W")
    o.observe(row[None])
    return o.compute_params(bits, True)[0]


def bias(b: np.ndarray | None, exp2_inv_acc: np.ndarray, bits: int) -> np.ndarray:
    """The bias on its accumulator's grid (zeros where there is none)."""
    if b is None:
        return np.zeros(len(exp2_inv_acc), np.int64)
    return quantize(np.asarray(b, np.float64), exp2_inv_acc, 0, bits).astype(np.int64)


def gemm_params(W: np.ndarray, b: np.ndarray | None, g_x: TensorQ, g_y: TensorQ, bits: LayerBits) -> dict:
    """A dense or conv layer's integers: q_W, exp2_inv_W, q_b, W_sum_mul_x_zp and the per channel
    shift of its accumulator onto y's grid, sh_acc = exp2_inv_x + exp2_inv_W - exp2_inv_y."""
    q_W, exp2_inv_W = weights(W, bits.weight, bits.weight_method)
    exp2_inv_acc = exp2_inv_W + int(g_x.exp2_inv)
    return {"q_W": q_W, "exp2_inv_W": exp2_inv_W, "q_b": bias(b, exp2_inv_acc, bits.bias),
            "W_sum_mul_x_zp": sum_mul_zp(q_W.reshape(len(q_W), -1), g_x.zp), "sh_acc": exp2_inv_acc - int(g_y.exp2_inv)}


def fold_output_affine(node, a: np.ndarray, c: np.ndarray) -> bool:
    """Fold a per output channel affine `y * a + c` into a weighted layer (W's axis 0, b):
    W' = W * a, b' = b * a + c. A layer module's `fold_affine` (qtool.graph.passes.fold_batchnorm)."""
    W = np.asarray(node.params["W"], np.float64)
    b = np.asarray(node.params.get("b", np.zeros(W.shape[0])), np.float64)
    node.params = {"W": (W * a.reshape(-1, *[1] * (W.ndim - 1))).astype(np.float32),
                   "b": (b * a + c).astype(np.float32)}
    return True


def dequantized_weights(node, qp: dict, g_x: TensorQ):
    """`node` with its W and b replaced by what their integers stand for (a weighted layer's
    `forward_fq`): W per output channel on its own grid, b on the accumulator's."""
    import copy

    e_W = qp["exp2_inv_W"]
    W = dequantize(qp["q_W"].reshape(len(e_W), -1), e_W, 0).reshape(qp["q_W"].shape)
    out = copy.copy(node)
    out.params = {"W": W.astype(np.float64), "b": dequantize(qp["q_b"], e_W + int(g_x.exp2_inv), 0)}
    return out


def abs_max(q) -> int:
    """max |q| as a Python int (0 for an empty array)."""
    q = np.asarray(q)
    return max(-int(q.min()), int(q.max())) if q.size else 0


def gemm_dtype(bound: int) -> type:
    """The cheapest dtype in which a GEMM whose every partial sum is at most `bound` in magnitude
    is exact, whatever order BLAS sums in: float32 (sgemm) below 2^24, float64 below 2^53, int64
    (numpy's own loop) otherwise. For integer operands the bound is count * max|x| * max|W|: any
    partial sum is a sum of some of the products, so at most the sum of their magnitudes, and a
    float holds every integer below its bound, so each product and each addition (fused or not)
    is exact."""
    if bound < EXACT_FLOAT32:
        return np.float32
    return np.float64 if bound < EXACT_FLOAT else np.int64


def matmul(q_x: np.ndarray, q_W: np.ndarray) -> np.ndarray:
    """Exact `q_x @ q_W.T` over the last axis, in int64: through float32 or float64 BLAS while
    every partial sum is below 2^24 or 2^53 (gemm_dtype), in int64 otherwise."""
    q_x, q_W = np.asarray(q_x), np.asarray(q_W)
    dt = gemm_dtype(q_W.shape[1] * abs_max(q_x) * abs_max(q_W))
    return (q_x.astype(dt, copy=False) @ q_W.astype(dt, copy=False).T).astype(np.int64, copy=False)


def rescale_into(out: np.ndarray, acc: np.ndarray, add: np.ndarray, n: np.ndarray, g_out: TensorQ,
                 bound: int) -> None:
    """out[...] = rescale(acc + add, n, g_out), bit for bit, for an exact integer `acc` (int64,
    or a float holding integers of magnitude <= bound) and per channel `add` and `n` (the last
    axis). Where every n is in 0..62 rshift_round is (v + 2^(n-1)) >> n (no clamp, no left shift),
    so its half joins `add` and the sum is made in one pass (in float64 where acc + add is
    exact there), then shifted, offset and clamped in place; rescale itself otherwise."""
    add = np.asarray(add, np.int64)
    n = np.broadcast_to(np.asarray(n, np.int64), add.shape)
    if not np.all((n >= 0) & (n <= 62)):
        out[...] = rescale(np.asarray(acc).astype(np.int64, copy=False) + add, n, g_out)
        return
    add = add + np.where(n > 0, np.left_shift(np.int64(1), np.maximum(n - 1, 0)), 0)
    if acc.dtype.kind == "f" and bound + abs_max(add) < EXACT_FLOAT:
        np.add(acc, add, out=out, dtype=np.float64, casting="unsafe")
    else:
        np.add(acc.astype(np.int64, copy=False), add, out=out)
    np.right_shift(out, n, out=out)
    if g_out.zp:
        np.add(out, g_out.zp, out=out)
    np.clip(out, *qrange(g_out.bits), out=out)


def gemm_rescale(cols: np.ndarray, W: np.ndarray, add: np.ndarray, n: np.ndarray, g_out: TensorQ,
                 out: np.ndarray, bound: int) -> None:
    """out[...] = rescale(cols @ W.T + add, n, g_out) exactly, GEMM_CHUNK_BYTES of rows and results
    at a time along cols' first axis: cols [M, ..., K] may be any view (a window view is copied
    chunk by chunk into its GEMM's rows), W [C, K] is in the GEMM's dtype (gemm_dtype of a
    `bound` on every partial sum), out [M, ..., C] int64."""
    if not len(cols):
        return
    per = max(1, GEMM_CHUNK_BYTES // (cols[0].size * W.itemsize + out[0].size * (W.itemsize + 8) or 1))
    for i in range(0, len(cols), per):
        c = cols[i:i + per]
        o = out[i:i + per]
        if c.dtype != W.dtype:
            c = c.astype(W.dtype)
        rescale_into(o, (c.reshape(-1, W.shape[1]) @ W.T).reshape(o.shape), add, n, g_out, bound)


def table(f, g_in: TensorQ, g_out: TensorQ) -> np.ndarray:
    """The exact table of an elementwise function: for every input integer, f of its value
    rounded onto the output grid (index q_x - qmin_x)."""
    lo, hi = qrange(g_in.bits)
    v = dequantize(np.arange(lo, hi + 1), int(g_in.exp2_inv), g_in.zp).astype(np.float32)
    return quantize(np.asarray(f(v), np.float64), int(g_out.exp2_inv), g_out.zp, g_out.bits).astype(np.int64)


def lookup(tab: np.ndarray, q: np.ndarray, g_in: TensorQ) -> np.ndarray:
    return tab[np.asarray(q, np.int64) - qrange(g_in.bits)[0]]
