/* schedule/sched_exec: run the nodes; tickets per (kind, bucket); timestamps per node. */
#include "schedule/sched_exec.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem_timeline.h"
#include "base/timer.h"
#include "comm/flight.h"

/* A compute node's op: its segment of a lowered program, or -1 for the whole pass. */
static int unit_op(const struct sched *s, const struct sched_node *n)
{
	return s->lowered && sched_node_prog(s, n)->n > 0 ? 2 * n->seg : -1;
}

int sched_exec_run(const struct sched *s, const struct sched_backend *be,
                   struct comm_stream *stream, struct sched_record *rec)
{
	int B = s->n_buckets, rc = CT_OK;
	/* in-flight collective per bucket: its ticket and the node that issued it */
	int64_t *ag_ticket = xcalloc((size_t)B, sizeof(int64_t));
	int64_t *rs_ticket = xcalloc((size_t)B, sizeof(int64_t));
	/* issued and not yet waited on, per bucket (a ticket of 0: done at issue, one rank) */
	bool *ag_open = xcalloc((size_t)B, sizeof(bool)), *rs_open = xcalloc((size_t)B, sizeof(bool));
	int *ag_node = xcalloc((size_t)B, sizeof(int)), *rs_node = xcalloc((size_t)B, sizeof(int));
	if (rec)
		memset(rec, 0, (size_t)s->n_nodes * sizeof(*rec));
	for (int i = 0; i < s->n_nodes && rc == CT_OK; i++) {
		const struct sched_node *n = &s->nodes[i];
		if (mem_timeline_on()) { /* the memory snapshot's samples name the node */
			char label[48];
			sched_node_label(s, i, label, sizeof(label));
			mem_timeline_label(label);
		}
		double t0 = timer_now();
		int64_t bytes = 0, ticket = 0;
		comm_flight_node(i, sched_kind_name(n->kind)); /* its collectives carry the node */
		switch (n->kind) {
		case SCHED_BATCH:
			be->batch(be->ctx, n->micro);
			break;
		case SCHED_ALL_GATHER:
			CHECK(!ag_open[n->bucket], "schedule: bucket %d gathered twice", n->bucket);
			ticket = ag_ticket[n->bucket] = be->all_gather(be->ctx, n->bucket, &bytes);
			ag_open[n->bucket] = true;
			ag_node[n->bucket] = i;
			break;
		case SCHED_REDUCE_SCATTER:
			CHECK(!rs_open[n->bucket], "schedule: bucket %d reduced twice", n->bucket);
			ticket = rs_ticket[n->bucket] =
			    be->reduce_scatter(be->ctx, n->bucket, &bytes);
			rs_open[n->bucket] = true;
			rs_node[n->bucket] = i;
			break;
		case SCHED_WAIT: {
			if (sched_kind_pp(n->wait_kind)) {
				be->pp_wait(be->ctx, n);
				break;
			}
			bool ag = n->wait_kind == SCHED_ALL_GATHER;
			int64_t *tk = ag ? &ag_ticket[n->bucket] : &rs_ticket[n->bucket];
			bool *open = ag ? &ag_open[n->bucket] : &rs_open[n->bucket];
			CHECK(*open, "schedule: WAIT on bucket %d with nothing in flight", n->bucket);
			*open = false;
			if (*tk > 0)
				comm_stream_wait(stream, *tk);
			if (rec && *tk > 0) {
				struct sched_record *r =
				    &rec[ag ? ag_node[n->bucket] : rs_node[n->bucket]];
				comm_stream_op_times(stream, *tk, &r->comm_t0, &r->comm_t1,
				                     &r->comm_cpu);
			}
			*tk = 0;
			if (ag)
				be->all_gather_done(be->ctx, n->bucket);
			else
				be->reduce_scatter_done(be->ctx, n->bucket);
			break;
		}
		case SCHED_FREE:
			be->free_params(be->ctx, n->bucket);
			break;
		case SCHED_FWD:
			be->forward(be->ctx, n->unit, unit_op(s, n));
			break;
		case SCHED_BWD:
			be->backward(be->ctx, n->unit, unit_op(s, n));
			break;
		case SCHED_RECOMPUTE:
			be->recompute(be->ctx, n->unit, unit_op(s, n));
			break;
		case SCHED_TP_ALL_GATHER:
		case SCHED_TP_REDUCE_SCATTER:
		case SCHED_CP_ALL_GATHER:
		case SCHED_CP_REDUCE_SCATTER:
		case SCHED_CP_RING:
		case SCHED_EP_ALL_TO_ALL:
		case SCHED_EP_WAIT:
			bytes = be->tp_collective(be->ctx, n->unit, n->pass, 2 * n->seg + 1);
			break;
		case SCHED_PP_F:
		case SCHED_PP_B:
		case SCHED_PP_I:
		case SCHED_PP_W:
			be->pp_compute(be->ctx, n);
			break;
		case SCHED_PP_SEND:
		case SCHED_PP_RECV:
			bytes = be->pp_transfer(be->ctx, n);
			break;
		case SCHED_CLIP:
			rc = be->clip(be->ctx);
			break;
		case SCHED_OPTIM:
			rc = be->optim(be->ctx);
			break;
		default:
			CHECK(false, "schedule: unknown node kind %d", n->kind);
		}
		if (rec) {
			rec[i].t0 = t0;
			rec[i].t1 = timer_now();
			if (sched_kind_in_unit(n->kind) || n->kind == SCHED_PP_SEND ||
			    n->kind == SCHED_PP_RECV)
				rec[i].bytes = bytes;
			if (n->kind == SCHED_ALL_GATHER || n->kind == SCHED_REDUCE_SCATTER) {
				rec[i].bytes = bytes;
				rec[i].ticket = ticket;
			}
		}
		if (be->progress)
			be->progress(be->ctx);
	}
	comm_flight_node(-1, NULL);
	if (rc != CT_OK && stream)
		comm_stream_sync(stream);
	free(ag_ticket), free(rs_ticket), free(ag_node), free(rs_node);
	free(ag_open), free(rs_open);
	return rc;
}
