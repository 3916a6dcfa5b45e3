/* Context-parallel tests, run under mpiexec: Llama with each sequence split over cp ranks
 * (head-tail load balancing or contiguous shards; K/V all-gathered or ringed), alone and under
 * FSDP / HSDP (parameters sharded over dp_shard x cp) and tensor parallelism (cp x tp: the
 * attention core of a TP rank's heads; its parameters gathered over tp too), equals 1-rank
 * training: losses, grad
 * norms and the gathered parameters after 5 steps within 1e-5 relative (the reference runs on
 * rank 0 in the same job), every rank's verdict counted. The model has grouped-query
 * attention and an odd vocabulary. --ring also checks the ring (alltoall) against the
 * all-gather variant within 1e-6. Prints activations per rank (memory accounting) against
 * one rank's at the same sequence length; at cp = 4 they must be <= 0.30 of them.
 *   mpiexec -n W test_cp --cp C [--tp P] [--replicate R] [--none] [--ring] [--stream]
 *                        [--ac-full|--ac-ffn|--ac-selective] */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "data/synthetic.h"
#include "model/model_cost.h"
#include "schedule/sched_cost.h"
#include "parallel/cp.h"
#include "parallel/fsdp.h"
#include "parallel/tp.h"
#include "parallel/tp_coll.h"
#include "testutil.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

/* A cost-model shape of one TP rank's fp32 slice (before the B and T macros below). */
static struct model_cost_shape cost_shape(int64_t b, int64_t t, enum model_ac a, int64_t c,
                                          bool c_ring, bool headtail)
{
	return (struct model_cost_shape){.B = b,
	                                 .T = t,
	                                 .ac = a,
	                                 .tp = 1,
	                                 .elem_bytes = 4,
	                                 .cp = c,
	                                 .cp_ring = c_ring,
	                                 .cp_headtail = headtail};
}

static int cp = 2, replicate = 1, tp = 1;
static bool ring, stream_ring;
static enum cp_balancer balancer = CP_BALANCE_HEADTAIL;
static enum model_ac ac = MODEL_AC_NONE;
static struct mesh mesh;
static uint64_t seed;

#define STEPS 5
#define B     3
#define T     64
#define ACCUM 2 /* micro-batches per data-parallel rank */

static void config(struct model_config *c)
{
	memset(c, 0, sizeof(*c));
	struct llama_config *lc = llama_cfg_init(c);
	llama_config_preset(lc, "debugmodel");
	lc->n_layers = 3;
	lc->n_kv_heads = 8;   /* GQA: 2 query heads per kv head */
	lc->vocab_size = 509; /* odd */
	CHECK(llama_config_finish(lc) == CT_OK, "config");
}

struct run {
	double losses[STEPS], norms[STEPS];
	float *params;
	int64_t act_bytes; /* MEM_ACTIVATIONS held by the built model */
};

/* The cost model's activation bytes of a cp rank (model/model_cost.h, cp in the shape): what
 * they add to a one-rank model of the rank's T/cp tokens (the K/V buffers of llama_cp.c)
 * must be what the built cp model adds in the memory accounting, to the byte. */
static void cost_check_activations(const struct model_config *c, const struct mesh *ms,
                                   bool use_ring, int64_t measured)
{
	if (ms->tp > 1)
		return;
	const int64_t Tl = T / ms->cp;
	struct model m1;
	const struct model_build_opts o1 = {.own_params = true, .ac = ac};
	int64_t a0 = mem_current(MEM_ACTIVATIONS);
	CHECK(model_build(&m1, c, B, Tl, &o1) == CT_OK, "build");
	int64_t plain = mem_current(MEM_ACTIVATIONS) - a0;
	model_free(&m1);
	struct model_cost_shape sh =
	    cost_shape(B, T, ac, ms->cp, use_ring, balancer == CP_BALANCE_HEADTAIL);
	int64_t pred = model_cost_activation_bytes(c, &sh);
	sh = cost_shape(B, Tl, ac, 1, false, false);
	int64_t pred1 = model_cost_activation_bytes(c, &sh);
	EXPECT(pred - pred1 == measured - plain,
	       "cp activations: the cost model adds %lld bytes to a %lld-token rank's, the built "
	       "model %lld",
	       (long long)(pred - pred1), (long long)Tl, (long long)(measured - plain));
	if (ms->rank == 0)
		fprintf(stderr,
		        "  cost model: cp rank's activations %.3f MiB predicted, %.3f MiB "
		        "measured (%s)\n",
		        (double)pred / 1048576.0, (double)measured / 1048576.0,
		        use_ring ? "ring" : "allgather");
}

