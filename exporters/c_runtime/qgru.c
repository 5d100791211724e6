/* qgru runtime: see qgru.h. Every function mirrors its namesake in qtool/intops.py. */
#include "qgru.h"

int64_t qgru_rshift_round(int64_t v, int64_t n)
{
    /* one of the two shifts is 0, and so is the half for n <= 0; the left shift on unsigned
     * avoids UB for negative v */
    const int64_t r = n > 0 ? n : 0;
    const int64_t l = n < 0 ? -n : 0;
    return ((int64_t)((uint64_t)v << l) + (((int64_t)1 << r) >> 1)) >> r;
}

int64_t qgru_clamp(int64_t v, int64_t lo, int64_t hi)
{
    if (v < lo) {
        return lo;
    }
    if (v > hi) {
        return hi;
    }
    return v;
}

int64_t qgru_rescale(int64_t v, int64_t n, int64_t zp, int64_t lo, int64_t hi)
{
    return qgru_clamp(qgru_rshift_round(v, n) + zp, lo, hi);
}

int64_t qgru_lut_eval(const int16_t *table, int64_t u, int64_t shift)
{
    int64_t i = u >> shift;
    int64_t f = u - (i << shift);
    int64_t a = table[i];
    if (shift == 0) {
        return a; /* the exact table; f is 0 */
    }
    return a + qgru_rshift_round((table[i + 1] - a) * f, shift);
}

/* element idx of a bias table stored on 1, 2 or 4 bytes */
static int64_t load(const void *w, int32_t bytes, int32_t idx)
{
    if (bytes == 1) {
        return ((const int8_t *)w)[idx];
    }
    return bytes == 2 ? ((const int16_t *)w)[idx] : ((const int32_t *)w)[idx];
}

/* zero-point compensation of channel c; absent tables mean a zero point of 0 */
static int64_t comp(const int32_t *c32, const int64_t *c64, int32_t c)
{
    return c32 ? c32[c] : (c64 ? c64[c] : 0);
}

/* sum_k w[c][k] * v[k], in int32 when the exported bound allows it, else int64 */
static int64_t dot(const void *w, int32_t bytes, int32_t acc64, int32_t c, const int16_t *v,
                   int32_t n)
{
    int32_t k;
    if (!acc64) {
        int32_t s = 0;
        if (bytes == 1) {
            const int8_t *row = (const int8_t *)w + (int32_t)c * n;
            for (k = 0; k < n; k++) {
                s += (int32_t)row[k] * v[k];
            }
        } else {
            const int16_t *row = (const int16_t *)w + (int32_t)c * n;
            for (k = 0; k < n; k++) {
                s += (int32_t)row[k] * v[k];
            }
        }
        return s;
    } else {
        int64_t s = 0;
        if (bytes == 1) {
            const int8_t *row = (const int8_t *)w + (int32_t)c * n;
            for (k = 0; k < n; k++) {
                s += (int64_t)row[k] * v[k];
            }
        } else {
            const int16_t *row = (const int16_t *)w + (int32_t)c * n;
            for (k = 0; k < n; k++) {
                s += (int64_t)row[k] * v[k];
            }
        }
        return s;
    }
}

