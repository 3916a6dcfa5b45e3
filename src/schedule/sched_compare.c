/* schedule/sched_compare: the cost model's prediction against a profiled step, per node kind,
 * so a user sees which term is wrong (sched_profile_compare in sched_trace.h). */
#include <stdlib.h>

#include "base/log.h"
#include "schedule/sched_cost.h"
#include "schedule/sched_trace.h"

enum row {
	ROW_FWD_EMBED,
	ROW_FWD_BLOCK,
	ROW_FWD_HEAD,
	ROW_BWD_EMBED,
	ROW_BWD_BLOCK,
	ROW_BWD_HEAD,
	ROW_RECOMPUTE,
	ROW_AG_ISSUE,
	ROW_RS_ISSUE,
	ROW_AG_WAIT,
	ROW_RS_WAIT,
	ROW_TP_AG,
	ROW_TP_RS,
	ROW_CP,
	ROW_EP_A2A,
	ROW_EP_WAIT,
	ROW_TAIL_CLIP,
	ROW_TAIL_OPTIM,
	ROW_OTHER,
	ROW_OUTSIDE,
	ROW_COUNT
};

static const char *const row_name[ROW_COUNT] = {"FWD embedding",
                                                "FWD blocks",
                                                "FWD norm+output+loss",
                                                "BWD embedding",
                                                "BWD blocks",
                                                "BWD final norm",
                                                "RECOMPUTE",
                                                "all-gather issue",
                                                "reduce-scatter issue",
                                                "WAIT all-gather",
                                                "WAIT reduce-scatter",
                                                "TP all-gather",
                                                "TP reduce-scatter",
                                                "CP K/V transfers",
                                                "EP all-to-all",
                                                "EP wait",
                                                "CLIP",
                                                "OPTIM",
                                                "BATCH, FREE",
                                                "outside the schedule"};

static enum row row_of(const struct sched *s, const struct sched_node *n)
{
	int last = s->n_units - 1, off = n->kind == SCHED_BWD ? ROW_BWD_EMBED - ROW_FWD_EMBED : 0;
	switch (n->kind) {
	case SCHED_FWD:
	case SCHED_BWD:
		return (enum row)(off + (n->unit == 0      ? ROW_FWD_EMBED
		                         : n->unit == last ? ROW_FWD_HEAD
		                                           : ROW_FWD_BLOCK));
	case SCHED_RECOMPUTE:
		return ROW_RECOMPUTE;
	case SCHED_ALL_GATHER:
		return ROW_AG_ISSUE;
	case SCHED_REDUCE_SCATTER:
		return ROW_RS_ISSUE;
	case SCHED_WAIT:
		return n->wait_kind == SCHED_ALL_GATHER ? ROW_AG_WAIT : ROW_RS_WAIT;
	case SCHED_TP_ALL_GATHER:
		return ROW_TP_AG;
	case SCHED_TP_REDUCE_SCATTER:
		return ROW_TP_RS;
	case SCHED_CP_ALL_GATHER:
	case SCHED_CP_REDUCE_SCATTER:
	case SCHED_CP_RING:
		return ROW_CP;
	case SCHED_EP_ALL_TO_ALL:
		return ROW_EP_A2A;
	case SCHED_EP_WAIT:
		return ROW_EP_WAIT;
	case SCHED_CLIP:
		return ROW_TAIL_CLIP;
	case SCHED_OPTIM:
		return ROW_TAIL_OPTIM;
	default:
		return ROW_OTHER;
	}
}

void sched_profile_compare(const struct sched *s, const struct sched_cost_model *cm,
                           const struct sched_record *rec, double t_step0, double t_step1, FILE *f)
{
	double *nt = xcalloc(2 * (size_t)s->n_nodes, sizeof(double));
	struct sched_prediction p;
	sched_predict(s, cm, &p, nt);
	double pred[ROW_COUNT] = {0}, meas[ROW_COUNT] = {0};
	int count[ROW_COUNT] = {0};
	for (int i = 0; i < s->n_nodes; i++) {
		enum row r = row_of(s, &s->nodes[i]);
		pred[r] += nt[2 * i + 1] - nt[2 * i];
		meas[r] += rec[i].t1 - rec[i].t0;
		count[r]++;
	}
	/* before the first node: gradient zeroing (predicted), data and set-up (measured); and
	 * the gaps between nodes the executor itself spends */
	double in_nodes = 0;
	for (int r = 0; r < ROW_OUTSIDE; r++)
		in_nodes += meas[r];
	pred[ROW_OUTSIDE] = s->n_nodes ? nt[0] : 0.0;
	meas[ROW_OUTSIDE] = (t_step1 - t_step0) - in_nodes;
	fprintf(f, "cost model vs this step (rank's own times; predicted / measured):\n");
	fprintf(f, "  %-22s %5s %10s %10s %8s\n", "node kind", "nodes", "predicted", "measured",
	        "error");
	for (int r = 0; r < ROW_COUNT; r++) {
		if (count[r] == 0 && r != ROW_OUTSIDE)
			continue;
		double err = meas[r] > 1e-6 ? 100.0 * (pred[r] / meas[r] - 1.0) : 0.0;
		fprintf(f, "  %-22s %5d %9.4fs %9.4fs %+7.1f%%\n", row_name[r], count[r], pred[r],
		        meas[r], err);
	}
	/* the big compute kinds' measured / predicted: one common factor says the machine ran at
	 * another speed than when calibrated (load); a spread says a term is wrong */
	double lo = 1e30, hi = 0;
	double total = 0;
	for (int r = ROW_FWD_EMBED; r <= ROW_RECOMPUTE; r++)
		total += meas[r];
	for (int r = ROW_FWD_EMBED; r <= ROW_RECOMPUTE; r++)
		if (meas[r] > 0.05 * total && pred[r] > 0) {
			double q = meas[r] / pred[r];
			lo = q < lo ? q : lo;
			hi = q > hi ? q : hi;
		}
	if (hi > 0)
		fprintf(f,
		        "  compute kinds over 5%% of compute, measured / predicted: %.2f .. %.2f "
		        "(one common factor: the machine's speed changed since calibration; a "
		        "spread: a term is off)\n",
		        lo, hi);
	if (cm->overlap && !cm->single) { /* beside the schedule: what the comm thread ran */
		double cpu = 0;
		int nc = 0;
		for (int i = 0; i < s->n_nodes; i++)
			if (s->nodes[i].kind == SCHED_ALL_GATHER ||
			    s->nodes[i].kind == SCHED_REDUCE_SCATTER) {
				cpu += rec[i].comm_cpu;
				nc++;
			}
		fprintf(f,
		        "  %-22s %5d %9.4fs %9.4fs %+7.1f%%   (beside compute; it takes %.0f%% "
		        "of this from it: %.4fs predicted)\n",
		        "comm thread CPU", nc, p.comm_cpu_s, cpu,
		        cpu > 1e-6 ? 100.0 * (p.comm_cpu_s / cpu - 1.0) : 0.0,
		        100.0 * cm->interference, p.comm_cpu_paid_s);
	}
	double ms = t_step1 - t_step0;
	fprintf(f, "  %-22s %5d %9.4fs %9.4fs %+7.1f%%\n", "step", s->n_nodes, p.step_s, ms,
	        100.0 * (p.step_s / ms - 1.0));
	free(nt);
}