/* The step's K/V transfers are schedule nodes of their own (CP_*): per micro-batch and
 * block, the all-gather form's forward CP-AG and backward CP-AG + CP-RS, the ring's forward
 * and backward CP-RING (and a full recompute's forward ones again); and the model's
 * programs are the cost model's from the shapes, byte for byte. */
static void check_cp_nodes(const struct fsdp *f, const struct model *m,
                           const struct model_config *c, const struct mesh *ms, bool use_ring)
{
	int n[SCHED_KIND_COUNT] = {0};
	for (int i = 0; i < f->sched.n_nodes; i++)
		n[f->sched.nodes[i].kind]++;
	const int L = (int)llama_cfg(c)->n_layers, passes = ac == MODEL_AC_FULL ? 3 : 2;
	const int ag = use_ring ? 0 : ACCUM * L * passes, rs = use_ring ? 0 : ACCUM * L,
	          rg = use_ring ? ACCUM * L * passes : 0;
	EXPECT(n[SCHED_CP_ALL_GATHER] == ag && n[SCHED_CP_REDUCE_SCATTER] == rs &&
	           n[SCHED_CP_RING] == rg,
	       "%s: the step has %d CP-AG, %d CP-RS, %d CP-RING nodes; want %d, %d, %d",
	       use_ring ? "ring" : "allgather", n[SCHED_CP_ALL_GATHER], n[SCHED_CP_REDUCE_SCATTER],
	       n[SCHED_CP_RING], ag, rs, rg);
	if (ms->rank == 0)
		fprintf(stderr, "  schedule: %d CP-AG, %d CP-RS, %d CP-RING nodes a step (%s)\n",
		        n[SCHED_CP_ALL_GATHER], n[SCHED_CP_REDUCE_SCATTER], n[SCHED_CP_RING],
		        use_ring ? "ring" : "allgather");
	struct model_cost_shape sh =
	    cost_shape(B, T, ac, ms->cp, use_ring, balancer == CP_BALANCE_HEADTAIL);
	sh.tp = ms->tp;
	for (int u = 0; u < m->table->n_units; u++)
		for (int p = 0; p < MODEL_PASS_COUNT; p++) {
			struct model_prog a, b;
			memset(&a, 0, sizeof(a));
			memset(&b, 0, sizeof(b));
			model_unit_prog(m, u, (enum model_pass)p, &a);
			model_cost_unit_prog(c, &sh, false, u, (enum model_pass)p, &b);
			EXPECT(memcmp(&a, &b, sizeof(a)) == 0,
			       "unit %d pass %d: the model's program (%d collectives) is not the "
			       "cost model's (%d)",
			       u, p, a.n, b.n);
		}
}

