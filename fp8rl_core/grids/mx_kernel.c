/* MXFP8 quantization of [n, 32] blocks in one pass: the C twin of fp8rl_core/grids/mx.py.
 *
 * The blocks go W (the vector width: 16 or 8) at a time: their 32 elements each are read once (bf16 or
 * fp32) into registers and stack (L1), the W amaxes are taken by a transposed max reduction (one vector of
 * W maxima), the W E8M0 scale bytes and multipliers computed as one vector, then each block's 32 FP8 bytes and its scale byte
 * written: one read of the input, one write of data and scales, no scalar work per block.
 * Every step is the bit-level rule mx.py documents (and the tests compare byte for byte):
 *   scale byte   e8m0_from_amax (rceil / floor / ceil / even), amax skipping NaN (fmaxf), NaN policy
 *   multiplier   2^(127 - byte) from bits (byte 0xFE -> 2^-127 subnormal, 0xFF -> NaN)
 *   element      sat_rne(fp32(x * multiplier)) with the round-to-nearest-even done in integers:
 *                normal results add 2^(s-1) - 1 + (kept lsb) to the fp32 bits and shift by s = 23 - mbits;
 *                results below the smallest normal are rounded by the FPU, adding a power of two big
 *                enough that the sum's ulp is the format's smallest subnormal (c10's Float8 cast does the
 *                same); overflow and Inf saturate to max; NaN becomes 0x7F with x's sign (0x7F for
 *                every element of a 0xFF block).
 * No library calls, no branches per element: written with GCC/Clang vector extensions at the CPU's width
 * (16 x 32-bit lanes with AVX-512, else 8), which the compiler lowers to its SIMD instructions.
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


/* GCC/Clang vector extensions: W lanes of 32 bits, the CPU's native width (AVX-512: 16, else 8: wider
   generic vectors are lowered lane by lane on AVX2); a block is VPB = 32 / W vectors; the blocks go W at a
   time (a group), so the group's W amaxes and scale bytes are one vector */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define W 16
#else
#define W 8
#endif
#define VPB (32 / W)
#define INLINE static inline __attribute__((always_inline))
typedef uint32_t u32v __attribute__((vector_size(4 * W)));
typedef int32_t i32v __attribute__((vector_size(4 * W)));
typedef float f32v __attribute__((vector_size(4 * W)));
typedef uint16_t u16v __attribute__((vector_size(2 * W)));
typedef uint8_t u8v __attribute__((vector_size(W)));

INLINE u32v pick(u32v mask, u32v a, u32v b) { return (mask & a) | (~mask & b); }
INLINE u32v splat(uint32_t v) { return (u32v){0} + v; }
/* lanes hold values < 2^31, so the signed max is the unsigned one (one instruction on AVX2 and AVX-512) */
INLINE u32v vmax(u32v a, u32v b) { return (u32v)pick((u32v)((i32v)a > (i32v)b), a, b); }

/* a block's VPB vectors of lanes holding values 0..255 -> its 32 bytes in order */
#if W == 8 && defined(__AVX2__)
#include <immintrin.h>
INLINE void store_block(const u32v *q, uint8_t *out) { /* AVX2's byte packing (GCC lowers the generic one lane by lane) */
    __m256i p01 = _mm256_packus_epi32((__m256i)q[0], (__m256i)q[1]); /* per 128-bit lane: q0 q1 */
    __m256i p23 = _mm256_packus_epi32((__m256i)q[2], (__m256i)q[3]);
    __m256i b = _mm256_packus_epi16(p01, p23); /* dwords: q0[0:4] q1[0:4] q2[0:4] q3[0:4] q0[4:8] ... */
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, b);
}
#else
INLINE void store_block(const u32v *q, uint8_t *out) {
    for (int j = 0; j < VPB; j++) {
        u8v b = __builtin_convertvector(q[j], u8v);
        memcpy(out + W * j, &b, W);
    }
}
#endif

/* max of two vectors of blocks' partial maxima, each block's lanes halved: a holds blocks with 2n lanes
   each in order, b the next blocks; the result holds a's blocks, then b's, with n lanes each */
#if W == 16
#define HALVE_16(a, b) vmax(__builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23), \
                            __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
#define HALVE_8(a, b) vmax(__builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27), \
                           __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31))
#define HALVE_4(a, b) vmax(__builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29), \
                           __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31))
#define HALVE_2(a, b) vmax(__builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), \
                           __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31))
#else
#define HALVE_8(a, b) vmax(__builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11), \
                           __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15))
#define HALVE_4(a, b) vmax(__builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13), \
                           __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15))
