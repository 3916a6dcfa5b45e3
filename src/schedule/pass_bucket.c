/* schedule/pass_bucket: bucketing — merge the collectives of adjacent units.
 *
 * Manual plans come from the config (comm.buckets); the automatic plan is SimpleFSDP's
 * greedy: walk the units in order and extend the current bucket while the cost model says the
 * step gets no slower (the bucket's communication still hides behind the compute it overlaps)
 * and the memory caps hold; otherwise start a new bucket. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"

/* One unit name: "embed", "norm" (or "output"), or a block index. -1 if bad. */
static int unit_of(const char *tok, size_t len, int n_units)
{
	if (len == 5 && strncmp(tok, "embed", 5) == 0)
		return 0;
	if ((len == 4 && strncmp(tok, "norm", 4) == 0) ||
	    (len == 6 && strncmp(tok, "output", 6) == 0))
		return n_units - 1;
	if (len == 0 || len > 9)
		return -1;
	int v = 0;
	for (size_t i = 0; i < len; i++) {
		if (!isdigit((unsigned char)tok[i]))
			return -1;
		v = v * 10 + (tok[i] - '0');
	}
	return v + 1 < n_units - 1 ? v + 1 : -1;
}

int sched_bucket_plan_parse(const char *spec, int n_units, struct sched_bucket **buckets,
                            int *n_buckets, char *why, size_t why_size)
{
	struct sched_bucket *b = xcalloc((size_t)n_units, sizeof(*b));
	int nb = 0, next = 0;
	if (strcmp(spec, "per_block") == 0) {
		for (int u = 0; u < n_units; u++)
			b[u] = (struct sched_bucket){u, 1};
		*buckets = b;
		*n_buckets = n_units;
		return CT_OK;
	}
	const char *p = spec;
	while (*p) {
		const char *end = p + strcspn(p, ",");
		int first = -1, last = -1;
		for (const char *q = p; q < end;) {
			const char *e = q;
			while (e < end && *e != '+')
				e++;
			/* trim blanks */
			const char *a = q, *z = e;
			while (a < z && isspace((unsigned char)*a))
				a++;
			while (z > a && isspace((unsigned char)z[-1]))
				z--;
			int u = unit_of(a, (size_t)(z - a), n_units);
			if (u < 0) {
				snprintf(why, why_size, "'%.*s' is not a unit (embed, 0..%d, norm)",
				         (int)(z - a), a, n_units - 3);
				goto fail;
			}
			if (u != (last < 0 ? next : last + 1)) {
				snprintf(
				    why, why_size,
				    "units must appear once each, in order: '%.*s' is out of place",
				    (int)(z - a), a);
				goto fail;
			}
			if (first < 0)
				first = u;
			last = u;
			q = e < end ? e + 1 : e;
		}
		if (first < 0) {
			snprintf(why, why_size, "empty group");
			goto fail;
		}
		b[nb++] = (struct sched_bucket){first, last - first + 1};
		next = last + 1;
		p = *end ? end + 1 : end;
	}
	if (next != n_units) {
		snprintf(why, why_size, "the groups cover units up to %d of %d (the last is norm)",
		         next, n_units);
		goto fail;
	}
	*buckets = b;
	*n_buckets = nb;
	return CT_OK;
fail:
	free(b);
	return CT_ERR_USAGE;
}

void sched_pass_bucket(const struct sched *in, const struct sched_bucket *buckets, int n_buckets,
                       struct sched *out)
{
	struct sched mid;
	sched_init_like(&mid, in);
	free(mid.buckets);
	mid.n_buckets = n_buckets;
	mid.buckets = xcalloc((size_t)n_buckets, sizeof(*mid.buckets));
	memcpy(mid.buckets, buckets, (size_t)n_buckets * sizeof(*buckets));
	for (int i = 0; i < in->n_nodes; i++) {
		struct sched_node n = in->nodes[i];
		if (n.kind == SCHED_REDUCE_SCATTER ||
		    (n.kind == SCHED_WAIT && n.wait_kind == SCHED_REDUCE_SCATTER))
			continue;
		sched_push(&mid, n);
		if (n.kind != SCHED_BWD)
			continue;
		int b = sched_bucket_of(&mid, n.unit);
		if (n.unit != mid.buckets[b].unit0)
			continue; /* not the bucket's last backward unit yet */
		struct sched_node rs = {.kind = SCHED_REDUCE_SCATTER,
		                        .wait_kind = SCHED_ALL_GATHER,
		                        .unit = -1,
		                        .bucket = b,
		                        .micro = n.micro,
		                        .phase = SCHED_PH_BWD};
		sched_push(&mid, rs);
		rs.kind = SCHED_WAIT;
		rs.wait_kind = SCHED_REDUCE_SCATTER;
		sched_push(&mid, rs);
	}
	sched_place_gathers(&mid, out);
	sched_free(&mid);
}