/* FSDP over dp_shard x cp on mesh `ms` with context parallelism over its cp group. */
static void run_cp(struct run *out, const struct mesh *ms, bool use_ring)
{
	struct model_config c;
	config(&c);
	const int S = ms->cp, Tl = T / S;
	int64_t *order = calloc(T, sizeof(int64_t));
	cp_token_order(order, T, S, balancer);
	struct tp_coll cpc;
	tp_coll_init(&cpc, &ms->cp_group, 0.0, 0.0, 120);
	struct tp_coll tpc;
	if (ms->tp > 1)
		tp_coll_init(&tpc, &ms->tp_group, 0.0, 0.0, 120);
	struct comm_stream *stream = comm_stream_create(STREAM_THREAD, 60);
	if (stream_ring)
		tp_coll_use_stream(&cpc, stream);
	const struct model_build_opts opts = {.own_params = false,
	                                      .ac = ac,
	                                      .tp = ms->tp > 1 ? &tpc.ops : NULL,
	                                      .cp = &cpc.ops,
	                                      .cp_order = order,
	                                      .cp_ring = use_ring};
	struct model m;
	int64_t a0 = mem_current(MEM_ACTIVATIONS);
	CHECK(model_build(&m, &c, B, Tl, &opts) == CT_OK, "build");
	out->act_bytes = mem_current(MEM_ACTIVATIONS) - a0;
	cost_check_activations(&c, ms, use_ring, out->act_bytes);
	struct fsdp f;
	fsdp_build(&f, &m, ms, false, FSDP_RESHARD_DEFAULT, stream);
	fsdp_init_params(&f, seed);
	struct adamw opt;
	adamw_init(&opt, f.shard_numel, 0.9, 0.95, 1e-8, 0.1);
	struct engine e;
	fsdp_engine(&f, &e);
	struct lr_schedule sched;
	lr_schedule_init(&sched, 2e-3, 2, -1, "linear", 0.1, STEPS);
	int32_t *tok = malloc((size_t)(ACCUM * B * T) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(ACCUM * B * T) * sizeof(int32_t));
	int32_t *ltok = malloc((size_t)(ACCUM * B * Tl) * sizeof(int32_t));
	int32_t *ltgt = malloc((size_t)(ACCUM * B * Tl) * sizeof(int32_t));
	const int dp = ms->dp_group.size, d = ms->dp_group.rank;
	const int64_t *mine = order + (int64_t)ms->cp_rank * Tl;
	for (int s = 0; s < STEPS; s++) {
		int64_t G = (int64_t)ACCUM * dp * B;
		for (int a = 0; a < ACCUM; a++)
			synthetic_batch(seed, m.vocab_size, s * G + ((int64_t)a * dp + d) * B, B, T,
			                tok + a * B * T, tgt + a * B * T);
		cp_take_tokens(ltok, tok, mine, ACCUM * B, T, Tl);
		cp_take_tokens(ltgt, tgt, mine, ACCUM * B, T, Tl);
		struct train_step_result r;
		CHECK(engine_run(&e, ltok, ltgt, ACCUM, &opt, lr_schedule_at(&sched, s), 0.3, &r) ==
		          CT_OK,
		      "step");
		out->losses[s] = r.loss;
		out->norms[s] = r.grad_norm;
	}
	check_cp_nodes(&f, &m, &c, ms, use_ring); /* the schedule the steps ran */
	float *local = malloc((size_t)m.table->numel * sizeof(float));
	fsdp_gather_full(&f, local);
	struct param_table g;
	model_table_build(&g, &c);
	out->params = malloc((size_t)g.numel * sizeof(float));
	if (ms->tp > 1)
		tp_gather_global(&ms->tp_group, m.table, local, &g, out->params);
	else
		memcpy(out->params, local, (size_t)g.numel * sizeof(float));
	param_table_free(&g);
	free(local);
	free(tok), free(tgt), free(ltok), free(ltgt), free(order);
	adamw_free(&opt);
	fsdp_free(&f);
	comm_stream_destroy(stream);
	model_free(&m);
}

static void run_single(struct run *out, int micro)
{
	struct model_config c;
	config(&c);
	struct model m;
	const struct model_build_opts opts = {.own_params = true, .ac = ac};
	int64_t a0 = mem_current(MEM_ACTIVATIONS);
	CHECK(model_build(&m, &c, B, T, &opts) == CT_OK, "build");
	out->act_bytes = mem_current(MEM_ACTIVATIONS) - a0;
	model_init_params(&m, seed, m.params, 0, m.table->numel);
	struct adamw opt;
	adamw_init(&opt, m.table->numel, 0.9, 0.95, 1e-8, 0.1);
	struct lr_schedule sched;
	lr_schedule_init(&sched, 2e-3, 2, -1, "linear", 0.1, STEPS);
	int32_t *tok = malloc((size_t)(micro * B * T) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(micro * B * T) * sizeof(int32_t));
	for (int s = 0; s < STEPS; s++) {
		int64_t G = (int64_t)micro * B;
		synthetic_batch(seed, m.vocab_size, s * G, G, T, tok, tgt);
		struct train_step_result r;
		CHECK(train_step(&m, &opt, tok, tgt, micro, lr_schedule_at(&sched, s), 0.3, &r) ==
		          CT_OK,
		      "step");
		out->losses[s] = r.loss;
		out->norms[s] = r.grad_norm;
	}
	out->params = malloc((size_t)m.table->numel * sizeof(float));
	memcpy(out->params, m.params, (size_t)m.table->numel * sizeof(float));
	free(tok), free(tgt);
	adamw_free(&opt);
	model_free(&m);
}

