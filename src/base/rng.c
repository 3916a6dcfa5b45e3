#include "base/rng.h"

#include <math.h>

/* Philox4x32 round constants (multipliers and Weyl key increments). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void rng_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t sub, uint32_t out[4])
{
	/* The key mixes seed and stream; the 128-bit counter is (index, sub, stream high bits). */
	uint64_t k = seed ^ (stream * 0x9E3779B97F4A7C15ull);
	uint32_t k0 = (uint32_t)k, k1 = (uint32_t)(k >> 32);
	uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
	uint32_t c2 = sub, c3 = (uint32_t)(stream >> 32) ^ (uint32_t)stream;
	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
		uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n1 = (uint32_t)p1;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		uint32_t n3 = (uint32_t)p0;
		c0 = n0;
		c1 = n1;
		c2 = n2;
		c3 = n3;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

static double rng_u53(uint32_t hi, uint32_t lo)
{
	uint64_t bits = ((uint64_t)hi << 21) ^ (lo >> 11);
	return (double)(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t w[4];
	rng_philox(seed, stream, index, 0, w);
	return rng_u53(w[0], w[1]);
}

static double rng_normal_sub(uint64_t seed, uint64_t stream, uint64_t index, uint32_t sub)
{
	uint32_t w[4];
	rng_philox(seed, stream, index, sub, w);
	double u1 = rng_u53(w[0], w[1]);
	double u2 = rng_u53(w[2], w[3]);
	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
	return rng_normal_sub(seed, stream, index, 0);
}

double rng_trunc_normal(uint64_t seed, uint64_t stream, uint64_t index, double std, double lo,
                        double hi)
{
	for (uint32_t attempt = 0;; attempt++) {
		double x = std * rng_normal_sub(seed, stream, index, attempt);
		if (x >= lo && x <= hi)
			return x;
		if (attempt > 1000) /* bounds far inside the mass never get here */
			return x < lo ? lo : hi;
	}
}

uint64_t rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n)
{
	return (uint64_t)(rng_uniform(seed, stream, index) * (double)n) % n;
}

void rng_fill_normal(float *x, int64_t n, int64_t first, uint64_t seed, uint64_t stream,
                     double mean, double std)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)(mean + std * rng_normal(seed, stream, (uint64_t)(first + i)));
}

void rng_fill_trunc_normal(float *x, int64_t n, int64_t first, uint64_t seed, uint64_t stream,
                           double std, double lo, double hi)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)rng_trunc_normal(seed, stream, (uint64_t)(first + i), std, lo, hi);
}

uint64_t rng_stream_id(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		h ^= *p;
		h *= 0x100000001b3ull;
	}
	return h;
}
