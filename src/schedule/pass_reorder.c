/* schedule/pass_reorder: overlap communication with compute by moving collectives.
 *
 * Prefetch: the j-th all-gather of the step is issued right after the WAIT of the
 * (j - prefetch)-th one — i.e. before the compute of the bucket that gather is for, so it
 * runs on the comm stream while that bucket computes — but never before the FREE of the
 * bucket's previous gather, and never ahead of an earlier gather (the stream is FIFO, and
 * the next needed bucket goes first). Deferral: the WAIT of the k-th reduce-scatter moves to
 * just before the (k + rs_defer)-th one is issued (or before the bucket's next
 * reduce-scatter, or CLIP), so backward compute continues while it runs.
 *
 * Each prefetch holds a receive buffer longer; with a memory budget and a cost model, the
 * depth of each all-gather is lowered (greedily, in order) until the predicted peak fits. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_pass.h"

static bool is_ag_wait(const struct sched_node *n)
{
	return n->kind == SCHED_WAIT && n->wait_kind == SCHED_ALL_GATHER;
}

/* Emit `in` with all-gather j placed after node after[j] (-1: at the start). */
static void emit_prefetched(const struct sched *in, const int *ag, const int *after, int K,
                            struct sched *out)
{
	sched_init_like(out, in);
	int j = 0;
	bool *moved = xcalloc((size_t)in->n_nodes, sizeof(bool));
	for (int k = 0; k < K; k++)
		moved[ag[k]] = true;
	for (; j < K && after[j] < 0; j++)
		sched_push(out, in->nodes[ag[j]]);
	for (int i = 0; i < in->n_nodes; i++) {
		if (!moved[i])
			sched_push(out, in->nodes[i]);
		for (; j < K && after[j] <= i; j++)
			sched_push(out, in->nodes[ag[j]]);
	}
	free(moved);
}

static void prefetch(const struct sched *in, const struct sched_reorder_opts *o,
                     const struct sched_cost_model *cm, struct sched *out)
{
	int K = 0, n = in->n_nodes;
	int *ag = xcalloc((size_t)n, sizeof(int)), *wait = xcalloc((size_t)n, sizeof(int));
	int *floor = xcalloc((size_t)n, sizeof(int)), *after = xcalloc((size_t)n, sizeof(int));
	/* one pass each way: the latest FREE of the gather's bucket before it (its floor) and
	 * the gather's WAIT after it; O(nodes) so the automatic search can afford many plans */
	int *last_free = xcalloc((size_t)in->n_buckets, sizeof(int));
	int *pending = xcalloc((size_t)in->n_buckets, sizeof(int));
	for (int b = 0; b < in->n_buckets; b++)
		last_free[b] = -1;
	for (int i = 0; i < n; i++) {
		const struct sched_node *q = &in->nodes[i];
		if (q->kind == SCHED_FREE)
			last_free[q->bucket] = i;
		if (is_ag_wait(q))
			wait[pending[q->bucket]] = i;
		if (q->kind != SCHED_ALL_GATHER)
			continue;
		ag[K] = i;
		floor[K] = last_free[q->bucket];
		pending[q->bucket] = K;
		K++;
	}
	free(last_free), free(pending);
	for (int j = 0; j < K; j++) {
		int prev = j > 0 ? after[j - 1] : -1;
		for (int d = o->prefetch; d >= 0; d--) {
			int a = d == 0 ? ag[j] - 1 : (j - d >= 0 ? wait[j - d] : -1);
			if (a < floor[j])
				a = floor[j];
			if (a < prev)
				a = prev;
			if (a > ag[j] - 1)
				a = ag[j] - 1;
			after[j] = a;
			if (d == 0 || !cm || o->memory_bytes <= 0)
				break;
			/* budget: try this depth with the later gathers still at their places */
			for (int k = j + 1; k < K; k++)
				after[k] = ag[k] - 1;
			struct sched t;
			emit_prefetched(in, ag, after, K, &t);
			struct sched_prediction pr;
			sched_predict(&t, cm, &pr, NULL);
			sched_free(&t);
			if (pr.peak_bytes <= o->memory_bytes)
				break;
		}
	}
	emit_prefetched(in, ag, after, K, out);
	free(ag), free(wait), free(floor), free(after);
}

static void defer_rs_waits(const struct sched *in, int defer, struct sched *out)
{
	int n = in->n_nodes;
	int *target = xcalloc((size_t)n, sizeof(int)); /* WAIT RS node -> emit before this node */
	bool *moved = xcalloc((size_t)n, sizeof(bool));
	int *first = xcalloc((size_t)n, sizeof(int)), *next = xcalloc((size_t)n, sizeof(int));
	for (int i = 0; i < n; i++) {
		const struct sched_node *w = &in->nodes[i];
		if (w->kind != SCHED_WAIT || w->wait_kind != SCHED_REDUCE_SCATTER || defer <= 0)
			continue;
		int seen = 0, t = n - 1;
		for (int p = i + 1; p < n; p++) {
			const struct sched_node *q = &in->nodes[p];
			if (q->kind == SCHED_CLIP || q->kind == SCHED_OPTIM) {
				t = p;
				break;
			}
			if (q->kind != SCHED_REDUCE_SCATTER)
				continue;
			if (++seen == defer || q->bucket == w->bucket) {
				t = p;
				break;
			}
		}
		target[i] = t;
		moved[i] = true;
	}
	/* per target node, the waits to emit before it, in their original order */
	for (int i = 0; i < n; i++)
		first[i] = -1;
	for (int k = n - 1; k >= 0; k--)
		if (moved[k]) {
			next[k] = first[target[k]];
			first[target[k]] = k;
		}
	sched_init_like(out, in);
	for (int i = 0; i < n; i++) {
		for (int k = first[i]; k >= 0; k = next[k])
			sched_push(out, in->nodes[k]);
		if (!moved[i])
			sched_push(out, in->nodes[i]);
	}
	free(target), free(moved), free(first), free(next);
}

void sched_pass_reorder(const struct sched *in, const struct sched_reorder_opts *o,
                        const struct sched_cost_model *cm, struct sched *out)
{
	struct sched mid;
	prefetch(in, o, cm, &mid);
	defer_rs_waits(&mid, o->rs_defer, out);
	out->prefetch = o->prefetch;
	sched_free(&mid);
}
