/* schedule/pass_ac: activation checkpointing as a pass (named apart from train/checkpoint).
 *
 * SELECTIVE and FULL drop activations in forward (the model saves per block only what the
 * mode keeps, see llama.h) and re-derive them with a RECOMPUTE node right before each
 * block's backward; LAYER (TorchTitan's per-layer policy) does so on every N-th block only
 * (model_ac_block). NONE and FFN need no node (FFN recomputes inside backward). Gathered
 * parameters follow the same save-or-recompute choice: sched_place_gathers frees a bucket
 * after forward when the reshard policy says so, which makes its backward all-gather a
 * recomputation (flagged on the node). */
#include "schedule/sched_pass.h"

#include "base/log.h"

void sched_pass_ac(const struct sched *in, enum model_ac ac, int ac_every, struct sched *out)
{
	CHECK(ac != MODEL_AC_LAYER || ac_every > 0, "per-layer checkpointing needs its N");
	struct sched mid;
	sched_init_like(&mid, in);
	mid.ac = ac;
	mid.ac_every = ac == MODEL_AC_LAYER ? ac_every : 0;
	for (int i = 0; i < in->n_nodes; i++) {
		struct sched_node n = in->nodes[i];
		if (n.kind == SCHED_RECOMPUTE)
			continue;
		/* block unit u is the model's block u - 1 */
		if (n.kind == SCHED_BWD && in->units[n.unit].is_block &&
		    model_ac_block_recomputes(ac, ac_every, n.unit - 1)) {
			struct sched_node r = n;
			r.kind = SCHED_RECOMPUTE;
			sched_push(&mid, r);
		}
		sched_push(&mid, n);
	}
	sched_place_gathers(&mid, out);
	sched_free(&mid);
}
