/* schedule: nodes, the naive builder, validation and printing. */
#include "schedule/schedule.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static const char *const sched_kind_names[] = {
    "BATCH", "AG",    "RS",    "WAIT",   "FREE",    "FWD", "BWD", "RECOMPUTE",
    "CLIP",  "OPTIM", "TP-AG", "TP-RS", "CP-AG", "CP-RS", "CP-RING", "EP-A2A",  "EP-WAIT", "F", "B",
    "I",     "W",     "SEND",  "RECV"};
_Static_assert(sizeof(sched_kind_names) / sizeof(sched_kind_names[0]) == SCHED_KIND_COUNT,
               "one name per node kind");

static const char *const sched_ac_names[] = {"none", "ffn", "selective", "full", "per-layer"};
_Static_assert(sizeof(sched_ac_names) / sizeof(sched_ac_names[0]) == MODEL_AC_COUNT,
               "one name per activation-checkpointing mode");

const char *sched_kind_name(enum sched_kind k)
{
	return k < SCHED_KIND_COUNT ? sched_kind_names[k] : "?";
}

const char *sched_ac_name(enum model_ac a)
{
	return a < MODEL_AC_COUNT ? sched_ac_names[a] : "?";
}

const char *sched_ac_label(enum model_ac a, int every, char *buf, size_t n)
{
	if (a == MODEL_AC_LAYER) {
		int t = every % 100, o = every % 10;
		const char *th = t >= 11 && t <= 13 ? "th"
		                 : o == 1           ? "st"
		                 : o == 2           ? "nd"
		                 : o == 3           ? "rd"
		                                    : "th";
		snprintf(buf, n, "per-layer (full on every %d%s block, none on the others)", every, th);
	}
	else
		snprintf(buf, n, "%s", sched_ac_name(a));
	return buf;
}

int sched_ac_parse(const char *name, enum model_ac *a)
{
	for (int i = 0; i < MODEL_AC_LAYER; i++) /* per-layer is selective with a number */
		if (strcmp(name, sched_ac_names[i]) == 0) {
			*a = (enum model_ac)i;
			return CT_OK;
		}
	LOG_ERROR("activation_checkpoint.mode: unknown '%s' (none, ffn, selective, full)", name);
	return CT_ERR_USAGE;
}

/* ---------------------------------------------------------------- containers */

void sched_push(struct sched *s, struct sched_node n)
{
	if (s->n_nodes == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		s->nodes = realloc(s->nodes, (size_t)s->cap * sizeof(*s->nodes));
		CHECK(s->nodes, "out of memory");
	}
	s->nodes[s->n_nodes++] = n;
}

void sched_init_like(struct sched *dst, const struct sched *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->n_units = src->n_units;
	dst->n_micro = src->n_micro;
	dst->reshard = src->reshard;
	dst->ac = src->ac;
	dst->ac_every = src->ac_every;
	dst->prefetch = src->prefetch;
	dst->lowered = src->lowered;
	dst->n_stages = src->n_stages;
	dst->pp_size = src->pp_size;
	dst->pp_rank = src->pp_rank;
	dst->forward_only = src->forward_only;
	dst->units = xcalloc((size_t)src->n_units, sizeof(*dst->units));
	memcpy(dst->units, src->units, (size_t)src->n_units * sizeof(*dst->units));
	dst->n_buckets = src->n_buckets;
	dst->buckets = xcalloc((size_t)src->n_buckets, sizeof(*dst->buckets));
	memcpy(dst->buckets, src->buckets, (size_t)src->n_buckets * sizeof(*dst->buckets));
}

void sched_copy(struct sched *dst, const struct sched *src)
{
	sched_init_like(dst, src);
	for (int i = 0; i < src->n_nodes; i++)
		sched_push(dst, src->nodes[i]);
}

void sched_free(struct sched *s)
{
	free(s->units);
	free(s->buckets);
	free(s->nodes);
	memset(s, 0, sizeof(*s));
}

void sched_replace(struct sched *s, struct sched *next)
{
	sched_free(s);
	*s = *next;
	memset(next, 0, sizeof(*next));
}

