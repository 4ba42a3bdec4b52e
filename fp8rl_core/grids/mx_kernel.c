/* MXFP8 quantization of [n, 32] blocks in one pass: the C twin of fp8rl_core/grids/mx.py.
 *
 * Each block of 32 elements is read once (bf16 or fp32), its amax and E8M0 scale byte computed, and
 * its 32 FP8 bytes and one scale byte written: one read of the input, one write of data and scales.
 * Every step is the bit-level rule mx.py documents (and the tests compare byte for byte):
 *   scale byte   e8m0_from_amax (rceil / floor / ceil / even), amax skipping NaN (fmaxf), NaN policy
 *   multiplier   2^(127 - byte) from bits (byte 0xFE -> 2^-127 subnormal, 0xFF -> NaN)
 *   element      sat_rne(fp32(x * multiplier)) with the round-to-nearest-even done in integers:
 *                normal results add 2^(s-1) - 1 + (kept lsb) to the fp32 bits and shift by s = 23 - mbits;
 *                results below the smallest normal are rounded by the FPU, adding a power of two big
 *                enough that the sum's ulp is the format's smallest subnormal (c10's Float8 cast does the
 *                same); overflow and Inf saturate to max; NaN becomes 0x7F with x's sign (0x7F for
 *                every element of a 0xFF block).
 * No library calls, no branches per element: written with GCC/Clang vector extensions (8 x 32-bit lanes),
 * which the compiler lowers to whatever SIMD the CPU has.
 * Compiled with -ffp-contract=off (no fused multiply-adds: the products must round as torch's do) and
 * must run with denormals enabled (no DAZ/FTZ, torch's default).
 */
#include <stdint.h>
#include <string.h>

typedef struct {
    int32_t mbits;       /* 3 (E4M3) or 2 (E5M2) */
    int32_t bias;        /* 7 or 15 */
    int32_t emax;        /* 8 or 15 */
    int32_t rule;        /* 0 rceil, 1 floor, 2 ceil, 3 even */
    int32_t propagate;   /* 1: a NaN makes the block's byte 0xFF */
    uint32_t max_bits;   /* fp32 bits of the largest finite element (448 or 57344) */
    float max_norm_rcp;  /* fp32(1 / max), TE's max_norm_rcp */
} mx_params;

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint32_t scale_byte(float amax, int anynan, const mx_params *p) {
    if (p->propagate && anynan) return 0xFF;
    if (p->rule == 0) { /* rceil */
        uint32_t d = bits_of(amax * p->max_norm_rcp);
        if (d > 0x7F800000u) return 0xFF;
        if (d == 0x7F800000u) return 0xFE;
        uint32_t exp = (d >> 23) & 0xFF, mant = d & 0x7FFFFF;
        int bump = mant > 0 && exp != 0xFE && !(exp == 0 && mant <= 0x400000);
        return exp + (uint32_t)bump;
    }
    uint32_t b = bits_of(amax);
    if (b > 0x7F800000u) return 0xFF;
    if (p->rule == 3) b = (b + (1u << (23 - p->mbits - 1))) & 0xFF800000u; /* even */
    int32_t exp = (int32_t)((b >> 23) & 0xFF) - 127;
    if (p->rule == 2) exp += (b & 0x7FFFFF) > 0; /* ceil */
    int32_t e = exp - p->emax;
    e = e < -127 ? -127 : (e > 128 ? 128 : e);
    return (uint32_t)(e + 127);
}

static float multiplier(uint32_t byte) {
    if (byte == 0xFF) return float_of(0x7FC00000u);
    if (byte == 0xFE) return float_of(0x00400000u); /* 2^-127 */
    return float_of((254 - byte) << 23);
}

/* GCC/Clang vector extensions: 8 lanes of 32 bits, lowered to AVX2/AVX-512 or SSE as the CPU has */
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef uint8_t u8x8 __attribute__((vector_size(8)));

static inline u32x8 pick(u32x8 mask, u32x8 a, u32x8 b) { return (mask & a) | (~mask & b); }
static inline u32x8 splat(uint32_t v) { return (u32x8){v, v, v, v, v, v, v, v}; }

