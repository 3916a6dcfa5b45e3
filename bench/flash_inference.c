/* bench/flash_inference: per-token generation time of a Hyena model (random weights) for
 * L = 2^lmin .. 2^lmax positions in each mixer mode (infer/hyena_gen + infer/online_conv):
 * mean and max time per token, mixer (long convolutions: red cells + phase B) vs non-mixer
 * time, memory, the log-log slopes of total and mixer time against L, and flash's speed-up over
 * lazy (the baseline measured in the same run) at the largest L.
 *
 * Flash runs every position. The quadratic modes run every position up to 2^full_max; above,
 * they are timed on sampled windows: `windows` runs of `steps` consecutive positions, one at a
 * random place (fixed seed) inside each of `windows` equal strata of 0..L (stratified sampling:
 * the expected mean position is L/2 and every position is equally likely), each entered with
 * hgen_seek and one untimed step that warms the caches; a sampled row's max is the max over its
 * windows. Two earlier placements were biased: windows ending at (w + 1) L / windows sit at
 * 0.56 L on average (+12.5% for lazy's linear cost, -12.5% for eager's), and any placement
 * locked to L / windows lands on multiples of 1024, where two of every 1024 lazy steps cost
 * ~25x the others (positions 1024 k - 5 and - 4, measured; the cause is not investigated): at
 * L = 2^14 such windows read 1.6-2x the fully measured mean. The cost of a step depends only on
 * its position (lazy: the prefix length, eager: the suffix length, recompute: the prefix's FFT
 * size), not on the values, so the windows time real steps exactly and their mean estimates the
 * mean over all positions. The table says which rows are sampled ("~"). Where a quadratic mode is
 * measured in full (L > windows x steps, L <= 2^full_max), the sampled estimate is measured too and
 * printed beside it with est/full: the check of the estimate. The speed-ups at 2^lmax are printed
 * as measured and, when that row is an estimate, divided by the est/full ratio at the largest L
 * where both exist. Flash's worst per-token latency (and where it falls) is printed beside its
 * mean: it is what a user streaming tokens sees. The baseline is the quadratic direct sum (lazy).
 *
 * usage: flash_inference [--layers 4] [--dim 128] [--order 2] [--vocab 256] [--lmin 10]
 *        [--lmax 17] [--thr 32] [--modes lazy,eager,recompute,flash] [--full-max 12]
 *        [--recompute-max 15] [--windows 32] [--steps 16] [--batch 1] [--measure]
 */
#include <fftw3.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/timer.h"
#include "infer/hyena_gen.h"
#include "model/hyena/hyena.h"

struct args {
	int64_t layers, dim, order, vocab, lmin, lmax, thr, full_max, recompute_max, windows, steps,
	    batch;
	bool measure;
	bool mode_on[OC_MODE_COUNT];
};

struct row {
	bool done, sampled;
	int64_t timed, max_pos;     /* max_pos: the position of the slowest step */
	double est_mean, est_mixer; /* the sampled estimate beside a full measurement, or 0 */
	double mean, p99, max, mixer, nonmixer, mb, setup;
};

static void usage(void)
{
	fprintf(stderr, "usage: flash_inference [--layers M] [--dim D] [--order N] [--vocab V] "
	                "[--lmin a] [--lmax b] [--thr T] [--modes m1,m2] [--full-max a] "
	                "[--recompute-max a] [--windows W] [--steps K] [--batch B] [--measure]\n");
}

