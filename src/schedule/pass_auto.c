/* schedule/pass_auto: the automatic plan — buckets, prefetch depth and reduce-scatter
 * deferral chosen together by the cost model (see sched_pass_auto in sched_pass.h).
 *
 * A plan is a set of cuts: cut[u] says unit u starts a bucket (cut[0] always). Every
 * candidate is priced by the whole pipeline — bucket pass, reorder pass (which lowers
 * prefetch depths to a memory budget) and the timeline — so the search optimises exactly what
 * `ctitan plan` and the start-up log predict. Plans that do not fit the budget rank after all
 * that do, by how far they overshoot. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"

struct search {
	const struct sched *in;
	const struct sched_cost_model *cm;
	const struct sched_reorder_opts *o;
	int64_t cap_bytes;
	int U;
	int64_t *prefix_bytes; /* gathered bytes of units [0, u) */
	struct sched_auto_report *r;
	struct sched_bucket *tmp; /* U buckets */
};

struct score {
	double step_s, exposed_s, compute_s;
	int64_t peak, over; /* bytes over the budget (0: fits) */
};

/* Steps within this fraction are a tie, broken by the smaller peak. */
#define TIE 1e-9

static bool faster(double step_a, int64_t peak_a, double step_b, int64_t peak_b)
{
	if (step_a < step_b * (1 - TIE) || step_a > step_b * (1 + TIE))
		return step_a < step_b;
	return peak_a < peak_b;
}

static bool better(const struct score *a, const struct score *b)
{
	return a->over != b->over ? a->over < b->over
	                          : faster(a->step_s, a->peak, b->step_s, b->peak);
}

/* Gathered bytes of units [a, b). */
static int64_t span_bytes(const struct search *S, int a, int b)
{
	return S->prefix_bytes[b] - S->prefix_bytes[a];
}

static bool bucket_ok(const struct search *S, int a, int b)
{
	return b - a == 1 || span_bytes(S, a, b) <= S->cap_bytes;
}

static int cuts_to_buckets(const bool *cut, int U, struct sched_bucket *b)
{
	int n = 0;
	for (int u = 0; u < U; u++) {
		if (cut[u])
			b[n++] = (struct sched_bucket){u, 0};
		b[n - 1].n_units++;
	}
	return n;
}

static bool same_plan(const struct sched_plan_eval *e, const struct sched_bucket *b, int n, int p,
                      int d)
{
	return e->n_buckets == n && e->prefetch == p && e->rs_defer == d &&
	       memcmp(e->buckets, b, (size_t)n * sizeof(*b)) == 0;
}

/* Keep the SCHED_AUTO_TOP best fitting plans, best first, each once. */
static void keep_top(struct sched_auto_report *r, const struct sched_bucket *b, int n, int p, int d,
                     const struct score *sc)
{
	for (int i = 0; i < r->n_top; i++)
		if (same_plan(&r->top[i], b, n, p, d))
			return;
	int at = r->n_top;
	while (at > 0 &&
	       faster(sc->step_s, sc->peak, r->top[at - 1].step_s, r->top[at - 1].peak_bytes))
		at--;
	if (at >= SCHED_AUTO_TOP)
		return;
	if (r->n_top == SCHED_AUTO_TOP)
		free(r->top[--r->n_top].buckets);
	memmove(&r->top[at + 1], &r->top[at], (size_t)(r->n_top - at) * sizeof(r->top[0]));
	struct sched_plan_eval *e = &r->top[at];
	e->buckets = xcalloc((size_t)n, sizeof(*b));
	memcpy(e->buckets, b, (size_t)n * sizeof(*b));
	e->n_buckets = n;
	e->prefetch = p;
	e->rs_defer = d;
	e->step_s = sc->step_s;
	e->exposed_s = sc->exposed_s;
	e->peak_bytes = sc->peak;
	r->n_top++;
}