#define HALVE_2(a, b) vmax(__builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14), \
                           __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15))
#endif

/* lane k: the largest of w[k]'s W lanes (all < 2^31), for W vectors w: a transposed reduction */
INLINE u32v maxima(u32v *w) {
    int n = W;
#if W == 16
    for (int i = 0; i < n / 2; i++) w[i] = HALVE_16(w[2 * i], w[2 * i + 1]);
    n /= 2;
#endif
    for (int i = 0; i < n / 2; i++) w[i] = HALVE_8(w[2 * i], w[2 * i + 1]);
    n /= 2;
    for (int i = 0; i < n / 2; i++) w[i] = HALVE_4(w[2 * i], w[2 * i + 1]);
    return HALVE_2(w[0], w[1]);
}

/* the amax bits (NaN skipped, as fmaxf: |x| bits order as the values do) and NaN flags (all-ones lanes)
   of the W blocks whose fp32 bits are v[VPB * k … VPB * k + VPB - 1] */
INLINE void group_amax(const u32v *v, u32v *amax, u32v *anynan) {
    const u32v abs_mask = splat(0x7FFFFFFFu), inf = splat(0x7F800000u);
    u32v clean[W], raw[W];
    for (int k = 0; k < W; k++) {
        clean[k] = raw[k] = splat(0);
        for (int j = 0; j < VPB; j++) {
            const u32v a = v[VPB * k + j] & abs_mask;
            clean[k] = vmax(clean[k], a & ~(u32v)((i32v)a > (i32v)inf));
            raw[k] = vmax(raw[k], a);
        }
    }
    *amax = maxima(clean);
    *anynan = (u32v)((i32v)maxima(raw) > (i32v)inf);
}

/* the scale bytes of W blocks from their amax bits (NaN skipped) and NaN flags (all-ones lanes), lane by
   lane: rceil from fp32(amax * max_norm_rcp) (exponent, +1 for a mantissa left, Inf -> 0xFE); floor, ceil
   and even from amax's exponent less emax, clamped to the E8M0 range; NaN -> 0xFF when propagated */
INLINE u32v scale_bytes(u32v amax, u32v anynan, const mx_params *p) {
    const u32v inf = splat(0x7F800000u);
    u32v byte;
    if (p->rule == 0) { /* rceil */
        u32v d = (u32v)((f32v)amax * ((f32v){0} + p->max_norm_rcp));
        u32v exp = (d >> 23) & splat(0xFF), mant = d & splat(0x7FFFFF);
        u32v bump = (u32v)(mant > splat(0)) & (u32v)(exp != splat(0xFE))
                    & ~((u32v)(exp == splat(0)) & (u32v)(mant <= splat(0x400000)));
        byte = exp + (bump & splat(1));
        byte = pick((u32v)(d == inf), splat(0xFE), byte);
        byte = pick((u32v)(d > inf), splat(0xFF), byte);
    } else {
        u32v b = amax;
        if (p->rule == 3) b = (b + splat(1u << (23 - p->mbits - 1))) & splat(0xFF800000u); /* even */
        i32v exp = (i32v)((b >> 23) & splat(0xFF)) - 127;
        if (p->rule == 2) exp += (i32v)((b & splat(0x7FFFFF)) > splat(0)) & 1; /* ceil */
        i32v e = exp - p->emax;
        e = (i32v)pick((u32v)(e < -127), (u32v)((i32v){0} - 127), (u32v)e);
        e = (i32v)pick((u32v)(e > 128), (u32v)((i32v){0} + 128), (u32v)e);
        byte = pick((u32v)(amax > inf), splat(0xFF), (u32v)(e + 127));
    }
    if (p->propagate) byte = pick(anynan, splat(0xFF), byte);
    return byte;
}

/* the fp32 bits of the multiplier 2^(127 - byte) for W scale bytes (0xFE -> 2^-127, a subnormal; 0xFF -> NaN) */
INLINE u32v multipliers(u32v byte) {
    u32v m = (splat(254) - byte) << 23;
    m = pick((u32v)(byte == splat(0xFE)), splat(0x00400000u), m);
    return pick((u32v)(byte == splat(0xFF)), splat(0x7FC00000u), m);
}

/* the per-format constants of the element rounding, set once per call */
typedef struct {
    u32v min_normal, denorm, rebias, max_bits, one;
    uint32_t s;
} consts;

INLINE consts consts_of(const mx_params *p) {
    const uint32_t s = 23 - p->mbits;
    return (consts){splat((uint32_t)(128 - p->bias) << 23), splat((uint32_t)(127 - p->bias + s + 1) << 23),
                    splat(((uint32_t)(p->bias - 127) << 23) + (1u << (s - 1)) - 1), splat(p->max_bits), splat(1), s};
}