int64_t sched_bucket_full(const struct sched *s, int b)
{
	int64_t n = 0;
	for (int u = s->buckets[b].unit0; u < s->buckets[b].unit0 + s->buckets[b].n_units; u++)
		n += s->units[u].full_numel;
	return n;
}

int64_t sched_bucket_shard(const struct sched *s, int b)
{
	int64_t n = 0;
	for (int u = s->buckets[b].unit0; u < s->buckets[b].unit0 + s->buckets[b].n_units; u++)
		n += s->units[u].shard_numel;
	return n;
}

int sched_bucket_of(const struct sched *s, int u)
{
	for (int b = 0; b < s->n_buckets; b++)
		if (u >= s->buckets[b].unit0 && u < s->buckets[b].unit0 + s->buckets[b].n_units)
			return b;
	CHECK(false, "schedule: unit %d is in no bucket", u);
}

/* ---------------------------------------------------------------- builder */

static struct sched_node node(enum sched_kind k, int unit, int bucket, int micro,
                              enum sched_phase ph)
{
	struct sched_node n = {.kind = k,
	                       .wait_kind = SCHED_ALL_GATHER,
	                       .unit = unit,
	                       .bucket = bucket,
	                       .micro = micro,
	                       .phase = ph};
	n.pass = sched_node_pass(&n);
	return n;
}

enum model_pass sched_node_pass(const struct sched_node *n)
{
	switch (n->kind) {
	case SCHED_BWD:
		return MODEL_PASS_BWD;
	case SCHED_RECOMPUTE:
		return MODEL_PASS_REC;
	case SCHED_TP_ALL_GATHER:
	case SCHED_TP_REDUCE_SCATTER:
	case SCHED_CP_ALL_GATHER:
	case SCHED_CP_REDUCE_SCATTER:
	case SCHED_CP_RING:
	case SCHED_EP_ALL_TO_ALL:
	case SCHED_EP_WAIT:
		return n->pass;
	default:
		return MODEL_PASS_FWD;
	}
}

const struct model_prog *sched_node_prog(const struct sched *s, const struct sched_node *n)
{
	return &s->units[n->unit].prog[sched_node_pass(n)];
}

/* The node kind that runs a program collective. */
static enum sched_kind sched_coll_kind(const struct model_coll_desc *c)
{
	if (c->role == MODEL_GROUP_CP)
		return c->ring                                 ? SCHED_CP_RING
		       : c->kind == MODEL_COLL_REDUCE_SCATTER ? SCHED_CP_REDUCE_SCATTER
		                                              : SCHED_CP_ALL_GATHER;
	switch (c->kind) {
	case MODEL_COLL_ALL_GATHER:
		return SCHED_TP_ALL_GATHER;
	case MODEL_COLL_REDUCE_SCATTER:
		return SCHED_TP_REDUCE_SCATTER;
	case MODEL_COLL_ALL_TO_ALL:
		return SCHED_EP_ALL_TO_ALL;
	default:
		return SCHED_EP_WAIT;
	}
}

void sched_lower_tp(const struct sched *in, struct sched *out)
{
	sched_init_like(out, in);
	out->lowered = true;
	for (int i = 0; i < in->n_nodes; i++) {
		struct sched_node n = in->nodes[i];
		bool compute =
		    n.kind == SCHED_FWD || n.kind == SCHED_BWD || n.kind == SCHED_RECOMPUTE;
		const struct model_prog *g = compute ? sched_node_prog(in, &n) : NULL;
		if (in->lowered || !g || g->n == 0) {
			sched_push(out, n);
			continue;
		}
		for (int k = 0; k <= g->n; k++) {
			struct sched_node c = n;
			c.seg = k;
			sched_push(out, c);
			if (k == g->n)
				break;
			struct sched_node t = n;
			t.kind = sched_coll_kind(&g->c[k]);
			t.pass = sched_node_pass(&n);
			t.seg = k;
			sched_push(out, t);
		}
	}
}

static bool reshard_after_forward(const struct sched *s, int b)
{
	if (s->reshard == SCHED_RESHARD_NEVER)
		return false;
	if (s->reshard == SCHED_RESHARD_ALWAYS)
		return true;
	/* backward needs the last unit at once: keep its bucket (TorchTitan's default) */
	return s->buckets[b].unit0 + s->buckets[b].n_units < s->n_units;
}