/* Build the schedule of buckets b at depths (p, d); out may be NULL (then only scored). */
static struct score build(struct search *S, const struct sched_bucket *b, int n, int p, int d,
                          struct sched *out)
{
	struct sched bk, ro;
	sched_pass_bucket(S->in, b, n, &bk);
	struct sched_reorder_opts o = *S->o;
	o.prefetch = p;
	o.rs_defer = d;
	sched_pass_reorder(&bk, &o, S->cm, &ro);
	struct sched_prediction pr;
	sched_predict(&ro, S->cm, &pr, NULL);
	sched_free(&bk);
	if (out)
		*out = ro;
	else
		sched_free(&ro);
	struct score sc = {pr.step_s, pr.exposed_s, pr.compute_s, pr.peak_bytes, 0};
	if (S->o->memory_bytes > 0 && pr.peak_bytes > S->o->memory_bytes)
		sc.over = pr.peak_bytes - S->o->memory_bytes;
	return sc;
}

static struct score eval_cuts(struct search *S, const bool *cut, int p, int d)
{
	int n = cuts_to_buckets(cut, S->U, S->tmp);
	struct score sc = build(S, S->tmp, n, p, d, NULL);
	struct sched_auto_report *r = S->r;
	r->n_evaluated++;
	if (sc.peak < r->min_peak || r->min_peak == 0)
		r->min_peak = sc.peak;
	if (sc.over == 0) {
		r->fits = true;
		keep_top(r, S->tmp, n, p, d, &sc);
	}
	return sc;
}

/* ---------------------------------------------------------------- exhaustive */

static int64_t count_partitions(const struct search *S, int64_t limit)
{
	int64_t *c = xcalloc((size_t)S->U + 1, sizeof(int64_t));
	c[0] = 1;
	for (int j = 1; j <= S->U; j++)
		for (int i = j - 1; i >= 0 && bucket_ok(S, i, j); i--)
			c[j] = c[j] + c[i] > limit ? limit + 1 : c[j] + c[i];
	int64_t n = c[S->U];
	free(c);
	return n;
}

/* Every partition of units [u, U) under the cap, after the cuts already set before u. */
static void enumerate(struct search *S, bool *cut, int u, int p, int d)
{
	if (u == S->U) {
		eval_cuts(S, cut, p, d);
		return;
	}
	for (int e = u + 1; e <= S->U && bucket_ok(S, u, e); e++) {
		cut[u] = true;
		for (int v = u + 1; v < e; v++)
			cut[v] = false;
		enumerate(S, cut, e, p, d);
	}
}

/* ---------------------------------------------------------------- heuristic search */

/* Units [j, U) completed as buckets of `len` units (1: single units), within the cap. */
static void complete(const struct search *S, bool *cut, int j, int len)
{
	for (int u = j; u < S->U;) {
		int e = u + len < S->U ? u + len : S->U;
		while (e > u + 1 && !bucket_ok(S, u, e))
			e--;
		cut[u] = true;
		for (int v = u + 1; v < e; v++)
			cut[v] = false;
		u = e;
	}
}

/* The dynamic program over prefixes: best[j] holds the best cuts of units [0, j) found, each
 * extension priced with the rest completed two ways. Result in cut. */
static void dp(struct search *S, int p, int d, bool *cut)
{
	int U = S->U;
	bool *best = xcalloc((size_t)(U + 1) * (size_t)U, sizeof(bool));
	bool *c = xcalloc((size_t)U, sizeof(bool));
	struct score *bs = xcalloc((size_t)U + 1, sizeof(*bs));
	for (int j = 1; j <= U; j++) {
		bool have = false;
		for (int i = j - 1; i >= 0 && bucket_ok(S, i, j); i--) {
			for (int how = 0; how < 2; how++) {
				memcpy(c, best + (size_t)i * U, (size_t)i * sizeof(bool));
				c[i] = true;
				for (int v = i + 1; v < j; v++)
					c[v] = false;
				complete(S, c, j, how ? j - i : 1);
				if (how && j - i == 1)
					continue; /* the same completion */
				struct score sc = eval_cuts(S, c, p, d);
				if (!have || better(&sc, &bs[j])) {
					have = true;
					bs[j] = sc;
					memcpy(best + (size_t)j * U, c, (size_t)U * sizeof(bool));
				}
			}
		}
	}
	memcpy(cut, best + (size_t)U * U, (size_t)U * sizeof(bool));
	free(best), free(c), free(bs);
}

static bool cuts_ok(const struct search *S, const bool *cut)
{
	for (int u = 0, e; u < S->U; u = e) {
		for (e = u + 1; e < S->U && !cut[e]; e++)
			;
		if (!bucket_ok(S, u, e))
			return false;
	}
	return true;
}

/* Steepest descent over single-cut moves: add or remove one cut (split, merge) or move one
 * by a unit. */
