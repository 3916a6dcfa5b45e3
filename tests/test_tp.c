/* Tensor-parallel tests, run under mpiexec: Megatron TP with sequence and loss parallelism,
 * alone and composed with FSDP (tp x dp_shard) or HSDP (dp_replicate x tp), equals 1-rank
 * training: losses, grad norms and the gathered global parameters after 5 steps within 1e-5
 * relative (the reference runs on rank 0 in the same job). The model has an odd vocabulary
 * (509: the last vocabulary piece is padded), a token count per micro-batch that tp does not
 * divide (sequence shards padded), and grouped-query attention. Also checks that persistent
 * memory per rank is 1/(tp x dp_shard) and saved activations about 1/tp of one rank's.
 * --bf16 compares bf16 all-gather TP x FSDP against bf16 FSDP alone (same rounding points).
 *   mpiexec -n W test_tp --tp T [--replicate R] [--bf16] */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "data/synthetic.h"
#include "parallel/fsdp.h"
#include "parallel/tp.h"
#include "parallel/tp_coll.h"
#include "testutil.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

static int tp = 2, replicate = 1;
static bool bf16, async_tp;
static enum model_ac ac = MODEL_AC_NONE; /* --ac-full: full activation checkpointing */
static struct mesh mesh;
static uint64_t seed;

#define STEPS 5
#define B     3
#define T     21 /* N = 63 tokens: not divisible by 2 or 4 */
#define ACCUM 2  /* micro-batches per data-parallel rank */

static void config(struct model_config *c)
{
	memset(c, 0, sizeof(*c));
	struct llama_config *lc = llama_cfg_init(c);
	llama_config_preset(lc, "debugmodel");
	lc->n_layers = 3;
	lc->n_kv_heads = 8;   /* GQA: 2 query heads per kv head */
	lc->vocab_size = 509; /* not divisible by 2 or 4: a padded vocabulary piece */
	CHECK(llama_config_finish(lc) == CT_OK, "config");
}

static void batch_rows(int64_t vocab, int64_t step, int dp, int d, int accum, int32_t *tok,
                       int32_t *tgt)
{
	int64_t G = (int64_t)accum * dp * B;
	for (int a = 0; a < accum; a++)
		synthetic_batch(seed, vocab, step * G + ((int64_t)a * dp + d) * B, B, T,
		                tok + a * B * T, tgt + a * B * T);
}

struct run {
	double losses[STEPS], norms[STEPS];
	float *params; /* global layout */
	int64_t persistent_bytes, act_bytes;
};

/* The step ran its TP collectives as schedule nodes (lowered), as many as Megatron-SP's plan
 * has, each moving (tp - 1) blocks: per micro-batch the embedding's reduce-scatter and its
 * gradient's all-gather; per block 4 in forward (norm output gathered, partial sums
 * reduce-scattered, twice), 6 in backward (output gradient and norm output gathered, input
 * gradient reduce-scattered, twice) plus the 2 norm weights' partial gradients, and the
 * recomputed forward's under checkpointing (selective: 3); the head's norm output gathered
 * and its loss gradient reduce-scattered (fused into the forward: the backward's is a no-op),
 * and its norm weight's gradient. Counted from the executor's records of the last step. */
static void check_tp_nodes(const struct fsdp *f, const struct llama_config *c, int accum)
{
	int64_t S = mesh.tp, L = c->n_layers, Ns = (B * T + S - 1) / S;
	int64_t rec = ac == MODEL_AC_FULL ? 4 : ac == MODEL_AC_SELECTIVE ? 3 : 0;
	int64_t act = accum * (2 + L * (4 + 6 + rec) + 2), norm = accum * (2 * L + 1);
	int64_t want = (act * Ns * c->dim + norm * c->dim) * (S - 1) * (int64_t)sizeof(float);
	int64_t nodes = 0, ran = 0, bytes = 0;
	for (int i = 0; i < f->sched.n_nodes; i++) {
		enum sched_kind k = f->sched.nodes[i].kind;
		if (k != SCHED_TP_ALL_GATHER && k != SCHED_TP_REDUCE_SCATTER)
			continue;
		nodes++;
		ran += f->rec[i].bytes > 0;
		bytes += f->rec[i].bytes;
	}
	EXPECT(f->sched.lowered, "the schedule was not lowered");
	EXPECT(ran == act + norm && nodes == ran + accum && bytes == want,
	       "TP nodes: %lld (%lld ran, %lld bytes), want %lld + %lld no-ops (%lld bytes)",
	       (long long)nodes, (long long)ran, (long long)bytes, (long long)(act + norm),
	       (long long)accum, (long long)want);
}

/* FSDP (+ TP when tp_group has more than one rank) on mesh `ms`, `accum` micro-batches per
 * data-parallel rank. */
