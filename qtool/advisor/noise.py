"""The grid-aware prediction: every tensor's error power on qtool's actual grids, propagated
through the cell and over the time steps.

Each tensor's own error is that of its grid (step `2^-exp2_inv`, zero point, clipping range) on
the estimator's picture of its distribution, a bulk N(mu, sigma) within the observed range and
outliers at the absmax M carrying the energy the bulk does not explain:
- a tensor quantized directly (x, the LUT outputs) gets the exact error of the Gaussian on the
  grid: each level's cell, and the clipped tails, integrated in closed form;
- a sum of rescaled terms (Wx, Rh, z_pre, ..., h) is rounded once per term that reaches it
  through a right shift by n bits, `s^2 / 12 * (1 - 4^-n)` each (the discrete uniform error of
  dropping n bits), plus the Gaussian's clipped tails;
- outliers clipped by the grid (robust methods clip them) lose `share * (M - H)^2`;
- a 16-bit LUT adds its interpolation error, `max_error_lsb^2 / 3` output steps squared.

Errors then propagate to first order with independent errors (their powers add):
`W x` gets `sum_k dW^2 * E[x^2] + sum_k W^2 * N_x` per gate block (the weights' error is
exact); products `a * b` get `E[a^2] N_b + E[b^2] N_a`; the activations scale by
`E[f'(v)^2]` over the pre-activation's bulk N(mu, sigma): sigmoid and tanh by Gauss-Hermite,
hard_sigmoid by alpha^2 P(v in its linear part), relu by P(v > 0), linear by 1; clipping a LUT
input beyond the saturation bound costs nothing downstream. h starts exact (h0 = 0) and its
error is iterated over the T time steps, feeding R h and z * h; each tensor's prediction
averages the steps. The SNR is `10 log10(E[t^2] / N_t)`, E[t^2] the exact mean square over all values.

Each cell follows its form (qtool.core.model.CellForm). A reset-before cell has no Rh_add_br or
rRh: `rh = r * h_old` is a product (its own rounding on rh's grid), Rh's g block is `R_g rh`
(`dR_g^2 E[rh^2] + R_g^2 N_rh` and its rounding from rh's exponent) and g_pre adds Wx_g, that
block and both biases. A hard_sigmoid gate's outputs 0 and 1 are exact table entries: its own
error is the rounding of the linear part alone. A relu or linear candidate's g_out shares g_pre's
grid (its table is the identity): no error of its own, and the clipping on the way to g_pre
(Wx's, Rh's and g_pre's above its range; all of g_pre's for linear) travels on, since neither
saturates.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit

from qtool.calibrators.base import Observer
from qtool.calibrators.histogram import HistogramObserver
from qtool.calibrators.mse import grid_error
from qtool.calibrators.sampled import BulkStats
from qtool.core.qmodel import CellQuant
from qtool.numerics.lut import cell_gates
from qtool.numerics.qparams import dequantize, grid_range, qrange

GATES = ("z", "r", "g")
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(48)
_WEIGHTS = _WEIGHTS / math.sqrt(2.0 * math.pi)
MAX_CELLS = 512  # beyond this many levels under the bulk, s^2 / 12 per value is exact enough


@njit(cache=True)
def _phi(u: float) -> float:
    return math.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi) if abs(u) < 40.0 else 0.0


@njit(cache=True)
def _cdf(u: float) -> float:
    return 0.5 * (1.0 + math.erf(u / math.sqrt(2.0)))


@njit(cache=True)
def _partial(a: float, b: float, c: float, mu: float, sigma: float) -> float:
    """E[(x - c)^2; a < x < b] for x ~ N(mu, sigma) (a, b may be infinite)."""
    al, be = (a - mu) / sigma, (b - mu) / sigma
    mass = _cdf(be) - _cdf(al)
    if mass <= 0.0:
        return 0.0
    d = mu - c
    u_phi = (be * _phi(be) if math.isfinite(be) else 0.0) - (al * _phi(al) if math.isfinite(al) else 0.0)
    return sigma * sigma * (mass - u_phi) + 2.0 * sigma * d * (_phi(al) - _phi(be)) + d * d * mass


@njit(cache=True)
def gaussian_grid_error(mu: float, sigma: float, lo: float, hi: float, s: float, L: float, H: float
                        ) -> tuple[float, float]:
    """(rounding, clipping) parts of E[(x - Q(x))^2] for x ~ N(mu, sigma) restricted to the
    observed range [lo, hi]; Q is the grid of step s over [L, H] (levels k s), round half up,
    clamped at L and H."""
    if sigma <= 0.0:
        x = min(max(mu, lo), hi)
        if x > H or x < L:
            return 0.0, (x - min(max(x, L), H)) ** 2
        return (x - math.floor(x / s + 0.5) * s) ** 2, 0.0
    lo, hi = max(lo, mu - 12.0 * sigma), min(hi, mu + 12.0 * sigma)
    mass = _cdf((hi - mu) / sigma) - _cdf((lo - mu) / sigma)
    if mass <= 0.0 or hi <= lo:
        return 0.0, 0.0
    clip = 0.0
    if hi > H:
        clip += _partial(max(H, lo), hi, H, mu, sigma)
    if lo < L:
        clip += _partial(lo, min(L, hi), L, mu, sigma)
    a0, b0 = max(L, lo), min(H, hi)
    rnd = 0.0
    if b0 > a0:
        k0, k1 = math.floor(a0 / s), math.ceil(b0 / s)
        if k1 - k0 > MAX_CELLS:
            rnd = s * s / 12.0 * (_cdf((b0 - mu) / sigma) - _cdf((a0 - mu) / sigma))
        else:
            for k in range(k0, k1 + 1):
                c = k * s
                a, b = max(c - 0.5 * s, a0), min(c + 0.5 * s, b0)
                if b > a:
                    rnd += _partial(a, b, c, mu, sigma)
    return rnd / mass, clip / mass


def mean_square_slope(func: str, s: BulkStats) -> float:
    """E[f'(v)^2] for v ~ N(mu, sigma): how sigmoid/tanh scale an input error's power."""
    v = s.mu + s.sigma * _NODES
    if func == "sigmoid":
        with np.errstate(over="ignore"):  # exp(-v) overflows to inf for v << 0: sigmoid is 0 there
            y = 1.0 / (1.0 + np.exp(-v))
        d = y * (1.0 - y)
    else:
        d = 1.0 - np.tanh(v) ** 2
    return float(_WEIGHTS @ (d * d))


def _mass(s: BulkStats, a: float, b: float) -> float:
    """P(a < v < b) for v ~ N(mu, sigma) (a point mass at mu for sigma 0)."""
    if s.sigma <= 0.0:
        return 1.0 if a < s.mu < b else 0.0
    return _cdf((b - s.mu) / s.sigma) - _cdf((a - s.mu) / s.sigma)


def hard_sigmoid_params(func: str) -> tuple[float, float]:
    """(alpha, beta) of a table function named `hard_sigmoid:A:B` (qtool.numerics.lut)."""
    alpha, beta = (float(v) for v in func.split(":")[1:])
    return alpha, beta


def _linear_part(func: str) -> tuple[float, float, float]:
    """alpha and the pre-activations (lo, hi) between which hard_sigmoid is alpha v + beta."""
    alpha, beta = hard_sigmoid_params(func)
    return alpha, -beta / alpha, (1.0 - beta) / alpha


def activation_slope(func: str, s: BulkStats) -> float:
    """E[f'(v)^2] for v ~ N(mu, sigma), f a table function by name (qtool.numerics.lut.function):
    how the activation scales an input error's power."""
    if func in ("sigmoid", "tanh"):
        return mean_square_slope(func, s)
    if func == "linear":
        return 1.0
    if func == "relu":
        return _mass(s, 0.0, math.inf)
    if func.startswith("hard_sigmoid:"):
        alpha, lo, hi = _linear_part(func)
        return alpha * alpha * _mass(s, lo, hi)
    raise ValueError(f"no slope for the activation {func!r}")


def hard_gate_error(func: str, pre: BulkStats, out_stats: BulkStats, t) -> float:
    """A hard_sigmoid gate's own error on its output grid `t`: the outputs 0 and 1 (pre-activations
    beyond the linear part, by the pre-activation's bulk; each only where the output reached it)
    are single values, their error exact; the linear part rounds uniformly, s^2 / 12."""
    _, lo, hi = _linear_part(func)
    s = _step(t)
    L, H = grid_range(int(t.exp2_inv), int(t.zp), t.bits)
    p0 = _mass(pre, -math.inf, lo) if out_stats.lo <= 0.0 else 0.0
    p1 = _mass(pre, hi, math.inf) if out_stats.hi >= 1.0 else 0.0
    err = 0.0
    for y, p in ((0.0, p0), (1.0, p1)):
        err += p * (y - min(max(math.floor(y / s + 0.5) * s, L), H)) ** 2
    return err + max(1.0 - p0 - p1, 0.0) * s * s / 12.0


def _step(t) -> float:
    return math.ldexp(1.0, -int(t.exp2_inv))


@lru_cache(maxsize=1 << 16)
def _gaussian(s: BulkStats, e: int, zp: int, bits: int) -> tuple[float, float]:
    L, H = grid_range(e, zp, bits)
    return gaussian_grid_error(s.mu, s.sigma, s.lo, s.hi, math.ldexp(1.0, -e), L, H)


def histogram_error(o: HistogramObserver, e: int, zp: int, bits: int) -> tuple[float, float]:
    """(rounding, clipping) mean squared error of an observed histogram on a grid, with the
    density uniform inside each bin (the error the mse method minimises, `calibrators/mse.py`)."""
    h = o.hist
    counts = h.counts.astype(np.float64)
    qmin, qmax = qrange(bits)
    total = grid_error(counts, h.start, h.w, e, zp, qmin, qmax)
    L, H = grid_range(e, zp, bits)
    a = (h.start + np.arange(counts.size)) * 2.0**h.w
    b = a + 2.0**h.w
    beyond = (np.clip(b - H, 0, None) ** 3 - np.clip(a - H, 0, None) ** 3
              + np.clip(L - a, 0, None) ** 3 - np.clip(L - b, 0, None) ** 3) / 3.0
    clip = float(counts @ (beyond / (b - a)))
    n = counts.sum()
    return max(total - clip, 0.0) / n, clip / n


def grid_error_of(t, s: BulkStats, o: Observer | None = None) -> tuple[float, float]:
    """(rounding, clipping) error of a tensor on its grid: on its calibration histogram when
    there is one (`o`), else on its bulk Gaussian."""
    e, zp = int(t.exp2_inv), int(t.zp)
    if isinstance(o, HistogramObserver) and not o.empty:
        return histogram_error(o, e, zp, t.bits)
    return _gaussian(s, e, zp, t.bits)


def clip_above_of(t, s: BulkStats, o: Observer | None = None) -> float:
    """The part of `grid_error_of`'s clipping above the grid's top: values beyond H."""
    _, H = grid_range(int(t.exp2_inv), int(t.zp), t.bits)
    if isinstance(o, HistogramObserver) and not o.empty:
        h = o.hist
        counts = h.counts.astype(np.float64)
        a = (h.start + np.arange(counts.size)) * 2.0**h.w
        b = a + 2.0**h.w
        beyond = (np.clip(b - H, 0, None) ** 3 - np.clip(a - H, 0, None) ** 3) / 3.0
        return float(counts @ (beyond / (b - a))) / counts.sum()
    if s.sigma <= 0.0:
        x = min(max(s.mu, s.lo), s.hi)
        return (x - H) ** 2 if x > H else 0.0
    lo, hi = max(s.lo, s.mu - 12.0 * s.sigma), min(s.hi, s.mu + 12.0 * s.sigma)
    mass = _cdf((hi - s.mu) / s.sigma) - _cdf((lo - s.mu) / s.sigma)
    if mass <= 0.0 or hi <= max(H, lo):
        return 0.0
    return _partial(max(H, lo), hi, H, s.mu, s.sigma) / mass


# (tensor name, its TensorQ) -> (rounding, clipping); with above=True, the clipping above the
# grid's top alone (a float)
OwnError = Callable[..., tuple[float, float]]


def _rescale(out, *terms) -> float:
    """Rounding error of a sum whose terms (exponents) are shifted onto `out`'s grid."""
    s2 = _step(out) ** 2 / 12.0
    err = 0.0
    for e in terms:
        n = np.asarray(e, np.int64) - int(out.exp2_inv)  # right shift by n where n > 0
        err += float(np.mean(np.where(n > 0, s2 * (1.0 - 4.0 ** -np.maximum(n, 0).astype(float)), 0.0)))
    return err


@dataclass
class WeightTerms:
    """Per gate block: mean over rows of sum_k dW^2 (the weights' error) and of sum_k W^2."""

    err2: np.ndarray  # [3]
    sq: np.ndarray    # [3]

    @classmethod
    def of(cls, w: np.ndarray, q: np.ndarray, e) -> WeightTerms:
        dw = dequantize(q, e, 0) - w
        rows = w.shape[0] // 3
        blocks = lambda a: np.array([np.sum(a[k * rows:(k + 1) * rows] ** 2) / rows for k in range(3)])  # noqa: E731
        return cls(blocks(dw), blocks(w.astype(np.float64)))


def _lut(cq: CellQuant, lut: str, out) -> float:
    """Interpolation error of a LUT with a wide input (RMS of a max error e: e / sqrt(3)); a
    directly indexed table is exact, its stored max error 0."""
    return cq.lut_error[lut] ** 2 / 3.0 * _step(out) ** 2


def predict_cell(cq: CellQuant, w: WeightTerms, r: WeightTerms, st: dict[str, BulkStats],
                 n_x: float | None, steps: int, grid: OwnError) -> dict[str, tuple[float, float]]:
    """(signal power, predicted error power) of every traced tensor of one cell, averaged over
    `steps` time steps, given the error power `n_x` of its input (None: the input is the
    model's, quantized on x's grid). `grid(name, t)` is a tensor's own error on its grid. The
    cell's form (`cq.form`) sets the propagation (the module's docstring)."""
    form = cq.form
    reset_after = form.reset_after
    saturates = form.candidate == "tanh"  # relu and linear: g_out is g_pre's grid, nothing saturates
    sp = cq.spec
    P = {k: v.mean_square for k, v in st.items()}
    n_x_clip = 0.0
    if n_x is None:  # the model's input: its own grid; its clipped values only feed the LUTs
        n_x, n_x_clip = grid("x", sp["x"])
    terms = {"Wx": (sp["W"].exp2_inv + int(sp["x"].exp2_inv),),
             "Rh": (sp["R"].exp2_inv + int(sp["h"].exp2_inv),),
             "z_pre": (sp["Wx"].exp2_inv, sp["Rh"].exp2_inv, sp["bx"].exp2_inv, sp["br"].exp2_inv),
             "r_pre": (sp["Wx"].exp2_inv, sp["Rh"].exp2_inv, sp["bx"].exp2_inv, sp["br"].exp2_inv)}
    if reset_after:
        terms.update({"g_pre": (sp["Wx"].exp2_inv, sp["rRh"].exp2_inv, sp["bx"].exp2_inv),
                      "Rh_add_br": (sp["Rh"].exp2_inv, sp["br"].exp2_inv),
                      "rRh": (int(sp["r_out"].exp2_inv) + int(sp["Rh_add_br"].exp2_inv),)})
    else:
        terms.update({"g_pre": (sp["Wx"].exp2_inv, sp["Rh"].exp2_inv, sp["bx"].exp2_inv, sp["br"].exp2_inv),
                      "rh": (int(sp["r_out"].exp2_inv) + int(sp["h"].exp2_inv),)})
    terms.update({"old_contrib": (int(sp["z_out"].exp2_inv) + int(sp["h"].exp2_inv),),
                  "new_contrib": (int(sp["z_out"].exp2_inv) + int(sp["g_out"].exp2_inv),),
                  "h": (sp["old_contrib"].exp2_inv, sp["new_contrib"].exp2_inv)})
    rnd = {name: _rescale(sp[name], *exps) for name, exps in terms.items()}
    if not reset_after:  # Rh per gate block: R's g rows multiply rh, on rh's grid
        e_R = np.asarray(sp["R"].exp2_inv, np.int64)
        H = e_R.size // 3
        rnd_Rh = np.array([_rescale(sp["Rh"], e_R[k * H:(k + 1) * H] + int(sp[src].exp2_inv))
                           for k, src in enumerate(("h", "h", "rh"))])
    # Clipping is counted in each tensor's own SNR. A value clipped on the grid of the input,
    # of a LUT input or of a tensor that only feeds one (Wx, Rh, Rh_add_br, rRh) is far out
    # where sigmoid and tanh are flat, so that error does not travel on; every other error does
    # (rh's too: R_g's GEMM reads it). A relu or linear candidate does not saturate: the clipping
    # on g's way travels to g_out.
    clip = {name: grid(name, sp[name])[1] for name in terms}
    funcs = dict(zip(GATES, (f for _, f, _, _ in cell_gates(form))))
    for g in GATES:
        out = sp[f"{g}_out"]
        if g == "g" and not saturates:  # the identity table on g_pre's grid: exact
            own = 0.0
        elif funcs[g].startswith("hard_sigmoid:"):
            own = hard_gate_error(funcs[g], st[f"{g}_pre"], st[f"{g}_out"], out)
        else:
            own = sum(grid(f"{g}_out", out))
        rnd[f"{g}_out"] = own + _lut(cq, f"lut_{g}", out)
    slope = {g: activation_slope(funcs[g], st[f"{g}_pre"]) for g in GATES}
    g_clip_out = 0.0  # g_pre's clipping that reaches g_out as it is (relu: above; linear: all)
    if not saturates:
        g_clip_out = grid("g_pre", sp["g_pre"], above=True) if form.candidate == "relu" else clip["g_pre"]
    p_1mz = 1.0 - 2.0 * st["z_out"].mean + P["z_out"]
    p_h_minus_g = max(P["h"] + P["g_out"] - 2.0 * st["h"].mean * st["g_out"].mean, 0.0)
    total: dict[str, float] = {}
    n_h = 0.0  # h0 = 0 is exact
    for _ in range(steps):
        N = {"x": n_x + n_x_clip}
        wx = w.err2 * P["x"] + w.sq * n_x + rnd["Wx"]  # per gate block, what travels on
        wx_clip = w.sq * n_x_clip + clip["Wx"]  # and what stays
        into = {}
        if reset_after:
            rh = r.err2 * P["h"] + r.sq * n_h + rnd["Rh"]
            N["Wx"], N["Rh"] = float(np.mean(wx + wx_clip)), float(np.mean(rh)) + clip["Rh"]
            rab = rh[2] + rnd["Rh_add_br"]
            N["Rh_add_br"] = rab + clip["Rh_add_br"]
        else:
            rh = r.err2 * np.array([P["h"], P["h"], 0.0]) + r.sq * n_h + rnd_Rh  # the z and r blocks
        for k, g in enumerate(GATES[:2]):
            into[g] = wx[k] + rh[k] + rnd[f"{g}_pre"]
            N[f"{g}_out"] = slope[g] * into[g] + rnd[f"{g}_out"]
        if reset_after:
            rrh = P["r_out"] * rab + P["Rh_add_br"] * N["r_out"] + rnd["rRh"]
            N["rRh"] = rrh + clip["rRh"]
            into["g"] = wx[2] + rrh + rnd["g_pre"]
            on_way = clip["Rh"] + clip["Rh_add_br"] + clip["rRh"]
        else:
            N["rh"] = P["r_out"] * n_h + P["h"] * N["r_out"] + rnd["rh"] + clip["rh"]
            rh[2] = r.err2[2] * P["rh"] + r.sq[2] * N["rh"] + rnd_Rh[2]  # R_g rh
            N["Wx"], N["Rh"] = float(np.mean(wx + wx_clip)), float(np.mean(rh)) + clip["Rh"]
            into["g"] = wx[2] + rh[2] + rnd["g_pre"]
            on_way = clip["Rh"]
        if saturates:
            N["g_out"] = slope["g"] * into["g"] + rnd["g_out"]
        else:
            N["g_out"] = slope["g"] * (into["g"] + wx_clip[2] + on_way) + g_clip_out + rnd["g_out"]
        for k, g in enumerate(GATES):
            N[f"{g}_pre"] = into[g] + wx_clip[k] + clip[f"{g}_pre"]
        N["old_contrib"] = P["z_out"] * n_h + P["h"] * N["z_out"] + rnd["old_contrib"] + clip["old_contrib"]
        N["new_contrib"] = p_1mz * N["g_out"] + P["g_out"] * N["z_out"] + rnd["new_contrib"] + clip["new_contrib"]
        n_h = min(P["z_out"] * n_h + p_1mz * N["g_out"] + p_h_minus_g * N["z_out"] + rnd["old_contrib"]
                  + clip["old_contrib"] + rnd["new_contrib"] + clip["new_contrib"] + rnd["h"] + clip["h"],
                  P["h"] or math.inf)
        N["h"] = n_h
        for k, v in N.items():
            total[k] = total.get(k, 0.0) + v
    return {k: (P.get(k, 0.0), total[k] / max(steps, 1)) for k in total}


def snr_db(power: float, noise: float) -> float:
    if noise <= 0.0:
        return math.inf
    if power <= 0.0:
        return -math.inf
    return 10.0 * math.log10(power / noise)