/* one block: its fp32 bits v[VPB], its multiplier's bits and scale byte -> out[32] bytes */
INLINE void block(const u32v *v, uint32_t mult, uint32_t byte, uint8_t *restrict out, const consts *c) {
    const u32v abs_mask = splat(0x7FFFFFFFu), inf = splat(0x7F800000u);
    const f32v m = (f32v)splat(mult);
    /* a block whose multiplier is NaN gives +NaN everywhere (as torch's x * NaN does, even for a
       negative NaN x); elsewhere a NaN x keeps its sign */
    const u32v nan_block = splat(byte == 0xFF ? 0xFFFFFFFFu : 0);
    u32v q[VPB];
    for (int j = 0; j < VPB; j++) {
        u32v sign = (v[j] >> 24) & splat(0x80) & ~nan_block;
        u32v nan = (u32v)((i32v)(v[j] & abs_mask) > (i32v)inf) | nan_block;
        u32v a = (u32v)((f32v)v[j] * m) & abs_mask;
        a = pick((u32v)((i32v)a > (i32v)c->max_bits), c->max_bits, a); /* saturate: overflow, Inf -> max */
        u32v sub = (u32v)((f32v)a + (f32v)c->denorm) - c->denorm;
        u32v norm = (a + c->rebias + ((a >> c->s) & c->one)) >> c->s;
        q[j] = pick((u32v)((i32v)a < (i32v)c->min_normal), sub, norm);
        q[j] = pick(nan, splat(0x7F), q[j]) | sign;
    }
    store_block(q, out);
}

/* nb <= W blocks whose fp32 bits are v[VPB * k + j] (v zero past them): the scales first, as one vector,
   then the elements */
INLINE void group(const u32v *v, int nb, uint8_t *restrict data, uint8_t *restrict scales,
                  const mx_params *restrict p, const consts *c) {
    uint32_t mult[W], bytes[W];
    u32v av, nv;
    group_amax(v, &av, &nv);
    u32v byte = scale_bytes(av, nv, p), mv = multipliers(byte);
    memcpy(mult, &mv, sizeof mv);
    memcpy(bytes, &byte, sizeof byte);
    for (int k = 0; k < nb; k++) {
        block(v + VPB * k, mult[k], bytes[k], data + 32 * k, c);
        scales[k] = (uint8_t)bytes[k];
    }
}

void mx_quantize_f32(const float *x, int64_t nblocks, uint8_t *data, uint8_t *scales, const mx_params *p) {
    const consts c = consts_of(p);
    u32v v[W * VPB];
    for (int64_t b = 0; b < nblocks; b += W) {
        int nb = nblocks - b < W ? (int)(nblocks - b) : W;
        if (nb < W) memset(v, 0, sizeof v);
        memcpy(v, x + 32 * b, 128 * (size_t)nb);
        group(v, nb, data + 32 * b, scales + b, p, &c);
    }
}

void mx_quantize_bf16(const uint16_t *x, int64_t nblocks, uint8_t *data, uint8_t *scales, const mx_params *p) {
    const consts c = consts_of(p);
    u32v v[W * VPB];
    for (int64_t b = 0; b < nblocks; b += W) {
        int nb = nblocks - b < W ? (int)(nblocks - b) : W;
        if (nb < W) memset(v, 0, sizeof v);
        for (int j = 0; j < VPB * nb; j++) {
            u16v h;
            memcpy(&h, x + 32 * b + W * j, sizeof h);
            v[j] = __builtin_convertvector(h, u32v) << 16; /* bf16 bits are fp32's upper half */
        }
        group(v, nb, data + 32 * b, scales + b, p, &c);
    }
}

/* MXFP8 dequantization of [n, 32] blocks (rowwise): out = fp32(q) * scale, the C twin of mx.dequantize_mx.
 * fp32(q) is read from `lut` (the 256 values of the element format, converted by torch itself), `scales` are
 * the blocks' fp32 multipliers (mx.e8m0_to_scale); the one IEEE product per element rounds as torch's does
 * (-ffp-contract=off, denormals on), so the result is bit-identical to the PyTorch path. */
void mx_dequantize(const uint8_t *data, int64_t nblocks, const float *scales, const float *lut, float *out) {
    for (int64_t b = 0; b < nblocks; b++) {
        const float s = scales[b];
        const uint8_t *q = data + 32 * b;
        float *o = out + 32 * b;
        for (int j = 0; j < 32; j++) o[j] = lut[q[j]] * s;
    }
}
