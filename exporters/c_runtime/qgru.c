/* qgru runtime: see qgru.h. */
#include "qgru.h"

#if QGRU_DSP
#include <arm_acle.h>
#include <string.h>

/* four int8 values as one word: memcpy is one LDR on the target, at any alignment */
static inline int8x4_t read_s8x4(const int8_t *p)
{
    int8x4_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* bytes 1 and 3 of v, sign-extended into two 16-bit lanes, plus offset in each lane: SXTAB16
 * with ROR #8. GCC does not fold the rotate into SXTAB16 (clang does), so GCC gets the single
 * instruction as inline assembly, as CMSIS-NN does. */
static inline int16x2_t sxtab16_ror8(int16x2_t offset, int8x4_t v)
{
#if defined(__GNUC__) && !defined(__clang__)
    int16x2_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(offset), "r"(v));
    return r;
#else
    return __sxtab16(offset, (int8x4_t)(((uint32_t)v >> 8) | ((uint32_t)v << 24)));
#endif
}

static inline int16x2_t sxtb16_ror8(int8x4_t v)
{
#if defined(__GNUC__) && !defined(__clang__)
    int16x2_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
#else
    return __sxtb16((int8x4_t)(((uint32_t)v >> 8) | ((uint32_t)v << 24)));
#endif
}

/* CMSIS-NN's scheme: four inputs are loaded as one word and split into the 16-bit pairs
 * (v0, v2) and (v1, v3) with the input offset added in the same instruction (SXTAB16); each
 * weight word is split the same way (SXTB16) and two SMLADs accumulate the four products. The
 * three rows share the input pairs: per four columns, 3 + 3 x 5 instructions for 12 MACs. */
void qgru_dot3_s8_dsp(const int8_t *w, int32_t row_step, const int8_t *v, int32_t n,
                      int32_t v_offset, int32_t acc[3])
{
    const int8_t *w0 = w, *w1 = w + row_step, *w2 = w + 2 * row_step;
    const int16x2_t off = (int16x2_t)((uint32_t)(uint16_t)v_offset * 0x10001u);
    int32_t s0 = 0, s1 = 0, s2 = 0, k;
    /* pointers that advance and a count that runs down: no register spills in the loop */
    for (k = n >> 2; k > 0; k--) {
        const int8x4_t x = read_s8x4(v);
        const int16x2_t x02 = __sxtab16(off, x);
        const int16x2_t x13 = sxtab16_ror8(off, x);
        int8x4_t a = read_s8x4(w0);
        s0 = __smlad(__sxtb16(a), x02, s0);
        s0 = __smlad(sxtb16_ror8(a), x13, s0);
        a = read_s8x4(w1);
        s1 = __smlad(__sxtb16(a), x02, s1);
        s1 = __smlad(sxtb16_ror8(a), x13, s1);
        a = read_s8x4(w2);
        s2 = __smlad(__sxtb16(a), x02, s2);
        s2 = __smlad(sxtb16_ror8(a), x13, s2);
        v += 4;
        w0 += 4;
        w1 += 4;
        w2 += 4;
    }
    for (k = n & 3; k > 0; k--) {
        const int32_t x = *v++ + v_offset;
        s0 += *w0++ * x;
        s1 += *w1++ * x;
        s2 += *w2++ * x;
    }
    acc[0] = s0;
    acc[1] = s1;
    acc[2] = s2;
}
#endif

int qgru_check_platform(void)
{
    volatile int32_t minus_three = -3;
    volatile int64_t minus_three64 = -3;
    return ((minus_three >> 1) == -2 && (minus_three64 >> 1) == -2) ? 0 : 1;
}