static void local_search(struct search *S, int p, int d, bool *cut, struct score *cur)
{
	int U = S->U;
	bool *c = xcalloc((size_t)U, sizeof(bool)), *nb = xcalloc((size_t)U, sizeof(bool));
	for (int round = 0; round < 4 * U; round++) {
		struct score bsc = *cur;
		bool found = false;
		for (int u = 1; u < U; u++)
			for (int m = 0; m < 3; m++) {
				memcpy(c, cut, (size_t)U * sizeof(bool));
				if (m == 0) {
					c[u] = !c[u];
				} else {
					int w = m == 1 ? u - 1 : u + 1;
					if (!cut[u] || w < 1 || w >= U || cut[w])
						continue;
					c[u] = false;
					c[w] = true;
				}
				if (!cuts_ok(S, c))
					continue;
				struct score sc = eval_cuts(S, c, p, d);
				if (better(&sc, &bsc)) {
					bsc = sc;
					memcpy(nb, c, (size_t)U * sizeof(bool));
					found = true;
				}
			}
		if (!found)
			break;
		*cur = bsc;
		memcpy(cut, nb, (size_t)U * sizeof(bool));
	}
	free(c), free(nb);
}

/* Steepest descent from uniform plans of k = 1, 2, 4, ... and U units per bucket (of each k,
 * the best of its variants: the embedding and the norm alone or joined to their neighbours).
 * The descent from the dynamic program's plan alone stops in a local optimum that seeded
 * random plans beat by a fraction of a percent (1B, 18 units, about 1 seed in 200; the
 * optimum there, buckets of 1, 1, 1, 2, 4 and 9 units, is reached from coarse starts and not
 * from the fine ones that score best before descending), and a descent from every uniform plan
 * costs 25x the search on 70B. Every plan evaluated enters the report's top list, so the best
 * of the descents is the pass's answer. */
static void multi_start(struct search *S, int p, int d)
{
	int U = S->U;
	bool *c = xcalloc((size_t)U, sizeof(bool)), *best = xcalloc((size_t)U, sizeof(bool));
	for (int k = 1;; k = 2 * k < U ? 2 * k : U) {
		struct score bs = {0};
		bool have = false;
		for (int v = 0; v < 4; v++) {
			int lo = v & 1 ? 1 : 0, hi = v & 2 ? U - 1 : U;
			if (hi <= lo)
				continue;
			memset(c, 0, (size_t)U * sizeof(bool));
			for (int u = lo; u < hi; u += k)
				c[u] = true;
			c[0] = true;
			if (hi < U)
				c[U - 1] = true;
			if (!cuts_ok(S, c))
				continue;
			struct score sc = eval_cuts(S, c, p, d);
			if (!have || better(&sc, &bs)) {
				have = true;
				bs = sc;
				memcpy(best, c, (size_t)U * sizeof(bool));
			}
		}
		if (have)
			local_search(S, p, d, best, &bs);
		if (k == U)
			break;
	}
	free(c), free(best);
}

/* ---------------------------------------------------------------- the pass */

