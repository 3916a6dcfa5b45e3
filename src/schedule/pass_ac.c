/* schedule/pass_ac: activation checkpointing as a pass (named apart from train/checkpoint).
 *
 * SELECTIVE and FULL drop activations in forward (the model saves per block only what the
 * mode keeps, see llama.h) and re-derive them with a RECOMPUTE node right before each
 * block's backward. NONE and FFN need no node (FFN recomputes inside backward). Gathered
 * parameters follow the same save-or-recompute choice: sched_place_gathers frees a bucket
 * after forward when the reshard policy says so, which makes its backward all-gather a
 * recomputation (flagged on the node). */
#include "schedule/sched_pass.h"

void sched_pass_ac(const struct sched *in, enum model_ac ac, struct sched *out)
{
	struct sched mid;
	sched_init_like(&mid, in);
	mid.ac = ac;
	bool nodes = ac == MODEL_AC_SELECTIVE || ac == MODEL_AC_FULL;
	for (int i = 0; i < in->n_nodes; i++) {
		struct sched_node n = in->nodes[i];
		if (n.kind == SCHED_RECOMPUTE)
			continue;
		if (n.kind == SCHED_BWD && nodes && in->units[n.unit].is_block) {
			struct sched_node r = n;
			r.kind = SCHED_RECOMPUTE;
			sched_push(&mid, r);
		}
		sched_push(&mid, n);
	}
	sched_place_gathers(&mid, out);
	sched_free(&mid);
}