static int parse(int argc, char **argv, struct args *a)
{
	*a = (struct args){.layers = 4,
	                   .dim = 128,
	                   .order = 2,
	                   .vocab = 256,
	                   .lmin = 10,
	                   .lmax = 17,
	                   .thr = 32,
	                   .full_max = 12,
	                   .recompute_max = 15,
	                   .windows = 32,
	                   .steps = 16,
	                   .batch = 1};
	for (int m = 0; m < OC_MODE_COUNT; m++)
		a->mode_on[m] = true;
	for (int i = 1; i < argc; i++) {
		const char *k = argv[i];
		if (strcmp(k, "--measure") == 0) {
			a->measure = true;
			continue;
		}
		if (i + 1 >= argc)
			return -1;
		const char *v = argv[++i];
		if (strcmp(k, "--modes") == 0) {
			for (int m = 0; m < OC_MODE_COUNT; m++)
				a->mode_on[m] = false;
			char buf[256];
			snprintf(buf, sizeof(buf), "%s", v);
			for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
				enum oc_mode m;
				if (oc_mode_parse(s, &m))
					return -1;
				a->mode_on[m] = true;
			}
			continue;
		}
		char *end;
		long long x = strtoll(v, &end, 10);
		if (*end || x < 0)
			return -1;
		int64_t *dst = strcmp(k, "--layers") == 0          ? &a->layers
		               : strcmp(k, "--dim") == 0           ? &a->dim
		               : strcmp(k, "--order") == 0         ? &a->order
		               : strcmp(k, "--vocab") == 0         ? &a->vocab
		               : strcmp(k, "--lmin") == 0          ? &a->lmin
		               : strcmp(k, "--lmax") == 0          ? &a->lmax
		               : strcmp(k, "--thr") == 0           ? &a->thr
		               : strcmp(k, "--full-max") == 0      ? &a->full_max
		               : strcmp(k, "--recompute-max") == 0 ? &a->recompute_max
		               : strcmp(k, "--windows") == 0       ? &a->windows
		               : strcmp(k, "--steps") == 0         ? &a->steps
		               : strcmp(k, "--batch") == 0         ? &a->batch
		                                                   : NULL;
		if (!dst)
			return -1;
		*dst = x;
	}
	return a->lmin >= 1 && a->lmax >= a->lmin && a->lmax <= 24 && a->windows >= 1 &&
	               a->steps >= 1
	           ? 0
	           : -1;
}

static int cmp_double(const void *x, const void *y)
{
	double u = *(const double *)x, v = *(const double *)y;
	return (u > v) - (u < v);
}