/* 32 lanes holding values 0..255 -> 32 bytes in order */
#if defined(__AVX2__)
#include <immintrin.h>
static inline void store_bytes(const u32x8 *q, uint8_t *out) {
    __m256i p01 = _mm256_packus_epi32((__m256i)q[0], (__m256i)q[1]); /* per 128-bit lane: q0 q1 */
    __m256i p23 = _mm256_packus_epi32((__m256i)q[2], (__m256i)q[3]);
    __m256i b = _mm256_packus_epi16(p01, p23); /* dwords: q0[0:4] q1[0:4] q2[0:4] q3[0:4] q0[4:8] ... */
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, b);
}
#else
static inline void store_bytes(const u32x8 *q, uint8_t *out) {
    for (int j = 0; j < 4; j++) {
        u8x8 b = __builtin_convertvector(q[j], u8x8);
        memcpy(out + 8 * j, &b, 8);
    }
}
#endif

/* one block: v[32] fp32 as 4 x 8 lanes -> out[32] bytes, returns the scale byte */
static inline uint8_t block(const u32x8 *v, uint8_t *restrict out, const mx_params *restrict p) {
    const u32x8 abs_mask = splat(0x7FFFFFFFu), inf = splat(0x7F800000u);
    /* amax on the bits: |x| bits order as the values do; a NaN counts as 0 (skipped, as fmaxf) */
    u32x8 amax = splat(0), anynan = splat(0);
    for (int j = 0; j < 4; j++) {
        u32x8 a = v[j] & abs_mask;
        u32x8 isnan_ = (u32x8)(a > inf);
        anynan |= isnan_;
        a = a & ~isnan_;
        amax = pick((u32x8)(a > amax), a, amax);
    }
    uint32_t amax_bits = 0, nan_any = 0;
    for (int i = 0; i < 8; i++) {
        amax_bits = amax[i] > amax_bits ? amax[i] : amax_bits;
        nan_any |= anynan[i];
    }
    uint32_t byte = scale_byte(float_of(amax_bits), nan_any != 0, p);
    const f32x8 m = (f32x8){0} + multiplier(byte);
    const uint32_t s = 23 - p->mbits;
    const u32x8 min_normal = splat((uint32_t)(128 - p->bias) << 23);
    const u32x8 denorm = splat((uint32_t)(127 - p->bias + s + 1) << 23);
    const u32x8 rebias = splat(((uint32_t)(p->bias - 127) << 23) + (1u << (s - 1)) - 1);
    const u32x8 max_bits = splat(p->max_bits);
    /* a block whose multiplier is NaN gives +NaN everywhere (as torch's x * NaN does, even for a
       negative NaN x); elsewhere a NaN x keeps its sign */
    const u32x8 nan_block = splat(byte == 0xFF ? 0xFFFFFFFFu : 0);
    u32x8 q[4];
    for (int j = 0; j < 4; j++) {
        u32x8 sign = (v[j] >> 24) & splat(0x80) & ~nan_block;
        u32x8 nan = (u32x8)((v[j] & abs_mask) > inf) | nan_block;
        u32x8 a = (u32x8)((f32x8)v[j] * m) & abs_mask;
        a = pick((u32x8)(a > max_bits), max_bits, a); /* saturate: overflow, Inf -> max */
        u32x8 sub = (u32x8)((f32x8)a + (f32x8)denorm) - denorm;
        u32x8 norm = (a + rebias + ((a >> s) & splat(1))) >> s;
        q[j] = pick((u32x8)(a < min_normal), sub, norm);
        q[j] = pick(nan, splat(0x7F), q[j]) | sign;
    }
    store_bytes(q, out);
    return (uint8_t)byte;
}

void mx_quantize_f32(const float *x, int64_t nblocks, uint8_t *data, uint8_t *scales, const mx_params *p) {
    u32x8 v[4];
    for (int64_t b = 0; b < nblocks; b++) {
        memcpy(v, x + 32 * b, sizeof v);
        scales[b] = block(v, data + 32 * b, p);
    }
}

void mx_quantize_bf16(const uint16_t *x, int64_t nblocks, uint8_t *data, uint8_t *scales, const mx_params *p) {
    typedef uint16_t u16x8 __attribute__((vector_size(16)));
    u32x8 v[4];
    for (int64_t b = 0; b < nblocks; b++) {
        for (int j = 0; j < 4; j++) {
            u16x8 h;
            memcpy(&h, x + 32 * b + 8 * j, sizeof h);
            v[j] = __builtin_convertvector(h, u32x8) << 16; /* bf16 bits are fp32's upper half */
        }
        scales[b] = block(v, data + 32 * b, p);
    }
}