void sched_place_gathers(const struct sched *in, struct sched *out)
{
	sched_init_like(out, in);
	bool *resident = xcalloc((size_t)in->n_buckets, sizeof(bool));
	for (int i = 0; i < in->n_nodes; i++) {
		struct sched_node n = in->nodes[i];
		if (n.kind == SCHED_ALL_GATHER || n.kind == SCHED_FREE ||
		    (n.kind == SCHED_WAIT && n.wait_kind == SCHED_ALL_GATHER))
			continue;
		if (n.kind == SCHED_FWD || n.kind == SCHED_BWD || n.kind == SCHED_RECOMPUTE) {
			int b = sched_bucket_of(in, n.unit);
			if (!resident[b]) {
				struct sched_node ag =
				    node(SCHED_ALL_GATHER, -1, b, n.micro, n.phase);
				ag.recompute = n.phase == SCHED_PH_BWD;
				sched_push(out, ag);
				sched_push(out, node(SCHED_WAIT, -1, b, n.micro, n.phase));
				resident[b] = true;
			}
			sched_push(out, n);
			const struct sched_bucket *bk = &in->buckets[b];
			if (n.kind == SCHED_FWD && n.unit == bk->unit0 + bk->n_units - 1 &&
			    reshard_after_forward(in, b)) {
				sched_push(out, node(SCHED_FREE, -1, b, n.micro, SCHED_PH_FWD));
				resident[b] = false;
			}
			continue;
		}
		if (n.kind == SCHED_CLIP)
			for (int b = 0; b < in->n_buckets; b++)
				if (resident[b]) {
					sched_push(out,
					           node(SCHED_FREE, -1, b, n.micro, SCHED_PH_TAIL));
					resident[b] = false;
				}
		sched_push(out, n);
		if (n.kind == SCHED_REDUCE_SCATTER && in->reshard != SCHED_RESHARD_NEVER) {
			sched_push(out, node(SCHED_FREE, -1, n.bucket, n.micro, SCHED_PH_BWD));
			resident[n.bucket] = false;
		}
	}
	free(resident);
}

void sched_build(struct sched *s, const struct sched_unit *units, int n_units, int n_micro,
                 enum sched_reshard reshard)
{
	struct sched c;
	memset(&c, 0, sizeof(c));
	c.n_units = n_units;
	c.n_micro = n_micro;
	c.reshard = reshard;
	c.units = xcalloc((size_t)n_units, sizeof(*c.units));
	memcpy(c.units, units, (size_t)n_units * sizeof(*units));
	c.n_buckets = n_units;
	c.buckets = xcalloc((size_t)n_units, sizeof(*c.buckets));
	for (int u = 0; u < n_units; u++)
		c.buckets[u] = (struct sched_bucket){u, 1};
	/* compute and gradient reduction; the gathers follow from the reshard policy */
	for (int a = 0; a < n_micro; a++) {
		sched_push(&c, node(SCHED_BATCH, -1, -1, a, SCHED_PH_FWD));
		for (int u = 0; u < n_units; u++)
			sched_push(&c, node(SCHED_FWD, u, -1, a, SCHED_PH_FWD));
		for (int u = n_units - 1; u >= 0; u--) {
			sched_push(&c, node(SCHED_BWD, u, -1, a, SCHED_PH_BWD));
			sched_push(&c, node(SCHED_REDUCE_SCATTER, -1, u, a, SCHED_PH_BWD));
			struct sched_node w = node(SCHED_WAIT, -1, u, a, SCHED_PH_BWD);
			w.wait_kind = SCHED_REDUCE_SCATTER;
			sched_push(&c, w);
		}
	}
	sched_push(&c, node(SCHED_CLIP, -1, -1, n_micro - 1, SCHED_PH_TAIL));
	sched_push(&c, node(SCHED_OPTIM, -1, -1, n_micro - 1, SCHED_PH_TAIL));
	sched_place_gathers(&c, s);
	sched_free(&c);
}

/* ---------------------------------------------------------------- validation */

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		if (why)                                                                           \
			snprintf(why, why_size, __VA_ARGS__);                                      \
		ok = false;                                                                        \
		goto out;                                                                          \
	} while (0)

