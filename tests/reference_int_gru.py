"""An independent, slow reference of the specified integer GRU (docs/numerics.md) for tests.

It reads only each tensor's (bits, exp2_inv, zp) and the integer weights, and evaluates every
formula of the specification with exact rationals: q_y = round(S_x / S_y * (q_x - Z_x)) + Z_y, where
round(v) = floor(v + 1/2), clamped to the target's bits. It shares no code with qtool's engines
(not rescale.derive, not intops), so agreement checks the shift derivation and the kernels.
"""

from fractions import Fraction
from math import exp, floor, tanh


def S(t):
    """Scale of a per-tensor spec entry (or of channel c of a per-channel one)."""
    return Fraction(2) ** -int(t.exp2_inv)


def Sc(t, c):
    return Fraction(2) ** -int(t.exp2_inv[c])


def rnd(v: Fraction) -> int:
    return floor(v + Fraction(1, 2))


def sat(q: int, bits: int) -> int:
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, q))


def apply(func, x: Fraction) -> Fraction:
    """The activation `func` ("sigmoid", "tanh", "relu", "linear" or ("hard_sigmoid", alpha, beta))
    at x: exact for the piecewise-linear ones (alpha, beta as the float64 values they are)."""
    if isinstance(func, tuple):
        _, alpha, beta = func
        return min(max(Fraction(alpha) * x + Fraction(beta), Fraction(0)), Fraction(1))
    if func == "relu":
        return max(x, Fraction(0))
    if func == "linear":
        return x
    return Fraction(1.0 / (1.0 + exp(-float(x))) if func == "sigmoid" else tanh(float(x)))


def exact(func, q_in, src, dst):
    """Dequantize, apply, requantize (exact rounding; sigmoid and tanh in float64)."""
    return sat(rnd(apply(func, (q_in - src.zp) * S(src)) / S(dst)) + dst.zp, dst.bits)


def act(func, q_in, src, dst, index_bits=10):
    """Exact for inputs up to `index_bits` wide; wider inputs interpolate linearly between exact
    knots every 2^s inputs (s = bits - index_bits), the interpolation rounded exactly."""
    s = src.bits - index_bits
    if s <= 0:
        return exact(func, q_in, src, dst)
    qmin = -(1 << (src.bits - 1))
    i, f = divmod(q_in - qmin, 1 << s)
    a = exact(func, qmin + (i << s), src, dst)
    b = exact(func, qmin + ((i + 1) << s), src, dst)
    return a + rnd(Fraction((b - a) * f, 1 << s))


def functions(form) -> tuple:
    """The gate's and the candidate's activation of a qtool.core.model.CellForm, as `apply` takes them."""
    gate = "sigmoid" if form.gate == "sigmoid" else ("hard_sigmoid", form.gate_alpha, form.gate_beta)
    return gate, form.candidate


def cell_forward(cq, qx_seq):
    """qx_seq: list over t of list over n of list over k (ints). Returns q_h per t, n, j."""
    if not cq.form.reset_after:
        return cell_forward_reset_before(cq, qx_seq)
    f_gate, f_cand = functions(cq.form)
    sp = cq.spec
    H = cq.qR.shape[1]
    C = cq.qW.shape[1]
    N = len(qx_seq[0])
    h = [[sp["h"].zp] * H for _ in range(N)]
    out = []
    for qx in qx_seq:
        new_h = []
        for n in range(N):
            # Step 1/2: integer GEMMs and zero-point compensation, per channel c
            def gemm_rescale(q_w, q_in, src, w_spec, dst, c, width):
                acc = sum(int(q_w[c, k]) * q_in[k] for k in range(width))
                comp = src.zp * sum(int(q_w[c, k]) for k in range(width))
                return sat(rnd(Sc(w_spec, c) * S(src) / S(dst) * (acc - comp)) + dst.zp, dst.bits)

            Wx = [gemm_rescale(cq.qW, qx[n], sp["x"], sp["W"], sp["Wx"], c, C) for c in range(3 * H)]
            Rh = [gemm_rescale(cq.qR, h[n], sp["h"], sp["R"], sp["Rh"], c, H) for c in range(3 * H)]
            row = []
            for j in range(H):
                z_i, r_i, g_i = j, j + H, j + 2 * H

                def term(q, t, dst):  # S_t / S_dst * (q - Z_t), rounded
                    return rnd(S(t) / S(dst) * (q - t.zp))

                def bias(q, t, c, dst):
                    return rnd(Sc(t, c) / S(dst) * q)

                def pre(gate_i, dst, Wx=Wx, Rh=Rh):
                    return sat(term(Wx[gate_i], sp["Wx"], dst) + term(Rh[gate_i], sp["Rh"], dst)
                               + bias(int(cq.qbx[gate_i]), sp["bx"], gate_i, dst)
                               + bias(int(cq.qbr[gate_i]), sp["br"], gate_i, dst)
                               + dst.zp, dst.bits)

                q_z = act(f_gate, pre(z_i, sp["z_pre"]), sp["z_pre"], sp["z_out"])
                q_r = act(f_gate, pre(r_i, sp["r_pre"]), sp["r_pre"], sp["r_out"])
                Rab = sp["Rh_add_br"]
                q_Rab = sat(term(Rh[g_i], sp["Rh"], Rab) + bias(int(cq.qbr[g_i]), sp["br"], g_i, Rab)
                            + Rab.zp, Rab.bits)
                t = sp["rRh"]
                q_rRh = sat(rnd(S(sp["r_out"]) * S(Rab) / S(t) * (q_r - sp["r_out"].zp)
                                * (q_Rab - Rab.zp)) + t.zp, t.bits)
                gp = sp["g_pre"]
                q_g_pre = sat(term(Wx[g_i], sp["Wx"], gp) + term(q_rRh, t, gp)
                              + bias(int(cq.qbx[g_i]), sp["bx"], g_i, gp) + gp.zp, gp.bits)
                q_g = act(f_cand, q_g_pre, gp, sp["g_out"])
                zo, ho, oc, nc = sp["z_out"], sp["h"], sp["old_contrib"], sp["new_contrib"]
                q_old = sat(rnd(S(zo) * S(ho) / S(oc) * (q_z - zo.zp) * (h[n][j] - ho.zp)) + oc.zp,
                            oc.bits)
                q_1 = rnd(1 / S(zo)) + zo.zp
                q_omz = sat(q_1 - q_z + zo.zp, zo.bits)
                q_new = sat(rnd(S(zo) * S(sp["g_out"]) / S(nc) * (q_omz - zo.zp)
                                * (q_g - sp["g_out"].zp)) + nc.zp, nc.bits)
                row.append(sat(term(q_old, oc, ho) + term(q_new, nc, ho) + ho.zp, ho.bits))
            new_h.append(row)
        h = new_h
        out.append(h)
    return out