void qgru_cell_step(const qgru_cell_t *cell, const int16_t *x, int16_t *h, qgru_scratch_t scratch)
{
    const int32_t *P = cell->P;
    const int32_t H = cell->hidden_size;
    const int32_t C = cell->input_size;
    const int64_t zp_Wx = P[QGRU_ZP_WX];
    const int64_t zp_Rh = P[QGRU_ZP_RH];
    const int16_t *x_in = x, *h_in = h;
    int32_t c, j;

    if (cell->offset_inputs) { /* compensation by offset inputs, once per step (see qgru.h) */
        for (c = 0; c < C; c++) {
            scratch.x_off[c] = (int16_t)(x[c] - P[QGRU_ZP_X]);
        }
        for (j = 0; j < H; j++) {
            scratch.h_off[j] = (int16_t)(h[j] - P[QGRU_ZP_H]);
        }
        x_in = scratch.x_off;
        h_in = scratch.h_off;
    }
    for (c = 0; c < 3 * H; c++) {
        /* Wx rescale with zero-point compensation */
        int64_t acc = dot(cell->qW, cell->w_bytes, cell->acc64, c, x_in, C);
        scratch.q_Wx[c] = (int16_t)qgru_rescale(acc - comp(cell->W_sum_mul_x_zp32, cell->W_sum_mul_x_zp64, c),
                                                cell->sh_W[c], zp_Wx, P[QGRU_LO_WX], P[QGRU_HI_WX]);
        /* Rh: raw sums over the old state, before any unit is updated */
        scratch.acc_Rh[c] = dot(cell->qR, cell->r_bytes, cell->acc64, c, h_in, H);
    }
    for (j = 0; j < H; j++) {
        const int32_t jz = j, jr = j + H, jg = j + 2 * H;
        const int64_t q_Wx_z = scratch.q_Wx[jz], q_Wx_r = scratch.q_Wx[jr], q_Wx_g = scratch.q_Wx[jg];
        const int64_t comp_z = comp(cell->R_sum_mul_h_zp32, cell->R_sum_mul_h_zp64, jz);
        const int64_t comp_r = comp(cell->R_sum_mul_h_zp32, cell->R_sum_mul_h_zp64, jr);
        const int64_t comp_g = comp(cell->R_sum_mul_h_zp32, cell->R_sum_mul_h_zp64, jg);
        const int64_t q_h_old = h[j];
        int64_t q_Rh_z, q_Rh_r, q_Rh_g, q_z_pre, q_z, q_r_pre, q_r, q_Rh_add_br, q_rRh, q_g_pre, q_g;
        int64_t q_old_contrib, q_one_minus_z, q_new_contrib, q_h_new;

        q_Rh_z = qgru_rescale(scratch.acc_Rh[jz] - comp_z, cell->sh_R[jz], zp_Rh, P[QGRU_LO_RH], P[QGRU_HI_RH]);
        q_Rh_r = qgru_rescale(scratch.acc_Rh[jr] - comp_r, cell->sh_R[jr], zp_Rh, P[QGRU_LO_RH], P[QGRU_HI_RH]);
        q_Rh_g = qgru_rescale(scratch.acc_Rh[jg] - comp_g, cell->sh_R[jg], zp_Rh, P[QGRU_LO_RH], P[QGRU_HI_RH]);

        /* 1. update gate */
        q_z_pre = qgru_clamp(qgru_rshift_round(q_Wx_z - zp_Wx, P[QGRU_SH_WX_Z_PRE])
                             + qgru_rshift_round(q_Rh_z - zp_Rh, P[QGRU_SH_RH_Z_PRE])
                             + load(cell->b_pre, cell->b_bytes, jz)
                             + P[QGRU_ZP_Z_PRE], P[QGRU_LO_Z_PRE], P[QGRU_HI_Z_PRE]);
        q_z = qgru_lut_eval(cell->lut_z, q_z_pre - P[QGRU_LO_Z_PRE], P[QGRU_LUT_SHIFT_Z]);

        /* 2. reset gate */
        q_r_pre = qgru_clamp(qgru_rshift_round(q_Wx_r - zp_Wx, P[QGRU_SH_WX_R_PRE])
                             + qgru_rshift_round(q_Rh_r - zp_Rh, P[QGRU_SH_RH_R_PRE])
                             + load(cell->b_pre, cell->b_bytes, jr)
                             + P[QGRU_ZP_R_PRE], P[QGRU_LO_R_PRE], P[QGRU_HI_R_PRE]);
        q_r = qgru_lut_eval(cell->lut_r, q_r_pre - P[QGRU_LO_R_PRE], P[QGRU_LUT_SHIFT_R]);

        /* 3. candidate gate: g = tanh(Wx_g + r * (Rh_g + br_g) + bx_g) */
        q_Rh_add_br = qgru_clamp(qgru_rshift_round(q_Rh_g - zp_Rh, P[QGRU_SH_RH_RH_ADD_BR])
                                 + load(cell->b_Rh_add_br, cell->b_bytes, j)
                                 + P[QGRU_ZP_RH_ADD_BR], P[QGRU_LO_RH_ADD_BR], P[QGRU_HI_RH_ADD_BR]);
        q_rRh = qgru_rescale((q_r - P[QGRU_ZP_R_OUT]) * (q_Rh_add_br - P[QGRU_ZP_RH_ADD_BR]),
                             P[QGRU_SH_RRH], P[QGRU_ZP_RRH], P[QGRU_LO_RRH], P[QGRU_HI_RRH]);
        q_g_pre = qgru_clamp(qgru_rshift_round(q_Wx_g - zp_Wx, P[QGRU_SH_WX_G_PRE])
                             + qgru_rshift_round(q_rRh - P[QGRU_ZP_RRH], P[QGRU_SH_RRH_G_PRE])
                             + load(cell->b_pre, cell->b_bytes, jg)
                             + P[QGRU_ZP_G_PRE], P[QGRU_LO_G_PRE], P[QGRU_HI_G_PRE]);
        q_g = qgru_lut_eval(cell->lut_g, q_g_pre - P[QGRU_LO_G_PRE], P[QGRU_LUT_SHIFT_G]);

        /* 4. h_new = z * h_old + (1 - z) * g, (1 - z) in z_out's quantization */
        q_old_contrib = qgru_rescale((q_z - P[QGRU_ZP_Z_OUT]) * (q_h_old - P[QGRU_ZP_H]),
                                     P[QGRU_SH_OLD_CONTRIB], P[QGRU_ZP_OLD_CONTRIB],
                                     P[QGRU_LO_OLD_CONTRIB], P[QGRU_HI_OLD_CONTRIB]);
        q_one_minus_z = qgru_clamp(P[QGRU_Q_1_IN_Z_SCALE] - q_z + P[QGRU_ZP_Z_OUT], P[QGRU_LO_Z_OUT],
                                   P[QGRU_HI_Z_OUT]);
        q_new_contrib = qgru_rescale((q_one_minus_z - P[QGRU_ZP_Z_OUT]) * (q_g - P[QGRU_ZP_G_OUT]),
                                     P[QGRU_SH_NEW_CONTRIB], P[QGRU_ZP_NEW_CONTRIB],
                                     P[QGRU_LO_NEW_CONTRIB], P[QGRU_HI_NEW_CONTRIB]);
        q_h_new = qgru_clamp(qgru_rshift_round(q_old_contrib - P[QGRU_ZP_OLD_CONTRIB], P[QGRU_SH_OLD_CONTRIB_H])
                             + qgru_rshift_round(q_new_contrib - P[QGRU_ZP_NEW_CONTRIB], P[QGRU_SH_NEW_CONTRIB_H])
                             + P[QGRU_ZP_H], P[QGRU_LO_H], P[QGRU_HI_H]);
        h[j] = (int16_t)q_h_new;
    }
}

int qgru_check_platform(void)
{
    volatile int64_t minus_three = -3;
    return (minus_three >> 1) == -2 ? 0 : 1;
}