/* A uniform draw in [0, 1) (splitmix64), for the windows' places. */
static double window_uniform(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

/* Times one (L, mode): every position, or the sampled windows. */
static void run_one(const struct args *a, const struct hyena_config *c, const struct param_table *t,
                    const float *params, int64_t L, enum oc_mode mode, bool sample, struct row *r)
{
	struct hgen_opts o = {.mode = mode,
	                      .thr = a->thr,
	                      .B = a->batch,
	                      .max_len = L,
	                      .fft_flags = a->measure ? FFTW_MEASURE : 0};
	double t0 = timer_now();
	struct hgen_f32 *g = hgen_create_f32(c, t, params, &o);
	CHECK(g, "decoder");
	r->setup = timer_now() - t0;
	r->mb = (double)hgen_bytes_f32(g) / 1e6;
	int32_t *tok = calloc((size_t)a->batch, sizeof(int32_t));
	const int64_t V = c->vocab_size;
	/* greedy feedback, so each step depends on the last */
	const float *lg = NULL;
	r->sampled = sample;
	int64_t W = r->sampled ? a->windows : 1, K = r->sampled ? a->steps : L;
	uint64_t seed = 0x5EED0F1A5Bull; /* the same windows in every run and mode */
	double *st = malloc((size_t)(W * K) * sizeof(double)); /* each step's wall time */
	int64_t ns = 0;
	double mix = 0, tot = 0, mx = 0;
	for (int64_t w = 0; w < W; w++) {
		/* a sampled window starts one step early: that step warms the caches after the
		 * jump and is not timed */
		int64_t warm = r->sampled ? 1 : 0, start = 0;
		if (r->sampled) {
			int64_t lo = w * L / W, span = (w + 1) * L / W - lo - K - warm;
			start =
			    lo + (span > 0 ? (int64_t)(window_uniform(&seed) * (double)span) : 0);
		}
		if (start > 0)
			hgen_seek_f32(g, start);
		for (int64_t s = 0; s < K + warm; s++) {
			for (int64_t b = 0; b < a->batch; b++) {
				int32_t best = 0;
				for (int64_t v = 1; lg && v < V; v++)
					best = lg[b * V + v] > lg[b * V + best] ? (int32_t)v : best;
				tok[b] = best;
			}
			struct hgen_times ta, tb;
			hgen_times_f32(g, &ta);
			lg = hgen_step_f32(g, tok);
			hgen_times_f32(g, &tb);
			if (s < warm)
				continue;
			double dt = tb.total_s - ta.total_s;
			st[ns++] = dt;
			if (dt > mx)
				mx = dt, r->max_pos = start + s - warm;
			tot += dt, mix += tb.mixer_s - ta.mixer_s;
		}
	}
	r->timed = ns;
	r->mean = tot / (double)ns;
	r->max = mx;
	qsort(st, (size_t)ns, sizeof(double), cmp_double);
	r->p99 = st[(int64_t)(0.99 * (double)(ns - 1))];
	free(st);
	r->mixer = mix / (double)ns;
	r->nonmixer = r->mean - r->mixer;
	r->done = true;
	hgen_free_f32(g);
	free(tok);
}

/* least-squares slope of log y against log x */
static double slope(const double *x, const double *y, int n)
{
	double sx = 0, sy = 0, sxx = 0, sxy = 0;
	int k = 0;
	for (int i = 0; i < n; i++) {
		if (!(y[i] > 0))
			continue;
		double lx = log(x[i]), ly = log(y[i]);
		sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly, k++;
	}
	if (k < 2)
		return NAN;
	return (k * sxy - sx * sy) / (k * sxx - sx * sx);
}

int main(int argc, char **argv)
{
	struct args a;
	if (parse(argc, argv, &a)) {
		usage();
		return 2;
	}
	struct hyena_config c;
	CHECK(hyena_config_preset(&c, "hyena-small") == 0, "preset");
	c.n_layers = a.layers, c.dim = a.dim, c.order = a.order, c.vocab_size = a.vocab;
	c.ffn_hidden = 4 * a.dim;
	c.l_max = (int64_t)1 << a.lmax; /* one filter; shorter runs use its prefix */
	if (hyena_config_finish(&c))
		return 2;
	struct param_table t;
	hyena_table_build(&t, &c);
	float *params = malloc((size_t)t.numel * sizeof(float));
	hyena_init_params(&c, &t, 1234, params, 0, t.numel);
	printf("# Hyena M=%lld D=%lld order=%lld V=%lld d_inner=%lld batch=%lld, fp32, "
	       "%d OpenMP threads, flash thr=%lld, FFTW %s\n",
	       (long long)c.n_layers, (long long)c.dim, (long long)c.order, (long long)c.vocab_size,
	       (long long)c.ffn_hidden, (long long)a.batch, omp_get_max_threads(), (long long)a.thr,
	       a.measure ? "MEASURE" : "ESTIMATE");
	printf("# quadratic modes above L=2^%lld: %lld windows of %lld steps (exact per-step cost, "
	       "mean estimated over stratified random windows, fixed seed); recompute = mixer-only "
	       "FFT recompute, "
	       "run up to L=2^%lld\n",
	       (long long)a.full_max, (long long)a.windows, (long long)a.steps,
	       (long long)a.recompute_max);
	printf("# per token: mean, p99 and max wall time; mixer = long convolutions (red cells +\n"
	       "# phase B), nonmix = the rest; mem = decoder state; setup = filters + spectra\n");
	printf("%-8s %-10s %-9s %11s %11s %11s %11s %11s %9s %8s\n", "L", "mode", "timed",
	       "mean_ms", "p99_ms", "max_ms", "mixer_ms", "nonmix_ms", "mem_MB", "setup_s");
	int nL = (int)(a.lmax - a.lmin + 1);
	struct row *rows = calloc((size_t)(nL * OC_MODE_COUNT), sizeof(struct row));
	for (int i = 0; i < nL; i++) {
		int64_t L = (int64_t)1 << (a.lmin + i);
		for (int m = 0; m < OC_MODE_COUNT; m++) {
			if (!a.mode_on[m] || (m == OC_RECOMPUTE && a.lmin + i > a.recompute_max))
				continue;
			struct row *r = &rows[i * OC_MODE_COUNT + m];
			bool samplable = m != OC_FLASH && a.windows * a.steps < L;
			bool full = !samplable || a.lmin + i <= a.full_max;
			run_one(&a, &c, &t, params, L, (enum oc_mode)m, !full, r);
			if (full &&
			    samplable) { /* check the estimate where the full value exists */
				struct row e = {0};
				run_one(&a, &c, &t, params, L, (enum oc_mode)m, true, &e);
				r->est_mean = e.mean, r->est_mixer = e.mixer;
			}
			char timed[32];
			snprintf(timed, sizeof(timed), "%s%lld", r->sampled ? "~" : "",
			         (long long)r->timed);
			printf("%-8lld %-10s %-9s %11.4f %11.4f %11.4f %11.4f %11.4f %9.1f %8.2f\n",
			       (long long)L, oc_mode_name((enum oc_mode)m), timed, r->mean * 1e3,
			       r->p99 * 1e3, r->max * 1e3, r->mixer * 1e3, r->nonmixer * 1e3, r->mb,
			       r->setup);
			if (r->est_mean > 0)
				printf(
				    "%-8s %-10s %-9s %11.4f %11s %11s %11.4f %11s   est/full: mean "
				    "%.3f, mixer %.3f\n",
				    "", "  estimate", "~sampled", r->est_mean * 1e3, "", "",
				    r->est_mixer * 1e3, "", r->est_mean / r->mean,
				    r->est_mixer / r->mixer);
			fflush(stdout);
		}
	}
	printf(
	    "\n# log-log slope vs L (least squares over the measured L; last pair in brackets)\n");
	printf("%-10s %10s %10s %10s %10s\n", "mode", "total", "(last)", "mixer", "(last)");
	for (int m = 0; m < OC_MODE_COUNT; m++) {
		double x[32], yt[32], ym[32];
		int n = 0;
		for (int i = 0; i < nL; i++) {
			struct row *r = &rows[i * OC_MODE_COUNT + m];
			if (!r->done)
				continue;
			x[n] = (double)((int64_t)1 << (a.lmin + i));
			yt[n] = r->mean, ym[n] = r->mixer;
			n++;
		}
		if (n < 2)
			continue;
		printf("%-10s %10.3f %10.3f %10.3f %10.3f\n", oc_mode_name((enum oc_mode)m),
		       slope(x, yt, n), slope(x + n - 2, yt + n - 2, 2), slope(x, ym, n),
		       slope(x + n - 2, ym + n - 2, 2));
	}
	struct row *fl = &rows[(nL - 1) * OC_MODE_COUNT + OC_FLASH];
	printf("\n# at L=2^%lld, speed-up of flash over (mixer, end to end); the baseline is the "
	       "quadratic direct sum (lazy)\n",
	       (long long)a.lmax);
	for (int m = 0; m < OC_MODE_COUNT; m++) {
		struct row *r = &rows[(nL - 1) * OC_MODE_COUNT + m];
		if (m == OC_FLASH || !r->done || !fl->done)
			continue;
		printf("%-10s mixer %8.1fx   end-to-end %8.1fx%s\n", oc_mode_name((enum oc_mode)m),
		       r->mixer / fl->mixer, r->mean / fl->mean,
		       r->sampled ? "   (the mode's time is the sampled estimate)"
		                  : "   (measured)");
		if (!r->sampled)
			continue;
		/* the estimate's bias where it was checked: the largest L with both */
		for (int i = nL - 1; i >= 0; i--) {
			struct row *q = &rows[i * OC_MODE_COUNT + m];
			if (!(q->est_mean > 0))
				continue;
			double bm = q->est_mixer / q->mixer, bt = q->est_mean / q->mean;
			printf("%-10s   est/full at L=2^%lld: mixer %.3f, mean %.3f -> corrected "
			       "speed-ups: mixer %.1fx, end-to-end %.1fx\n",
			       "", (long long)(a.lmin + i), bm, bt, r->mixer / fl->mixer / bm,
			       r->mean / fl->mean / bt);
			break;
		}
	}
	if (fl->done)
		printf(
		    "flash per token at L=2^%lld: mean %.4f ms, worst %.4f ms (at position %lld), "
		    "p99 %.4f ms\n",
		    (long long)a.lmax, fl->mean * 1e3, fl->max * 1e3, (long long)fl->max_pos,
		    fl->p99 * 1e3);
	free(rows), free(params);
	param_table_free(&t);
	return 0;
}