def cell_forward_reset_before(cq, qx_seq):
    """`cell_forward` of a reset-before cell: rh = r * h_old on rh's grid, R's g rows on rh,
    both biases of g onto g_pre (docs/numerics.md, "Integer cell, reset before")."""
    f_gate, f_cand = functions(cq.form)
    sp = cq.spec
    H, C = cq.qR.shape[1], cq.qW.shape[1]
    N = len(qx_seq[0])
    h = [[sp["h"].zp] * H for _ in range(N)]
    out = []

    def gemm_rescale(q_w, q_in, src, c, width):
        acc = sum(int(q_w[c, k]) * q_in[k] for k in range(width))
        comp = src.zp * sum(int(q_w[c, k]) for k in range(width))
        dst = sp["Rh"] if q_w is cq.qR else sp["Wx"]
        w_spec = sp["R"] if q_w is cq.qR else sp["W"]
        return sat(rnd(Sc(w_spec, c) * S(src) / S(dst) * (acc - comp)) + dst.zp, dst.bits)

    def term(q, t, dst):
        return rnd(S(t) / S(dst) * (q - t.zp))

    def bias(q, t, c, dst):
        return rnd(Sc(t, c) / S(dst) * q)

    def pre(c, Wx, Rh, dst):
        return sat(term(Wx[c], sp["Wx"], dst) + term(Rh, sp["Rh"], dst)
                   + bias(int(cq.qbx[c]), sp["bx"], c, dst) + bias(int(cq.qbr[c]), sp["br"], c, dst)
                   + dst.zp, dst.bits)

    def product(a, ta, b, tb, dst):
        return sat(rnd(S(ta) * S(tb) / S(dst) * (a - ta.zp) * (b - tb.zp)) + dst.zp, dst.bits)

    for qx in qx_seq:
        new_h = []
        for n in range(N):
            Wx = [gemm_rescale(cq.qW, qx[n], sp["x"], c, C) for c in range(3 * H)]
            Rh = [gemm_rescale(cq.qR, h[n], sp["h"], c, H) for c in range(2 * H)]
            q_z = [act(f_gate, pre(j, Wx, Rh[j], sp["z_pre"]), sp["z_pre"], sp["z_out"]) for j in range(H)]
            q_r = [act(f_gate, pre(j + H, Wx, Rh[j + H], sp["r_pre"]), sp["r_pre"], sp["r_out"]) for j in range(H)]
            q_rh = [product(q_r[j], sp["r_out"], h[n][j], sp["h"], sp["rh"]) for j in range(H)]
            row = []
            for j in range(H):
                g_i = j + 2 * H
                Rh_g = gemm_rescale(cq.qR, q_rh, sp["rh"], g_i, H)
                q_g = act(f_cand, pre(g_i, Wx, Rh_g, sp["g_pre"]), sp["g_pre"], sp["g_out"])
                zo, ho, oc, nc = sp["z_out"], sp["h"], sp["old_contrib"], sp["new_contrib"]
                q_old = product(q_z[j], zo, h[n][j], ho, oc)
                q_omz = sat(rnd(1 / S(zo)) + zo.zp - q_z[j] + zo.zp, zo.bits)
                q_new = product(q_omz, zo, q_g, sp["g_out"], nc)
                row.append(sat(term(q_old, oc, ho) + term(q_new, nc, ho) + ho.zp, ho.bits))
            new_h.append(row)
        h = new_h
        out.append(h)
    return out
