/* base/fp8: fp8 <-> float conversion (see fp8.h). */
#include "base/fp8.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

float fp8_table[FP8_FMT_COUNT][256];

const char *fp8_fmt_name(enum fp8_fmt f)
{
	return f == FP8_E4M3 ? "e4m3fn" : "e5m2";
}

float fp8_max(enum fp8_fmt f)
{
	return f == FP8_E4M3 ? 448.0f : 57344.0f;
}

/* The value table from the definition: (-1)^s * 2^(e-bias) * (1 + m/2^M) for e > 0,
 * (-1)^s * 2^(1-bias) * m/2^M for e = 0; the special codes as listed in fp8.h. */
__attribute__((constructor)) static void fp8_table_init(void)
{
	for (int f = 0; f < FP8_FMT_COUNT; f++) {
		int mb = f == FP8_E4M3 ? 3 : 2, eb = 7 - mb, bias = f == FP8_E4M3 ? 7 : 15;
		for (int c = 0; c < 256; c++) {
			int e = (c >> mb) & ((1 << eb) - 1), m = c & ((1 << mb) - 1);
			float v = e ? ldexpf(1.0f + (float)m / (float)(1 << mb), e - bias)
			            : ldexpf((float)m / (float)(1 << mb), 1 - bias);
			if (f == FP8_E4M3 && (c & 0x7f) == 0x7f)
				v = NAN;
			if (f == FP8_E5M2 && e == 31)
				v = m ? NAN : INFINITY;
			fp8_table[f][c] = (c & 0x80) ? -v : v;
		}
	}
}

/* ---- the array loops: one body, compiled three times ---- */

static inline __attribute__((always_inline)) uint8_t fp8_sat(float y, enum fp8_fmt f)
{
	uint32_t u, maxb = f == FP8_E4M3 ? 0x43e00000u : 0x47600000u; /* 448, 57344 */
	memcpy(&u, &y, 4);
	uint32_t a = u & 0x7fffffffu;
	a = (a > maxb && a <= 0x7f800000u) ? maxb : a; /* clamp; NaN passes */
	u = (u & 0x80000000u) | a;
	memcpy(&y, &u, 4);
	return fp8_from_f32(y, f);
}

#define FP8_LOOPS(sfx, attr)                                                                      \
	attr static void fp8_q_##sfx(uint8_t *q, const float *x, int64_t n, float s,              \
	                             const float *vs, enum fp8_fmt f)                               \
	{                                                                                          \
		if (f == FP8_E4M3) {                                                               \
			if (vs)                                                                    \
				for (int64_t i = 0; i < n; i++)                                    \
					q[i] = fp8_sat(x[i] * vs[i], FP8_E4M3);                    \
			else                                                                       \
				for (int64_t i = 0; i < n; i++)                                    \
					q[i] = fp8_sat(x[i] * s, FP8_E4M3);                        \
		} else {                                                                           \
			if (vs)                                                                    \
				for (int64_t i = 0; i < n; i++)                                    \
					q[i] = fp8_sat(x[i] * vs[i], FP8_E5M2);                    \
			else                                                                       \
				for (int64_t i = 0; i < n; i++)                                    \
					q[i] = fp8_sat(x[i] * s, FP8_E5M2);                        \
		}                                                                                  \
	}                                                                                          \
	attr static void fp8_dq_##sfx(float *out, const uint8_t *q, int64_t n, float mul,          \
	                              const float *tab)                                            \
	{                                                                                          \
		for (int64_t i = 0; i < n; i++)                                                    \
			out[i] = tab[q[i]] * mul;                                                  \
	}

FP8_LOOPS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))))
FP8_LOOPS(avx2, __attribute__((target("avx2,fma"))))
FP8_LOOPS(base, )

typedef void (*fp8_q_fn)(uint8_t *, const float *, int64_t, float, const float *, enum fp8_fmt);
typedef void (*fp8_dq_fn)(float *, const uint8_t *, int64_t, float, const float *);

static int fp8_level_now = -1;

/* Chosen once at load time (a constructor), so threads only ever read it. */
__attribute__((constructor)) static void fp8_level_init(void)
{
	int level;
	{
		__builtin_cpu_init();
		level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		                __builtin_cpu_supports("avx512vl")
		            ? 2
		        : __builtin_cpu_supports("avx2") ? 1
		                                         : 0;
		/* tests: force a lower level to compare the variants bit for bit */
		const char *e = getenv("CT_FP8_ISA");
		if (e && strcmp(e, "x86-64") == 0)
			level = 0;
		else if (e && strcmp(e, "avx2") == 0 && level > 1)
			level = 1;
	}
	fp8_level_now = level;
}

static int fp8_level(void)
{
	return fp8_level_now;
}

const char *fp8_isa(void)
{
	static const char *const names[] = {"x86-64", "avx2", "avx512"};
	return names[fp8_level()];
}

static void fp8_q(uint8_t *q, const float *x, int64_t n, float s, const float *vs,
                  enum fp8_fmt f)
{
	static const fp8_q_fn fns[] = {fp8_q_base, fp8_q_avx2, fp8_q_avx512};
	fns[fp8_level()](q, x, n, s, vs, f);
}

void fp8_dequantize(float *out, const uint8_t *q, int64_t n, float mul, enum fp8_fmt f)
{
	static const fp8_dq_fn fns[] = {fp8_dq_base, fp8_dq_avx2, fp8_dq_avx512};
	fns[fp8_level()](out, q, n, mul, fp8_table[f]);
}

void fp8_quantize(uint8_t *q, const float *x, int64_t n, float scale, enum fp8_fmt f)
{
	fp8_q(q, x, n, scale, NULL, f);
}

void fp8_quantize_vs(uint8_t *q, const float *x, int64_t n, const float *scales, enum fp8_fmt f)
{
	fp8_q(q, x, n, 0.0f, scales, f);
}

/* Values: in blocks through a small byte buffer on the stack. */
static void fp8_values(float *out, const float *x, int64_t n, float s, const float *vs,
                       enum fp8_fmt f)
{
	uint8_t buf[1024];
	for (int64_t i = 0; i < n; i += (int64_t)sizeof(buf)) {
		int64_t k = n - i < (int64_t)sizeof(buf) ? n - i : (int64_t)sizeof(buf);
		fp8_q(buf, x + i, k, s, vs ? vs + i : NULL, f);
		fp8_dequantize(out + i, buf, k, 1.0f, f);
	}
}

void fp8_quantize_values(float *out, const float *x, int64_t n, float scale, enum fp8_fmt f)
{
	fp8_values(out, x, n, scale, NULL, f);
}

void fp8_quantize_values_vs(float *out, const float *x, int64_t n, const float *scales,
                            enum fp8_fmt f)
{
	fp8_values(out, x, n, 0.0f, scales, f);
}