static void run_sharded(struct run *out, const struct mesh *ms, int accum, bool use_bf16,
                        bool async, bool ring_on_stream)
{
	struct model_config c;
	config(&c);
	struct model m;
	struct tp_coll tpc;
	if (ms->tp > 1)
		tp_coll_init(&tpc, &ms->tp_group, 0.0, 0.0, 120);
	const struct model_build_opts opts = {.own_params = false,
	                                      .ac = ac,
	                                      .tp = ms->tp > 1 ? &tpc.ops : NULL,
	                                      .tp_async = async};
	CHECK(model_build(&m, &c, B, T, &opts) == CT_OK, "build");
	out->act_bytes = ((struct llama_model *)m.impl)->act_bytes;
	struct comm_stream *stream = comm_stream_create(STREAM_THREAD, 60);
	if (ring_on_stream && ms->tp > 1)
		tp_coll_use_stream(&tpc, stream);
	struct fsdp f;
	int64_t before = mem_current(MEM_PARAMS) + mem_current(MEM_GRADS) + mem_current(MEM_OPTIM);
	fsdp_build(&f, &m, ms, use_bf16, FSDP_RESHARD_DEFAULT, stream);
	fsdp_init_params(&f, seed);
	struct adamw opt;
	adamw_init(&opt, f.shard_numel, 0.9, 0.95, 1e-8, 0.1);
	struct engine e;
	fsdp_engine(&f, &e);
	out->persistent_bytes =
	    mem_current(MEM_PARAMS) + mem_current(MEM_GRADS) + mem_current(MEM_OPTIM) - before;
	struct lr_schedule sched;
	lr_schedule_init(&sched, 2e-3, 2, -1, "linear", 0.1, STEPS);
	int32_t *tok = malloc((size_t)(accum * B * T) * sizeof(int32_t));
	int32_t *tgt = malloc((size_t)(accum * B * T) * sizeof(int32_t));
	for (int s = 0; s < STEPS; s++) {
		batch_rows(m.vocab_size, s, ms->dp_group.size, ms->dp_group.rank, accum, tok, tgt);
		struct train_step_result r;
		CHECK(engine_run(&e, tok, tgt, accum, &opt, lr_schedule_at(&sched, s), 0.3,
		                      &r) == CT_OK,
		      "step");
		out->losses[s] = r.loss;
		out->norms[s] = r.grad_norm;
	}
	if (ms->tp > 1)
		check_tp_nodes(&f, llama_cfg(&c), accum);
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
	free(local), free(tok), free(tgt);
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
	const struct model_build_opts opts = {.own_params = true};
	CHECK(model_build(&m, &c, B, T, &opts) == CT_OK, "build");
	out->act_bytes = ((struct llama_model *)m.impl)->act_bytes;
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

static void compare_tol(const struct run *a, const struct run *ref, const char *what, double tol)
{
	for (int s = 0; s < STEPS; s++) {
		fprintf(stderr, "  step %d: loss %.7f grad_norm %.7f (%s %.7f, %.7f)\n", s + 1,
		        a->losses[s], a->norms[s], what, ref->losses[s], ref->norms[s]);
		EXPECT(fabs(a->losses[s] - ref->losses[s]) <= tol * fabs(ref->losses[s]),
		       "step %d loss %.9g vs %s %.9g", s + 1, a->losses[s], what, ref->losses[s]);
		EXPECT(fabs(a->norms[s] - ref->norms[s]) <= tol * fabs(ref->norms[s]),
		       "step %d grad_norm %.9g vs %s %.9g", s + 1, a->norms[s], what,
		       ref->norms[s]);
	}
	double e = rel_err_f32(a->params, ref->params, global_numel());
	fprintf(stderr, "  gathered parameters after %d steps: rel err %.3e vs %s\n", STEPS, e,
	        what);
	EXPECT(e <= tol, "params rel err %.3e", e);
}

static void compare(const struct run *a, const struct run *ref, const char *what)
{
	compare_tol(a, ref, what, 1e-5);
}

TEST_CASE(test_tp_equivalence)
{
	struct run a, ref;
	run_sharded(&a, &mesh, ACCUM, false, false, false);
	/* all ranks report the same loss and grad norm (the TP ranks' loss is computed
	 * redundantly, from all-reduced statistics) */
	double *all = calloc((size_t)mesh.world * 2, sizeof(double));
	all[2 * mesh.rank] = a.losses[STEPS - 1];
	all[2 * mesh.rank + 1] = a.norms[STEPS - 1];
	comm_all_reduce_f64(&mesh.world_group, all, 2 * mesh.world);
	for (int r = 0; r < mesh.world; r++)
		EXPECT(all[2 * r] == all[0] && all[2 * r + 1] == all[1],
		       "rank %d final loss/grad_norm %.9g/%.9g differ from rank 0's %.9g/%.9g", r,
		       all[2 * r], all[2 * r + 1], all[0], all[1]);
	free(all);
	if (mesh.rank == 0) {
		run_single(&ref, mesh.dp_group.size * ACCUM);
		compare(&a, &ref, "1 rank");
		int64_t n = global_numel();
		double ideal = 16.0 * (double)n / (mesh.tp * mesh.dp_shard);
		fprintf(stderr,
		        "  persistent (params + grads + AdamW) per rank: %.3f MiB = %.3f of 1 "
		        "rank's (ideal 1/(tp x dp_shard) = %.3f)\n",
		        (double)a.persistent_bytes / 1048576.0,
		        (double)a.persistent_bytes / (16.0 * (double)n),
		        1.0 / (mesh.tp * mesh.dp_shard));
		EXPECT(a.persistent_bytes <= ideal * 1.05 + 16.0 * 64 * 1024,
		       "persistent %lld bytes, ideal %.0f", (long long)a.persistent_bytes, ideal);
		double ar = (double)a.act_bytes / (double)ref.act_bytes;
		fprintf(stderr, "  saved activations per rank: %.3f of 1 rank's (1/tp = %.3f)\n",
		        ar, 1.0 / mesh.tp);
		if (ac == MODEL_AC_NONE) /* the 1-rank reference saves everything */
			EXPECT(ar < 1.15 / mesh.tp, "activations %.3f of 1 rank's with tp %d", ar,
			       mesh.tp);
		free(ref.params);
	}
	free(a.params);
}

TEST_CASE(test_tp_bf16)
{
	/* bf16 all-gather rounds each weight element-wise, wherever it is cut: TP x FSDP in bf16
	 * equals FSDP alone in bf16 over the same global batch. */
	struct mesh flat;
	CHECK(mesh_build(&flat, 1, replicate, -1, 1) == CT_OK, "flat mesh");
	int64_t micro = (int64_t)ACCUM * mesh.dp_group.size;
	CHECK(micro % flat.dp_group.size == 0, "batch split");
	struct run a, ref;
	run_sharded(&a, &mesh, ACCUM, true, false, false);
	run_sharded(&ref, &flat, (int)(micro / flat.dp_group.size), true, false, false);
	if (mesh.rank == 0)
		compare(&a, &ref, "FSDP bf16");
	free(a.params);
	free(ref.params);
	mesh_free(&flat);
}

TEST_CASE(test_tp_async)
{
	/* async TP (ring steps over point-to-point transfers) computes what plain TP computes,
	 * up to the order of a few fp32 sums: losses, grad norms and the gathered parameters
	 * within 1e-6 on every rank */
	struct run a, s, ref;
	run_sharded(&ref, &mesh, ACCUM, false, false, false);
	run_sharded(&a, &mesh, ACCUM, false, true, false);
	compare_tol(&a, &ref, "plain TP", 1e-6);
	/* ... with the ring steps' transfers on the comm stream's thread: the same sums in the
	 * same order as point-to-point, so bitwise what the other async run computed */
	run_sharded(&s, &mesh, ACCUM, false, true, true);
	compare_tol(&s, &a, "async TP over point-to-point", 0.0);
	free(a.params), free(s.params);
	free(ref.params);
}

int main(int argc, char **argv)
{
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--tp") == 0 && i + 1 < argc)
			tp = atoi(argv[++i]);
		else if (strcmp(argv[i], "--replicate") == 0 && i + 1 < argc)
			replicate = atoi(argv[++i]);
		else if (strcmp(argv[i], "--bf16") == 0)
			bf16 = true;
		else if (strcmp(argv[i], "--ac-full") == 0)
			ac = MODEL_AC_FULL;
		else if (strcmp(argv[i], "--ac-ffn") == 0)
			ac = MODEL_AC_FFN;
		else if (strcmp(argv[i], "--ac-selective") == 0)
			ac = MODEL_AC_SELECTIVE;
		else if (strcmp(argv[i], "--async") == 0)
			async_tp = true;
	}
	CHECK(mesh_build(&mesh, 1, replicate, -1, tp) == CT_OK, "mesh");
	int64_t s0 = mesh.rank == 0 ? (int64_t)test_seed() : 0; /* rank 0's seed for all */
	comm_all_reduce_i64(&mesh.world_group, &s0, 1);
	seed = (uint64_t)s0;
	if (mesh.rank == 0)
		fprintf(stderr, "world %d = %d replicas x %d shards x %d tensor-parallel%s\n",
		        mesh.world, mesh.dp_replicate, mesh.dp_shard, mesh.tp,
		        ac == MODEL_AC_FULL        ? ", full activation checkpointing"
		        : ac == MODEL_AC_FFN       ? ", ffn activation checkpointing"
		        : ac == MODEL_AC_SELECTIVE ? ", selective activation checkpointing"
		                                   : "");
	if (async_tp)
		RUN(test_tp_async);
	else if (bf16)
		RUN(test_tp_bf16);
	else
		RUN(test_tp_equivalence);
	/* every rank's verdict counts */
	int64_t fails = test_summary() != 0;
	comm_all_reduce_i64(&mesh.world_group, &fails, 1);
	mesh_free(&mesh);
	comm_finalize();
	return fails ? 1 : 0;
}
