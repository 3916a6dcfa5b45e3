/* tests/testutil: a minimal test harness for plain test executables.
 *
 *   TEST_CASE(name) { ... EXPECT(cond, fmt, ...); ... }
 *   int main(void) { RUN(name); ...; return test_summary(); }
 *
 * test_summary prints "N passed, N failed" and returns the exit status.
 */
#ifndef CT_TESTUTIL_H
#define CT_TESTUTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

extern int test_failures_in_case;

#define TEST_CASE(name) static void name(void)
#define RUN(name)       test_run(#name, name)
#define EXPECT(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "  FAIL %s:%d: ", __FILE__, __LINE__);                     \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			test_failures_in_case++;                                                   \
		}                                                                                  \
	} while (0)

void test_run(const char *name, void (*fn)(void));
int test_summary(void);

/* Fresh random inputs per run unless CT_TEST_SEED is set; the seed is printed. */
uint64_t test_seed(void);

/* MPI tests. test_seed_all: rank 0 of g draws (or reads CT_TEST_SEED) and prints the seed once;
 * every rank gets that seed (and the same test_uniform stream), so the printed seed reproduces
 * the run. test_summary_all: every rank's failures count; rank 0 prints the totals and every
 * rank returns the same exit status. */
struct comm_group;
uint64_t test_seed_all(const struct comm_group *g);
int test_summary_all(const struct comm_group *g);
/* ||a-b||_2 / max(||b||_2, tiny) */
double rel_err_f64(const double *a, const double *b, int64_t n);
double rel_err_f32(const float *a, const float *b, int64_t n);
/* Uniform in [lo, hi) from a simple per-test generator. */
double test_uniform(double lo, double hi);
void test_fill(double *x, int64_t n, double lo, double hi);
void test_fill_f32(float *x, int64_t n, double lo, double hi);

#endif
