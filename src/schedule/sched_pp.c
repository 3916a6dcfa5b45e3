/* schedule/sched_pp: a pipeline rank's step as schedule nodes (its action list lowered onto
 * the one node list the executor, the cost model and the traces read), and its check. */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "schedule/pp_schedule.h"
#include "schedule/schedule.h"

static struct sched_node pp_node(enum sched_kind k, int stage, int micro, enum sched_phase ph,
                                 int bucket)
{
	return (struct sched_node){.kind = k,
	                           .wait_kind = SCHED_ALL_GATHER,
	                           .unit = -1,
	                           .bucket = bucket,
	                           .micro = micro,
	                           .phase = ph,
	                           .stage = stage};
}

static struct sched_node pp_wait(enum sched_kind k, int stage, int micro, enum sched_phase ph)
{
	struct sched_node n = pp_node(SCHED_WAIT, stage, micro, ph, -1);
	n.wait_kind = k;
	return n;
}

static struct sched_node bucket_node(enum sched_kind k, int b, enum sched_phase ph)
{
	struct sched_node n = pp_node(k, 0, 0, ph, b);
	if (k == SCHED_WAIT)
		n.wait_kind = ph == SCHED_PH_FWD ? SCHED_ALL_GATHER : SCHED_REDUCE_SCATTER;
	return n;
}

void sched_build_pp(struct sched *out, const struct pp_sched *ps, int rank,
                    const struct sched_unit *units, int n_units, const int *stage_u0)
{
	memset(out, 0, sizeof(*out));
	out->n_units = n_units;
	out->n_micro = ps->n_micro;
	out->reshard = SCHED_RESHARD_NEVER; /* gathered once per step, TorchTitan's PP policy */
	out->units = xcalloc((size_t)n_units, sizeof(*out->units));
	memcpy(out->units, units, (size_t)n_units * sizeof(*units));
	out->n_stages = ps->n_stages;
	out->pp_size = ps->p;
	out->pp_rank = rank;
	out->n_buckets = ps->v;
	out->buckets = xcalloc((size_t)ps->v, sizeof(*out->buckets));
	for (int c = 0; c < ps->v; c++) {
		int st = c * ps->p + rank;
		out->buckets[c] = (struct sched_bucket){stage_u0[st], stage_u0[st + 1] - stage_u0[st]};
	}
	for (int c = 0; c < ps->v; c++)
		sched_push(out, bucket_node(SCHED_ALL_GATHER, c, SCHED_PH_FWD));
	for (int c = 0; c < ps->v; c++)
		sched_push(out, bucket_node(SCHED_WAIT, c, SCHED_PH_FWD));
	/* the sends in issue order, waited for after the last action */
	struct sched_node *sends = xcalloc((size_t)ps->n[rank] + 1, sizeof(*sends));
	int n_sends = 0;
	for (int i = 0; i < ps->n[rank]; i++) {
		const struct pp_action *a = &ps->a[rank][i];
		int c = a->stage / ps->p, st = a->stage, m = a->micro;
		bool recv_f = st > 0 && pp_stage_rank(ps, st - 1) != rank;
		bool recv_b = st < ps->n_stages - 1 && pp_stage_rank(ps, st + 1) != rank;
		switch (a->kind) {
		case PP_F:
			if (recv_f)
				sched_push(out, pp_wait(SCHED_PP_RECV, st, m, SCHED_PH_FWD));
			sched_push(out, pp_node(SCHED_PP_F, st, m, SCHED_PH_FWD, c));
			break;
		case PP_B:
		case PP_I:
			if (recv_b)
				sched_push(out, pp_wait(SCHED_PP_RECV, st, m, SCHED_PH_BWD));
			sched_push(out, pp_node(a->kind == PP_B ? SCHED_PP_B : SCHED_PP_I, st, m,
			                        SCHED_PH_BWD, c));
			break;
		case PP_W:
			sched_push(out, pp_node(SCHED_PP_W, st, m, SCHED_PH_BWD, c));
			break;
		case PP_SEND_F:
		case PP_SEND_B: {
			enum sched_phase ph = a->kind == PP_SEND_F ? SCHED_PH_FWD : SCHED_PH_BWD;
			sched_push(out, pp_node(SCHED_PP_SEND, st, m, ph, c));
			sends[n_sends++] = pp_wait(SCHED_PP_SEND, st, m, ph);
			break;
		}
		case PP_RECV_F:
		case PP_RECV_B:
			sched_push(out, pp_node(SCHED_PP_RECV, st, m,
			                        a->kind == PP_RECV_F ? SCHED_PH_FWD : SCHED_PH_BWD, c));
			break;
		default:
			CHECK(false, "pipeline: action kind %d", a->kind);
		}
	}
	for (int i = 0; i < n_sends; i++)
		sched_push(out, sends[i]);
	free(sends);
	out->forward_only = ps->forward_only;
	if (ps->forward_only) /* an evaluation: nothing to reduce or update */
		return;
	for (int c = 0; c < ps->v; c++)
		sched_push(out, bucket_node(SCHED_REDUCE_SCATTER, c, SCHED_PH_BWD));
	for (int c = 0; c < ps->v; c++)
		sched_push(out, bucket_node(SCHED_WAIT, c, SCHED_PH_BWD));
	sched_push(out, pp_node(SCHED_CLIP, 0, 0, SCHED_PH_TAIL, -1));
	sched_push(out, pp_node(SCHED_OPTIM, 0, 0, SCHED_PH_TAIL, -1));
}

