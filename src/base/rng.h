/* base/rng: counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
 *
 * A value is a pure function of (seed, stream, index): element i of tensor t draws from
 * counter (i, attempt) under key (seed, t). So the same seed gives the same weights and the
 * same synthetic batches on any number of ranks, in any order, with no state to carry.
 */
#ifndef CT_BASE_RNG_H
#define CT_BASE_RNG_H

#include <stdint.h>

/* Four 32-bit random words for counter (index, sub) under key (seed, stream). */
void rng_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t sub, uint32_t out[4]);

/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal N(0, 1) (Box-Muller on the first two words pairs). */
double rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Normal(0, std) truncated to [lo, hi] by per-element rejection: still a pure function of
 * the element index. */
double rng_trunc_normal(uint64_t seed, uint64_t stream, uint64_t index, double std, double lo,
                        double hi);
/* Uniform integer in [0, n). */
uint64_t rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n);

/* Fill x[0..n) with element indices first..first+n of the named distribution. */
void rng_fill_normal(float *x, int64_t n, int64_t first, uint64_t seed, uint64_t stream,
                     double mean, double std);
void rng_fill_trunc_normal(float *x, int64_t n, int64_t first, uint64_t seed, uint64_t stream,
                           double std, double lo, double hi);

/* A stable 64-bit stream id from a name (FNV-1a), so tensors are keyed by their names. */
uint64_t rng_stream_id(const char *name);

#endif