static int64_t global_numel(void)
{
	struct model_config c;
	struct param_table t;
	config(&c);
	model_table_build(&t, &c);
	int64_t n = t.numel;
	param_table_free(&t);
	return n;
}

static void compare(const struct run *a, const struct run *ref, const char *what, double tol)
{
	for (int s = 0; s < STEPS; s++) {
		if (mesh.rank == 0)
			fprintf(stderr, "  step %d: loss %.7f grad_norm %.7f (%s %.7f, %.7f)\n", s + 1,
			        a->losses[s], a->norms[s], what, ref->losses[s], ref->norms[s]);
		EXPECT(fabs(a->losses[s] - ref->losses[s]) <= tol * fabs(ref->losses[s]),
		       "step %d loss %.9g vs %s %.9g", s + 1, a->losses[s], what, ref->losses[s]);
		EXPECT(fabs(a->norms[s] - ref->norms[s]) <= tol * fabs(ref->norms[s]),
		       "step %d grad_norm %.9g vs %s %.9g", s + 1, a->norms[s], what,
		       ref->norms[s]);
	}
	double e = rel_err_f32(a->params, ref->params, global_numel());
	if (mesh.rank == 0)
		fprintf(stderr, "  gathered parameters after %d steps: rel err %.3e vs %s\n", STEPS,
		        e, what);
	EXPECT(e <= tol, "params rel err %.3e vs %s", e, what);
}

/* Every rank's copy of the 1-rank reference: rank 0 runs it, the others receive it. */
static void reference(struct run *ref)
{
	int64_t n = global_numel();
	if (mesh.rank == 0) {
		run_single(ref, mesh.dp_group.size * ACCUM);
	} else {
		memset(ref, 0, sizeof(*ref));
		ref->params = calloc((size_t)n, sizeof(float));
	}
	double stats[2 * STEPS + 1];
	for (int s = 0; s < STEPS; s++)
		stats[s] = ref->losses[s], stats[STEPS + s] = ref->norms[s];
	stats[2 * STEPS] = (double)ref->act_bytes;
	if (mesh.rank != 0)
		memset(stats, 0, sizeof(stats));
	comm_all_reduce_f64(&mesh.world_group, stats, 2 * STEPS + 1);
	for (int s = 0; s < STEPS; s++)
		ref->losses[s] = stats[s], ref->norms[s] = stats[STEPS + s];
	ref->act_bytes = (int64_t)stats[2 * STEPS];
	if (mesh.rank != 0)
		memset(ref->params, 0, (size_t)n * sizeof(float));
	comm_all_reduce_f32(&mesh.world_group, ref->params, n); /* rank 0's + zeros */
}

TEST_CASE(test_cp_equivalence)
{
	struct run ref, a;
	reference(&ref);
	run_cp(&a, &mesh, false);
	compare(&a, &ref, "1 rank", 1e-5);
	double ar = (double)a.act_bytes / (double)ref.act_bytes;
	if (mesh.rank == 0)
		fprintf(stderr, "  activations per rank (memory accounting): %.3f MiB = %.3f of 1 "
		                "rank's %.3f MiB at seq_len %d (1/cp = %.3f)\n",
		        (double)a.act_bytes / 1048576.0, ar, (double)ref.act_bytes / 1048576.0, T,
		        1.0 / cp);
	if (cp == 4 && tp == 1)
		EXPECT(ar <= 0.30, "activations per rank at cp = 4: %.3f of 1 rank's (> 0.30)", ar);
	if (ring) {
		struct run r;
		run_cp(&r, &mesh, true);
		compare(&r, &ref, "1 rank", 1e-5);
		compare(&r, &a, "allgather", 1e-6);
		free(r.params);
	}
	free(a.params);
	free(ref.params);
}

/* The cost model's figures for a cp rank (model/model_cost.h): a block's matmuls are 1/cp
 * of the whole sequence's, its attention 1/cp of it with head-tail balancing and (2cp-1)/cp^2
 * (the last shard's) without; its in-pass collectives send, per block, K and V's (cp - 1)
 * shards in each all-gather (forward, a full recompute, backward) and dK, dV's in
 * backward's reduce-scatters; the ring cp - 1 K/V steps and, in backward, cp dK/dV steps. */