bool sched_validate(const struct sched *s, char *why, size_t why_size)
{
	if (s->n_stages > 0)
		return sched_validate_pp(s, why, why_size);
	bool ok = true;
	int B = s->n_buckets, U = s->n_units;
	bool *ag = xcalloc((size_t)B, sizeof(bool)), *res = xcalloc((size_t)B, sizeof(bool));
	bool *rs = xcalloc((size_t)B, sizeof(bool));
	int *bwd_pending = xcalloc((size_t)B, sizeof(int)); /* BWDs not yet reduce-scattered */
	int *fwd_done = xcalloc((size_t)U, sizeof(int)),
	    *bwd_done = xcalloc((size_t)U, sizeof(int));
	int cur_micro = -1, next_bwd = -1;
	/* lowered: the unit pass whose program is under way, and the op it expects next */
	int open_u = -1, open_op = 0;
	enum model_pass open_pass = MODEL_PASS_FWD;
	/* buckets tile the units in order */
	for (int b = 0, u = 0; b < B; u += s->buckets[b].n_units, b++)
		if (s->buckets[b].unit0 != u || s->buckets[b].n_units < 1 ||
		    u + s->buckets[b].n_units > U)
			FAIL("buckets do not tile the units in order at bucket %d", b);
	for (int i = 0; i < s->n_nodes; i++) {
		const struct sched_node *n = &s->nodes[i];
		char lab[48];
		sched_node_label(s, i, lab, sizeof(lab));
		int b = n->bucket, u = n->unit;
		if (n->kind == SCHED_ALL_GATHER || n->kind == SCHED_REDUCE_SCATTER ||
		    n->kind == SCHED_WAIT || n->kind == SCHED_FREE) {
			if (b < 0 || b >= B)
				FAIL("node %d (%s): bad bucket", i, lab);
		}
		bool compute =
		    n->kind == SCHED_FWD || n->kind == SCHED_BWD || n->kind == SCHED_RECOMPUTE;
		bool tp = sched_kind_in_unit(n->kind);
		if ((compute || tp) && (u < 0 || u >= U))
			FAIL("node %d (%s): bad unit", i, lab);
		if (tp && !s->lowered)
			FAIL("node %d (%s): a unit's collective in a schedule not lowered", i, lab);
		if (s->lowered && (compute || tp)) {
			const struct model_prog *g = sched_node_prog(s, n);
			int op = compute ? 2 * n->seg : 2 * n->seg + 1;
			bool starts = compute && n->seg == 0;
			if (starts && open_u >= 0)
				FAIL("node %d (%s): unit %d's program is not finished", i, lab,
				     open_u);
			if (!starts &&
			    (open_u != u || open_pass != sched_node_pass(n) || open_op != op))
				FAIL("node %d (%s): out of its unit's program", i, lab);
			if (n->seg < 0 || n->seg > g->n || (tp && n->seg >= g->n))
				FAIL("node %d (%s): the program has %d collectives", i, lab, g->n);
			if (tp && n->kind != sched_coll_kind(&g->c[n->seg]))
				FAIL("node %d (%s): the program's collective %d is of another kind",
				     i, lab, n->seg);
			if (tp && n->kind == SCHED_EP_WAIT &&
			    (n->seg == 0 || g->c[n->seg - 1].kind != MODEL_COLL_ALL_TO_ALL ||
			     !g->c[n->seg - 1].post))
				FAIL("node %d (%s): a wait with no posted all-to-all before it", i,
				     lab);
			if (tp && n->kind == SCHED_EP_ALL_TO_ALL && g->c[n->seg].post &&
			    (n->seg + 1 >= g->n || g->c[n->seg + 1].kind != MODEL_COLL_WAIT))
				FAIL("node %d (%s): a posted all-to-all its program never waits for",
				     i, lab);
			open_u = op == 2 * g->n ? -1 : u;
			open_pass = sched_node_pass(n);
			open_op = op + 1;
			if (tp || n->seg > 0) { /* the unit's order was checked at segment 0 */
				if (!res[sched_bucket_of(s, u)])
					FAIL("node %d (%s): parameters freed inside the unit", i,
					     lab);
				continue;
			}
		} else if (open_u >= 0 && (n->kind == SCHED_BATCH || n->kind == SCHED_CLIP ||
		                           n->kind == SCHED_OPTIM)) {
			FAIL("node %d (%s): unit %d's program is not finished", i, lab, open_u);
		}
		if (compute) {
			if (!res[sched_bucket_of(s, u)])
				FAIL("node %d (%s): parameters not gathered", i, lab);
			if (cur_micro < 0)
				FAIL("node %d (%s): before any BATCH", i, lab);
		}
		switch (n->kind) {
		case SCHED_BATCH:
			for (int v = 0; v < U; v++)
				if (cur_micro >= 0 && (fwd_done[v] != 1 || bwd_done[v] != 1))
					FAIL("node %d (%s): micro-batch %d incomplete at unit %d",
					     i, lab, cur_micro, v);
			memset(fwd_done, 0, (size_t)U * sizeof(int));
			memset(bwd_done, 0, (size_t)U * sizeof(int));
			cur_micro = n->micro;
			next_bwd = U - 1;
			break;
		case SCHED_ALL_GATHER:
			if (ag[b] || res[b])
				FAIL("node %d (%s): bucket already gathered or in flight", i, lab);
			ag[b] = true;
			break;
		case SCHED_REDUCE_SCATTER:
			if (rs[b])
				FAIL("node %d (%s): previous reduce-scatter not waited", i, lab);
			if (bwd_pending[b] != s->buckets[b].n_units)
				FAIL("node %d (%s): %d of %d backward units done", i, lab,
				     bwd_pending[b], s->buckets[b].n_units);
			bwd_pending[b] = 0;
			rs[b] = true;
			break;
		case SCHED_WAIT:
			if (n->wait_kind == SCHED_ALL_GATHER) {
				if (!ag[b])
					FAIL("node %d (%s): no all-gather in flight", i, lab);
				ag[b] = false;
				res[b] = true;
			} else {
				if (!rs[b])
					FAIL("node %d (%s): no reduce-scatter in flight", i, lab);
				rs[b] = false;
			}
			break;
		case SCHED_FREE:
			if (!res[b])
				FAIL("node %d (%s): bucket not gathered", i, lab);
			res[b] = false;
			break;
		case SCHED_FWD:
			if (fwd_done[u] || (u > 0 && !fwd_done[u - 1]))
				FAIL("node %d (%s): out of order", i, lab);
			fwd_done[u] = 1;
			break;
		case SCHED_RECOMPUTE:
			if (!fwd_done[u] || bwd_done[u])
				FAIL("node %d (%s): not between forward and backward", i, lab);
			break;
		case SCHED_BWD:
			if (u != next_bwd || fwd_done[U - 1] != 1)
				FAIL("node %d (%s): out of order", i, lab);
			bwd_done[u] = 1;
			bwd_pending[sched_bucket_of(s, u)]++;
			next_bwd--;
			break;
		case SCHED_CLIP:
		case SCHED_OPTIM:
			for (int c = 0; c < B; c++)
				if (ag[c] || rs[c] || res[c] || bwd_pending[c])
					FAIL("node %d (%s): bucket %d still busy", i, lab, c);
			break;
		default:
			FAIL("node %d: unknown kind", i);
		}
	}
	if (s->n_nodes < 2 || s->nodes[s->n_nodes - 1].kind != SCHED_OPTIM)
		FAIL("the step does not end with OPTIM");
out:
	free(ag), free(res), free(rs), free(bwd_pending), free(fwd_done), free(bwd_done);
	return ok;
}