int sched_pass_auto(const struct sched *in, const struct sched_cost_model *cm,
                    const struct sched_reorder_opts *o, int64_t cap_bytes, struct sched *out,
                    struct sched_auto_report *r)
{
	memset(r, 0, sizeof(*r));
	int U = in->n_units;
	struct search S = {in, cm,
	                   o,  cap_bytes,
	                   U,  xcalloc((size_t)U + 1, sizeof(int64_t)),
	                   r,  xcalloc((size_t)U, sizeof(struct sched_bucket))};
	for (int u = 0; u < U; u++)
		S.prefix_bytes[u + 1] =
		    S.prefix_bytes[u] + in->units[u].full_numel * cm->full_elem_bytes;
	int P = o->prefetch, D = o->rs_defer, combos = (P + 1) * (D + 1);
	int64_t parts = count_partitions(&S, SCHED_AUTO_EXHAUSTIVE);
	r->exhaustive = parts * combos <= SCHED_AUTO_EXHAUSTIVE;
	bool *cut = xcalloc((size_t)U, sizeof(bool)), *c = xcalloc((size_t)U, sizeof(bool));
	for (int p = 0; p <= P; p++)
		for (int d = 0; d <= D; d++) {
			if (r->exhaustive) {
				enumerate(&S, cut, 0, p, d);
				continue;
			}
			/* steepest descent from the dynamic program's plan and from every
			 * uniform plan: one start alone stops in a local optimum that seeded
			 * random plans beat by a fraction of a percent (1B, 18 units) */
			dp(&S, p, d, cut);
			struct score best = eval_cuts(&S, cut, p, d);
			local_search(&S, p, d, cut, &best);
			multi_start(&S, p, d);
		}
	/* per-block at the configured depths, for reference */
	for (int u = 0; u < U; u++)
		c[u] = true;
	int n = cuts_to_buckets(c, U, S.tmp);
	struct score pb = build(&S, S.tmp, n, P, D, NULL);
	r->per_block = (struct sched_plan_eval){xcalloc((size_t)n, sizeof(struct sched_bucket)),
	                                        n,
	                                        P,
	                                        D,
	                                        pb.step_s,
	                                        pb.exposed_s,
	                                        pb.peak};
	memcpy(r->per_block.buckets, S.tmp, (size_t)n * sizeof(struct sched_bucket));
	r->per_block_valid = true;
	int rc = CT_OK;
	if (r->n_top == 0) {
		rc = CT_ERR_USAGE;
		memset(out, 0, sizeof(*out));
	} else {
		const struct sched_plan_eval *e = &r->top[0];
		struct score sc =
		    build(&S, e->buckets, e->n_buckets, e->prefetch, e->rs_defer, out);
		r->lower_bound_s = sc.compute_s; /* the same compute nodes in every plan */
	}
	free(S.prefix_bytes), free(S.tmp), free(cut), free(c);
	return rc;
}

void sched_auto_report_free(struct sched_auto_report *r)
{
	for (int i = 0; i < r->n_top; i++)
		free(r->top[i].buckets);
	if (r->per_block_valid)
		free(r->per_block.buckets);
	memset(r, 0, sizeof(*r));
}

void sched_plan_string(const struct sched_bucket *b, int n_buckets, int n_units, char *buf,
                       size_t size)
{
	if (n_buckets == n_units) {
		snprintf(buf, size, "per_block");
		return;
	}
	struct sched s = {
	    .n_units = n_units, .n_buckets = n_buckets, .buckets = (struct sched_bucket *)b};
	size_t at = 0;
	buf[0] = 0;
	for (int i = 0; i < n_buckets; i++) {
		char one[256];
		sched_bucket_name(&s, i, one, sizeof(one));
		size_t need = strlen(one) + 1;
		if (at + need + 4 >= size) {
			snprintf(buf + at, size - at, "...");
			return;
		}
		at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? "," : "", one);
	}
}

static void print_one(const struct sched_plan_eval *e, int n_units, FILE *f, const char *indent,
                      const char *tag)
{
	char plan[160];
	sched_plan_string(e->buckets, e->n_buckets, n_units, plan, sizeof(plan));
	fprintf(f,
	        "%s%-9s step %8.4f s  exposed %7.4f s  peak %7.3f GiB  prefetch %d  defer %d  "
	        "%d buckets: %s\n",
	        indent, tag, e->step_s, e->exposed_s, (double)e->peak_bytes / (double)(1ll << 30),
	        e->prefetch, e->rs_defer, e->n_buckets, plan);
}

void sched_auto_report_print(const struct sched_auto_report *r, int n_units, FILE *f,
                             const char *indent)
{
	fprintf(f, "%sauto plan: %lld plans compared (%s); best %d:\n", indent,
	        (long long)r->n_evaluated,
	        r->exhaustive ? "every partition under the cap: optimal for the model"
	                      : "local search from the dynamic program and uniform plans of 1, 2, 4, ... units",
	        r->n_top);
	for (int i = 0; i < r->n_top; i++) {
		char tag[16];
		snprintf(tag, sizeof(tag), "#%d", i + 1);
		print_one(&r->top[i], n_units, f, indent, tag);
	}
	if (r->per_block_valid)
		print_one(&r->per_block, n_units, f, indent, "per-block");
	if (r->n_top > 0)
		fprintf(
		    f,
		    "%slower bound %.4f s (the compute alone: every copy and collective hidden); "
		    "the chosen plan is within %.1f%% of it\n",
		    indent, r->lower_bound_s, 100.0 * (r->top[0].step_s / r->lower_bound_s - 1.0));
}