TEST_CASE(test_cp_cost_figures)
{
	struct model_config c;
	config(&c);
	const struct model_cost_shape one = cost_shape(B, T, ac, 1, false, false);
	for (int r = 0; r < 2; r++) {
		const struct model_cost_shape sh =
		    cost_shape(B, T, ac, cp, r == 1, balancer == CP_BALANCE_HEADTAIL);
		model_cost_work w1, wc;
		model_cost_unit_work(&c, &one, 1, w1);
		model_cost_unit_work(&c, &sh, 1, wc);
		double share = balancer == CP_BALANCE_HEADTAIL
		                   ? 1.0 / cp
		                   : (2.0 * cp - 1.0) / ((double)cp * cp);
		for (int p = 0; p < MODEL_PASS_COUNT; p++) {
			const double *a = w1[p], *b = wc[p];
			EXPECT(fabs(b[MODEL_COST_MATMUL] - a[MODEL_COST_MATMUL] / cp) <=
			           1e-9 * a[MODEL_COST_MATMUL],
			       "pass %d: matmul FLOPs of a cp rank %g, 1/cp of one rank's %g", p,
			       b[MODEL_COST_MATMUL], a[MODEL_COST_MATMUL] / cp);
			EXPECT(fabs(b[MODEL_COST_ATTN] - a[MODEL_COST_ATTN] * share) <=
			           1e-9 * a[MODEL_COST_ATTN],
			       "pass %d: attention FLOPs of a cp rank %g, want %g (%.4f of one "
			       "rank's)",
			       p, b[MODEL_COST_ATTN], a[MODEL_COST_ATTN] * share, share);
		}
		/* K (or V) of one shard: B x T/cp x n_kv_heads x head_dim floats */
		const struct llama_config *lc = llama_cfg(&c);
		const int64_t blk = (int64_t)B * (T / cp) * lc->n_kv_heads * lc->head_dim * 4;
		const int64_t want[MODEL_PASS_COUNT] = {
		    [MODEL_PASS_FWD] = r ? (cp - 1) * 2 * blk : 2 * (cp - 1) * blk,
		    [MODEL_PASS_BWD] = r ? (2 * cp - 1) * 2 * blk : 4 * (cp - 1) * blk,
		    [MODEL_PASS_REC] = ac != MODEL_AC_FULL ? 0
		                       : r                 ? (cp - 1) * 2 * blk
		                                           : 2 * (cp - 1) * blk};
		for (int p = 0; p < MODEL_PASS_COUNT; p++) {
			struct model_prog g;
			model_cost_unit_prog(&c, &sh, false, 1, (enum model_pass)p, &g);
			int64_t sent = 0;
			for (int j = 0; j < g.n; j++)
				sent += g.c[j].role == MODEL_GROUP_CP && g.c[j].group == cp
				            ? g.c[j].bytes + g.c[j].back_bytes
				            : 0;
			EXPECT(sent == want[p],
			       "%s pass %d: a block's cp transfers send %lld bytes, "
			       "want %lld",
			       r ? "ring" : "allgather", p, (long long)sent, (long long)want[p]);
			struct model_prog e;
			model_cost_unit_prog(&c, &sh, false, 0, (enum model_pass)p, &e);
			EXPECT(e.n == 0, "the embedding has no cp transfers");
		}
	}
}

/* The cost model's price of a block's cp transfers (schedule/sched_cost.h): all-gathers and
 * reduce-scatters block the pass (latency + bytes / rate each); the ring's K/V steps are
 * hidden by the attention beside them (none when attention takes no time, every one when it
 * takes forever), its dK/dV steps never; one latency per ring step. */