/* ---------------------------------------------------------------- printing */

void sched_bucket_name(const struct sched *s, int b, char *buf, size_t size)
{
	size_t at = 0;
	buf[0] = 0;
	for (int u = s->buckets[b].unit0; u < s->buckets[b].unit0 + s->buckets[b].n_units; u++) {
		char one[16];
		if (u == 0)
			snprintf(one, sizeof(one), "embed");
		else if (u == s->n_units - 1)
			snprintf(one, sizeof(one), "norm");
		else
			snprintf(one, sizeof(one), "%d", u - 1);
		int w = snprintf(buf + at, size - at, "%s%s", at ? "+" : "", one);
		if (w < 0 || (size_t)w >= size - at)
			break;
		at += (size_t)w;
	}
}

/* A pipeline node as the action lists write it: "1F3", "0SEND_F3", "1RECV_B2". */
static void sched_pp_label(enum sched_kind k, const struct sched_node *n, char *buf, size_t size)
{
	if (k == SCHED_PP_SEND || k == SCHED_PP_RECV)
		snprintf(buf, size, "%d%s_%c%d", n->stage, sched_kind_name(k),
		         n->phase == SCHED_PH_BWD ? 'B' : 'F', n->micro);
	else
		snprintf(buf, size, "%d%s%d", n->stage, sched_kind_name(k), n->micro);
}

