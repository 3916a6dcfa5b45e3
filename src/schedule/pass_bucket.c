/* schedule/pass_bucket: bucketing — merge the collectives of adjacent units.
 *
 * Manual plans come from the config (comm.buckets); the automatic plan is searched by
 * pass_auto.c (buckets, prefetch depth and reduce-scatter deferral together). */
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

static int pipeline_passes(const struct sched *naive, enum model_ac ac, int ac_every,
                           const char *buckets,
                           int64_t bucket_cap_bytes, const struct sched_reorder_opts *o,
                           const struct sched_cost_model *cm, struct sched *out,
                           struct sched_auto_report *report)
{
	struct sched ck, bk;
	sched_pass_ac(naive, ac, ac_every, &ck);
	if (strcmp(buckets, "auto") == 0) {
		if (!cm) {
			LOG_ERROR("comm.buckets = \"auto\" needs the cost model");
			sched_free(&ck);
			return CT_ERR_USAGE;
		}
		struct sched_auto_report own;
		struct sched_auto_report *r = report ? report : &own;
		int rc = sched_pass_auto(&ck, cm, o, bucket_cap_bytes, out, r);
		if (rc)
			LOG_ERROR("comm.memory_budget_gb = %.3f GiB: no plan fits (%lld plans "
			          "compared); the smallest predicted peak is %.3f GiB per rank",
			          (double)o->memory_bytes / (double)(1ll << 30),
			          (long long)r->n_evaluated,
			          (double)r->min_peak / (double)(1ll << 30));
		if (!report)
			sched_auto_report_free(&own);
		sched_free(&ck);
		return rc;
	}
	if (report)
		memset(report, 0, sizeof(*report));
	struct sched_bucket *plan;
	int nb;
	char why[256];
	if (sched_bucket_plan_parse(buckets, naive->n_units, &plan, &nb, why, sizeof(why))) {
		LOG_ERROR("comm.buckets: '%s': %s", buckets, why);
		sched_free(&ck);
		return CT_ERR_USAGE;
	}
	sched_pass_bucket(&ck, plan, nb, &bk);
	free(plan);
	sched_pass_reorder(&bk, o, cm, out);
	sched_free(&ck);
	sched_free(&bk);
	if (cm && o->memory_bytes > 0) {
		struct sched_prediction p;
		sched_predict(out, cm, &p, NULL);
		if (p.peak_bytes > o->memory_bytes) {
			LOG_ERROR(
			    "comm.memory_budget_gb = %.3f GiB: the plan '%s' does not fit even "
			    "with prefetching lowered; its smallest predicted peak is %.3f GiB "
			    "per rank (comm.buckets = \"auto\" searches every plan)",
			    (double)o->memory_bytes / (double)(1ll << 30), buckets,
			    (double)p.peak_bytes / (double)(1ll << 30));
			sched_free(out);
			return CT_ERR_USAGE;
		}
	}
	return CT_OK;
}

int sched_pipeline(const struct sched *naive, enum model_ac ac, int ac_every, const char *buckets,
                   int64_t bucket_cap_bytes, const struct sched_reorder_opts *o,
                   const struct sched_cost_model *cm, struct sched *out,
                   struct sched_auto_report *report)
{
	struct sched passed;
	int rc = pipeline_passes(naive, ac, ac_every, buckets, bucket_cap_bytes, o, cm, &passed, report);
	if (rc)
		return rc;
	sched_lower_tp(&passed, out); /* last: the passes move whole units */
	sched_free(&passed);
	return CT_OK;
}