/* ---------------------------------------------------------------- checking */

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		if (why)                                                                           \
			snprintf(why, why_size, __VA_ARGS__);                                      \
		ok = false;                                                                        \
		goto out;                                                                          \
	} while (0)

/* State per (virtual stage, micro-batch): what has happened to it so far. */
enum {
	PPS_F = 1 << 0,
	PPS_B = 1 << 1, /* B, or I */
	PPS_W = 1 << 2,
	PPS_RECV_F = 1 << 3, /* issued */
	PPS_RECV_B = 1 << 4,
	PPS_GOT_F = 1 << 5, /* waited */
	PPS_GOT_B = 1 << 6,
	PPS_SEND_F = 1 << 7,
	PPS_SEND_B = 1 << 8,
	PPS_SENT_F = 1 << 9,
	PPS_SENT_B = 1 << 10,
};

bool sched_validate_pp(const struct sched *s, char *why, size_t why_size)
{
	bool ok = true;
	int V = s->n_buckets, M = s->n_micro, S = s->n_stages, p = s->pp_size, r = s->pp_rank;
	int *st = xcalloc((size_t)(V > 0 ? V : 1) * (size_t)(M > 0 ? M : 1), sizeof(int));
	bool *ag = xcalloc((size_t)V + 1, sizeof(bool)), *res = xcalloc((size_t)V + 1, sizeof(bool));
	bool *rs = xcalloc((size_t)V + 1, sizeof(bool)), *reduced = xcalloc((size_t)V + 1, sizeof(bool));
	bool split = false, tail = false;
	if (p < 1 || S != V * p || r < 0 || r >= p)
		FAIL("pipeline: %d stages, %d virtual stages on rank %d of %d", S, V, r, p);
	for (int c = 0; c < V; c++)
		if (s->buckets[c].n_units < 1 || s->buckets[c].unit0 < 0 ||
		    s->buckets[c].unit0 + s->buckets[c].n_units > s->n_units)
			FAIL("pipeline: virtual stage %d's units out of range", c);
	for (int i = 0; i < s->n_nodes; i++) {
		const struct sched_node *n = &s->nodes[i];
		char lab[48];
		sched_node_label(s, i, lab, sizeof(lab));
		enum sched_kind k = n->kind == SCHED_WAIT ? n->wait_kind : n->kind;
		if (sched_kind_pp(k)) {
			if (n->stage < 0 || n->stage >= S || n->stage % p != r || n->micro < 0 ||
			    n->micro >= M)
				FAIL("node %d (%s): stage or micro-batch not of this rank", i, lab);
			if (tail)
				FAIL("node %d (%s): after the reduce-scatter", i, lab);
		}
		int c = sched_kind_pp(k) ? n->stage / p : n->bucket;
		int *f = sched_kind_pp(k) ? &st[c * M + n->micro] : NULL;
		bool fwd = n->phase == SCHED_PH_FWD;
		if (sched_kind_pp_compute(n->kind) && !res[c])
			FAIL("node %d (%s): parameters not gathered", i, lab);
		if (s->forward_only &&
		    ((sched_kind_pp(k) && !fwd) || n->kind == SCHED_REDUCE_SCATTER ||
		     n->kind == SCHED_CLIP || n->kind == SCHED_OPTIM))
			FAIL("node %d (%s): in a forward-only step", i, lab);
		switch (n->kind) {
		case SCHED_ALL_GATHER:
		case SCHED_REDUCE_SCATTER:
			if (c < 0 || c >= V)
				FAIL("node %d (%s): bad bucket", i, lab);
			if (n->kind == SCHED_ALL_GATHER && (ag[c] || res[c]))
				FAIL("node %d (%s): gathered twice", i, lab);
			if (n->kind == SCHED_REDUCE_SCATTER && (rs[c] || reduced[c]))
				FAIL("node %d (%s): reduced twice", i, lab);
			if (n->kind == SCHED_REDUCE_SCATTER)
				tail = true;
			(n->kind == SCHED_ALL_GATHER ? ag : rs)[c] = true;
			break;
		case SCHED_PP_F:
			if (*f & PPS_F)
				FAIL("node %d (%s): twice", i, lab);
			if (n->stage > 0 && (n->stage - 1) % p != r && !(*f & PPS_GOT_F))
				FAIL("node %d (%s): its input is not received", i, lab);
			if (n->stage > 0 && (n->stage - 1) % p == r &&
			    !(st[((n->stage - 1) / p) * M + n->micro] & PPS_F))
				FAIL("node %d (%s): before the previous stage's forward", i, lab);
			*f |= PPS_F;
			break;
		case SCHED_PP_B:
		case SCHED_PP_I:
			split |= n->kind == SCHED_PP_I;
			if (!(*f & PPS_F) || (*f & PPS_B))
				FAIL("node %d (%s): not once after its forward", i, lab);
			if (n->stage < S - 1 && !(*f & PPS_GOT_B))
				FAIL("node %d (%s): its output's gradient is not received", i, lab);
			*f |= PPS_B;
			break;
		case SCHED_PP_W:
			if (!(*f & PPS_B) || (*f & PPS_W))
				FAIL("node %d (%s): not once after its input-gradient half", i, lab);
			*f |= PPS_W;
			break;
		case SCHED_PP_SEND: {
			int sent = fwd ? PPS_SEND_F : PPS_SEND_B, need = fwd ? PPS_F : PPS_B;
			if ((*f & sent) || !(*f & need))
				FAIL("node %d (%s): not once after the compute it sends", i, lab);
			if ((fwd && n->stage == S - 1) || (!fwd && n->stage == 0))
				FAIL("node %d (%s): no stage to send to", i, lab);
			*f |= sent;
			break;
		}
		case SCHED_PP_RECV: {
			int got = fwd ? PPS_RECV_F : PPS_RECV_B;
			if (*f & got)
				FAIL("node %d (%s): twice", i, lab);
			if ((fwd && n->stage == 0) || (!fwd && n->stage == S - 1))
				FAIL("node %d (%s): no stage to receive from", i, lab);
			*f |= got;
			break;
		}
		case SCHED_WAIT:
			if (n->wait_kind == SCHED_PP_SEND || n->wait_kind == SCHED_PP_RECV) {
				bool send = n->wait_kind == SCHED_PP_SEND;
				int issued = send ? (fwd ? PPS_SEND_F : PPS_SEND_B)
				                  : (fwd ? PPS_RECV_F : PPS_RECV_B);
				int done = send ? (fwd ? PPS_SENT_F : PPS_SENT_B)
				                : (fwd ? PPS_GOT_F : PPS_GOT_B);
				if (!(*f & issued) || (*f & done))
					FAIL("node %d (%s): nothing in flight", i, lab);
				*f |= done;
			} else if (c < 0 || c >= V) {
				FAIL("node %d (%s): bad bucket", i, lab);
			} else if (n->wait_kind == SCHED_ALL_GATHER) {
				if (!ag[c])
					FAIL("node %d (%s): no all-gather in flight", i, lab);
				ag[c] = false;
				res[c] = true;
			} else {
				if (!rs[c])
					FAIL("node %d (%s): no reduce-scatter in flight", i, lab);
				rs[c] = false;
				reduced[c] = true;
			}
			break;
		case SCHED_CLIP:
		case SCHED_OPTIM:
			for (int b = 0; b < V; b++)
				if (!reduced[b] || ag[b] || rs[b])
					FAIL("node %d (%s): virtual stage %d not reduced", i, lab, b);
			break;
		default:
			FAIL("node %d (%s): not a pipeline step's node", i, lab);
		}
	}
	/* every (stage, micro) of this rank computed and every transfer completed */
	for (int c = 0; c < V; c++)
		for (int m = 0; m < M; m++) {
			int f = st[c * M + m], stage = c * p + r;
			int need = s->forward_only ? PPS_F : PPS_F | PPS_B | (split ? PPS_W : 0);
			if ((f & need) != need)
				FAIL("stage %d micro-batch %d: compute missing", stage, m);
			if (((f & PPS_SEND_F) && !(f & PPS_SENT_F)) ||
			    ((f & PPS_SEND_B) && !(f & PPS_SENT_B)) ||
			    ((f & PPS_RECV_F) && !(f & PPS_GOT_F)) ||
			    ((f & PPS_RECV_B) && !(f & PPS_GOT_B)))
				FAIL("stage %d micro-batch %d: a transfer is never waited for", stage,
				     m);
		}
	if (!s->forward_only && (s->n_nodes < 2 || s->nodes[s->n_nodes - 1].kind != SCHED_OPTIM))
		FAIL("the step does not end with OPTIM");
out:
	free(st), free(ag), free(res), free(rs), free(reduced);
	return ok;
}
