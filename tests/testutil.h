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


struct model;
struct adamw;
struct train_step_result;
/* The reference step (the library's trainer runs every layout through the schedule
 * executor; tests compare it with this plain loop). One optimizer step on `accum` micro-batches of (B, T) tokens/targets laid out one after
 * another: zero grads, forward+backward each micro-batch with the loss normalised by the
 * valid tokens of the whole step (counted before any backward), clip to max_norm on the
 * global norm, AdamW at learning rate lr. Returns CT_ERR_RUNTIME on a non-finite loss or
 * gradient norm (parameters are then left untouched). */
int train_step(struct model *m, struct adamw *opt, const int32_t *tokens, const int32_t *targets,
               int64_t accum, double lr, double max_norm, struct train_step_result *res);
/* One step of a layout's engine (parallel/engine.h) with these inputs. */
struct engine;
int engine_run(const struct engine *e, const int32_t *tokens, const int32_t *targets, int64_t accum,
               struct adamw *opt, double lr, double max_norm, struct train_step_result *res);

#endif
