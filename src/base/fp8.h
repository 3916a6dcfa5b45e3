/* base/fp8: the two OCP FP8 formats as torch names them, and conversion to and from float.
 *
 *   FP8_E4M3: torch.float8_e4m3fn. 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
 *             infinities; NaN only as S.1111.111 (0x7f / 0xff); largest finite 448;
 *             smallest subnormal 2^-9.
 *   FP8_E5M2: torch.float8_e5m2. 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like:
 *             infinity S.11111.00, NaN S.11111.{01,10,11}; largest finite 57344; smallest
 *             subnormal 2^-16.
 *
 * fp8_from_f32 is torch's plain cast (`x.to(float8)`): round to nearest even; NaN -> NaN
 * (0x7f | sign); out of range -> NaN for e4m3fn (it has no infinity), infinity for e5m2.
 * The saturating casts (fp8_quantize_*) are torchao's scaled cast: x*scale clamped to
 * [-max, max] first (infinity becomes +-max), NaN stays NaN, then the plain cast.
 * -0 keeps its sign in every cast.
 *
 * The array functions are compiled for AVX-512, AVX2 and plain x86-64 and picked at run time
 * (the loops are branch-free integer code plus one float multiply, so every variant gives
 * the same bits); they run on the calling thread (OpenMP above them is the caller's choice).
 */
#ifndef CT_BASE_FP8_H
#define CT_BASE_FP8_H

#include <stdint.h>
#include <string.h>

enum fp8_fmt { FP8_E4M3, FP8_E5M2, FP8_FMT_COUNT };

const char *fp8_fmt_name(enum fp8_fmt f); /* "e4m3fn", "e5m2" */
float fp8_max(enum fp8_fmt f);            /* 448, 57344 */

/* Plain (non-saturating) cast, round to nearest even. */
static inline uint8_t fp8_from_f32_fmt(float x, int mbits, int bias, uint32_t max_code,
                                       uint32_t over_code)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	uint32_t s = (u >> 24) & 0x80u, a = u & 0x7fffffffu, code;
	if (a > 0x7f800000u)
		return (uint8_t)(s | 0x7fu);
	if (a >= (uint32_t)(128 - bias) << 23) { /* |x| >= 2^(1-bias): a normal fp8 number */
		uint32_t odd = (a >> (23 - mbits)) & 1u;
		a = a - ((uint32_t)(127 - bias) << 23) + ((1u << (22 - mbits)) - 1u) + odd;
		code = a >> (23 - mbits);
	} else { /* subnormal: let a float add round |x| to a multiple of 2^(1-bias-mbits) */
		uint32_t mb = (uint32_t)(127 + 24 - bias - mbits) << 23;
		float magic, f;
		memcpy(&magic, &mb, 4);
		memcpy(&f, &a, 4);
		f += magic;
		memcpy(&code, &f, 4);
		code -= mb;
	}
	return (uint8_t)(s | (code > max_code ? over_code : code));
}

static inline uint8_t fp8_from_f32(float x, enum fp8_fmt f)
{
	return f == FP8_E4M3 ? fp8_from_f32_fmt(x, 3, 7, 0x7e, 0x7f)
	                     : fp8_from_f32_fmt(x, 2, 15, 0x7b, 0x7c);
}

/* Exact value of a code (a table filled at load time from the format's definition). */
extern float fp8_table[FP8_FMT_COUNT][256];
static inline float fp8_to_f32(uint8_t c, enum fp8_fmt f)
{
	return fp8_table[f][c];
}

/* Saturating scaled casts of x[0..n): q = cast(clamp(x * scale, -max, max)). */
void fp8_quantize(uint8_t *q, const float *x, int64_t n, float scale, enum fp8_fmt f);
/* The same with one scale per element (scales[i]); used for column-wise scales. */
void fp8_quantize_vs(uint8_t *q, const float *x, int64_t n, const float *scales,
                     enum fp8_fmt f);
/* Quantised values as floats (exact; no byte array): out = value(cast(clamp(x * scale))). */
void fp8_quantize_values(float *out, const float *x, int64_t n, float scale, enum fp8_fmt f);
void fp8_quantize_values_vs(float *out, const float *x, int64_t n, const float *scales,
                            enum fp8_fmt f);
/* out[i] = value(q[i]) * mul (mul = 1: the fp8 values themselves, exact). */
void fp8_dequantize(float *out, const uint8_t *q, int64_t n, float mul, enum fp8_fmt f);
/* The instruction set the array functions run with here: "avx512", "avx2" or "x86-64". */
const char *fp8_isa(void);

#endif