void sched_node_label(const struct sched *s, int i, char *buf, size_t size)
{
	const struct sched_node *n = &s->nodes[i];
	switch (n->kind) {
	case SCHED_FWD:
	case SCHED_BWD:
	case SCHED_RECOMPUTE:
		if (s->lowered && sched_node_prog(s, n)->n > 0)
			snprintf(buf, size, "%s u%d.%d", sched_kind_name(n->kind), n->unit, n->seg);
		else
			snprintf(buf, size, "%s u%d", sched_kind_name(n->kind), n->unit);
		break;
	case SCHED_TP_ALL_GATHER:
	case SCHED_TP_REDUCE_SCATTER:
	case SCHED_CP_ALL_GATHER:
	case SCHED_CP_REDUCE_SCATTER:
	case SCHED_CP_RING:
	case SCHED_EP_ALL_TO_ALL:
	case SCHED_EP_WAIT: {
		static const char *const pass[] = {"fwd", "bwd", "rec"};
		snprintf(buf, size, "%s u%d %s.%d", sched_kind_name(n->kind), n->unit,
		         pass[n->pass], n->seg);
		break;
	}
	case SCHED_ALL_GATHER:
	case SCHED_REDUCE_SCATTER:
	case SCHED_FREE:
		snprintf(buf, size, "%s b%d%s", sched_kind_name(n->kind), n->bucket,
		         n->recompute ? " (recomputed)" : "");
		break;
	case SCHED_WAIT:
		if (sched_kind_pp(n->wait_kind)) {
			char t[40];
			sched_pp_label(n->wait_kind, n, t, sizeof(t));
			snprintf(buf, size, "WAIT %s", t);
		} else {
			snprintf(buf, size, "WAIT %s b%d", sched_kind_name(n->wait_kind),
			         n->bucket);
		}
		break;
	case SCHED_PP_F:
	case SCHED_PP_B:
	case SCHED_PP_I:
	case SCHED_PP_W:
	case SCHED_PP_SEND:
	case SCHED_PP_RECV:
		sched_pp_label(n->kind, n, buf, size);
		break;
	case SCHED_BATCH:
		snprintf(buf, size, "BATCH %d", n->micro);
		break;
	default:
		snprintf(buf, size, "%s", sched_kind_name(n->kind));
	}
}

void sched_print(const struct sched *s, FILE *f, bool brief)
{
	fprintf(f, "buckets (%d):", s->n_buckets);
	for (int b = 0; b < s->n_buckets; b++) {
		char name[256];
		sched_bucket_name(s, b, name, sizeof(name));
		fprintf(f, "%s%s", b ? ", " : " ", name);
	}
	char ac[96];
	fprintf(f, "\nnodes (%d; activation checkpointing %s, prefetch %d):\n", s->n_nodes,
	        sched_ac_label(s->ac, s->ac_every, ac, sizeof(ac)), s->prefetch);
	int shown = 0;
	for (int i = 0; i < s->n_nodes; i++) {
		const struct sched_node *n = &s->nodes[i];
		if (brief && n->micro > 0 && n->phase != SCHED_PH_TAIL)
			continue;
		char lab[64];
		sched_node_label(s, i, lab, sizeof(lab));
		fprintf(f, "%s%s", shown % 8 ? " | " : "  ", lab);
		if (++shown % 8 == 0)
			fputc('\n', f);
	}
	if (shown % 8)
		fputc('\n', f);
	if (brief && s->n_micro > 1)
		fprintf(f, "  (micro-batches 1..%d repeat micro-batch 0)\n", s->n_micro - 1);
}