TEST_CASE(test_cp_cost_price)
{
	struct model_config c;
	config(&c);
	struct sched_cost_model cm;
	memset(&cm, 0, sizeof(cm));
	cm.cp_latency_s = 1e-5;
	cm.cp_bytes_s = 1e9;
	for (int r = 0; r < 2; r++) {
		const struct model_cost_shape sh =
		    cost_shape(B, T, ac, cp, r == 1, balancer == CP_BALANCE_HEADTAIL);
		for (int p = 0; p < MODEL_PASS_COUNT; p++) {
			struct model_prog g;
			model_cost_unit_prog(&c, &sh, false, 1, (enum model_pass)p, &g);
			double wire = 0, fast = 0, slow = 0, blocking = 0;
			for (int j = 0; j < g.n; j++) {
				double w;
				cm.attn_flops = 1e30;
				fast += sched_cost_cp_s(&cm, (enum sched_work)p, &g.c[j], &w);
				cm.attn_flops = 1e-30;
				slow += sched_cost_cp_s(&cm, (enum sched_work)p, &g.c[j], NULL);
				int n = (g.c[j].steps > 0 ? g.c[j].steps : 1) +
				        (g.c[j].back_bytes > 0 ? g.c[j].group : 0);
				double back = g.c[j].back_bytes > 0
				                  ? g.c[j].group * cm.cp_latency_s + g.c[j].back_bytes / 1e9
				                  : 0.0;
				EXPECT(fabs(w - (n * cm.cp_latency_s +
				                 (double)(g.c[j].bytes + g.c[j].back_bytes) / 1e9)) <=
				           1e-12,
				       "transfer %d of pass %d: %g s on the wire", j, p, w);
				wire += w;
				blocking += g.c[j].ring ? back : w;
			}
			EXPECT(fabs(fast - wire) <= 1e-12,
			       "pass %d: attention of no time hides "
			       "nothing: %g s of %g s exposed",
			       p, fast, wire);
			EXPECT(fabs(slow - blocking) <= 1e-12,
			       "%s pass %d: %g s exposed beside endless attention, want %g (the "
			       "collectives and dK/dV steps)",
			       r ? "ring" : "allgather", p, slow, blocking);
			EXPECT(r == 0 || g.n == 0 || blocking < wire,
			       "ring pass %d: no step hidden", p);
		}
	}
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--cp") == 0 && i + 1 < argc)
			cp = atoi(argv[++i]);
		else if (strcmp(argv[i], "--tp") == 0 && i + 1 < argc)
			tp = atoi(argv[++i]);
		else if (strcmp(argv[i], "--replicate") == 0 && i + 1 < argc)
			replicate = atoi(argv[++i]);
		else if (strcmp(argv[i], "--none") == 0)
			balancer = CP_BALANCE_NONE;
		else if (strcmp(argv[i], "--ring") == 0)
			ring = true;
		else if (strcmp(argv[i], "--stream") == 0)
			stream_ring = true;
		else if (strcmp(argv[i], "--ac-full") == 0)
			ac = MODEL_AC_FULL;
		else if (strcmp(argv[i], "--ac-ffn") == 0)
			ac = MODEL_AC_FFN;
		else if (strcmp(argv[i], "--ac-selective") == 0)
			ac = MODEL_AC_SELECTIVE;
	}
	CHECK(mesh_build_cp(&mesh, 1, replicate, -1, cp, tp) == CT_OK, "mesh");
	int64_t s0 = mesh.rank == 0 ? (int64_t)test_seed() : 0; /* rank 0's seed for all */
	comm_all_reduce_i64(&mesh.world_group, &s0, 1);
	seed = (uint64_t)s0;
	if (mesh.rank == 0)
		fprintf(stderr,
		        "world %d = %d replicas x %d shards x %d context-parallel (%s) x %d "
		        "tensor-parallel%s%s\n",
		        mesh.world, mesh.dp_replicate, mesh.dp_shard, mesh.cp,
		        balancer == CP_BALANCE_HEADTAIL ? "head-tail" : "contiguous", mesh.tp,
		        ring ? ", ring vs allgather" : "",
		        ac == MODEL_AC_FULL        ? ", full activation checkpointing"
		        : ac == MODEL_AC_FFN       ? ", ffn activation checkpointing"
		        : ac == MODEL_AC_SELECTIVE ? ", selective activation checkpointing"
		                                   : "");
	RUN(test_cp_equivalence);
	RUN(test_cp_cost_figures);
	RUN(test_cp_cost_price);
	/* every rank's verdict counts */
	int64_t fails = test_summary() != 0;
	comm_all_reduce_i64(&mesh.world_group, &fails, 1);
	mesh_free(&mesh);
	comm_finalize();
	return fails ? 1 : 0;
}