/* A merge must save this fraction of the predicted step: smaller gains are within the cost
 * model's error, and a bigger bucket costs memory (and cache) the model does not price. */
#define SCHED_AUTO_MIN_GAIN 0.005

/* Predicted step time of `plan` (units beyond it as single buckets), after reordering. */
static double plan_cost(const struct sched *in, const struct sched_cost_model *cm,
                        const struct sched_reorder_opts *o, struct sched_bucket *plan, int n,
                        int64_t *peak)
{
	struct sched_bucket *full = xcalloc((size_t)in->n_units, sizeof(*full));
	memcpy(full, plan, (size_t)n * sizeof(*plan));
	int nb = n;
	for (int u = plan[n - 1].unit0 + plan[n - 1].n_units; u < in->n_units; u++)
		full[nb++] = (struct sched_bucket){u, 1};
	struct sched b, r;
	sched_pass_bucket(in, full, nb, &b);
	sched_pass_reorder(&b, o, cm, &r);
	struct sched_prediction pr;
	sched_predict(&r, cm, &pr, NULL);
	*peak = pr.peak_bytes;
	sched_free(&b);
	sched_free(&r);
	free(full);
	return pr.step_s;
}

void sched_pass_bucket_auto(const struct sched *in, const struct sched_cost_model *cm,
                            const struct sched_reorder_opts *o, int64_t cap_bytes,
                            struct sched *out)
{
	int U = in->n_units, n = 1;
	struct sched_bucket *plan = xcalloc((size_t)U, sizeof(*plan));
	plan[0] = (struct sched_bucket){0, 1};
	int64_t peak;
	double best = plan_cost(in, cm, o, plan, n, &peak);
	for (int u = 1; u < U; u++) {
		/* option A: u starts a new bucket (that is what `best` already priced) */
		struct sched_bucket *last = &plan[n - 1];
		int64_t bytes = 0;
		for (int v = last->unit0; v <= u; v++)
			bytes += in->units[v].full_numel * 4;
		if (bytes <= cap_bytes) {
			/* option B: extend the current bucket by u */
			last->n_units++;
			int64_t peak_b;
			double tb = plan_cost(in, cm, o, plan, n, &peak_b);
			bool fits = o->memory_bytes <= 0 || peak_b <= o->memory_bytes;
			if (fits && tb < best * (1.0 - SCHED_AUTO_MIN_GAIN)) {
				best = tb;
				continue;
			}
			last->n_units--;
		}
		plan[n++] = (struct sched_bucket){u, 1};
	}
	sched_pass_bucket(in, plan, n, out);
	free(plan);
}

int sched_pipeline(const struct sched *naive, enum model_ac ac, const char *buckets,
                   int64_t bucket_cap_bytes, const struct sched_reorder_opts *o,
                   const struct sched_cost_model *cm, struct sched *out)
{
	struct sched ck, bk;
	sched_pass_checkpoint(naive, ac, &ck);
	if (strcmp(buckets, "auto") == 0) {
		if (!cm) {
			LOG_ERROR("comm.buckets = \"auto\" needs the cost model");
			sched_free(&ck);
			return CT_ERR_USAGE;
		}
		sched_pass_bucket_auto(&ck, cm, o, bucket_cap_bytes, &bk);
	} else {
		struct sched_bucket *plan;
		int nb;
		char why[256];
		if (sched_bucket_plan_parse(buckets, naive->n_units, &plan, &nb, why,
		                            sizeof(why))) {
			LOG_ERROR("comm.buckets: '%s': %s", buckets, why);
			sched_free(&ck);
			return CT_ERR_USAGE;
		}
		sched_pass_bucket(&ck, plan, nb, &bk);
		free(plan);
	}
	sched_pass_reorder(&bk, o, cm, out);
	sched_free(&ck);
	sched_free(&bk);
	return CT_OK;
}
