/* bench/bench_float8: the fp8 all-gather's bytes and step time. The 125M model under FSDP on
 * the ranks it is launched with (2 for issue 17), bf16 mixed precision, over a simulated
 * link (default 10 Gb/s, the comm stream's simulate mode: every collective lasts at least
 * latency + bytes / bandwidth), one step per row after one warm-up step:
 *   bf16              plain bf16 linears, bf16 all-gather
 *   float8+bf16 wire  float8 (tensorwise, emulated) linears, bf16 all-gather
 *   float8+fp8 wire   the same with enable_fsdp_float8_all_gather
 * The wire's effect is the last two rows' ratio (same compute). Prints the CPU, engine and
 * ISAs per row, the all-gather bytes of the step (counted by comm/) and its time.
 *   mpiexec -n 2 build/bench/bench_float8 [--gbps 10] [--seq 256] [--batch 1]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/fp8.h"
#include "base/log.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "comm/stream.h"
#include "data/synthetic.h"
#include "kernels/fp8_linear.h"
#include "kernels/mm_engine.h"
#include "optim/optim.h"
#include "parallel/fsdp.h"
#include "train/compute.h"
#include "train/trainer.h"

struct row {
	const char *name;
	bool float8, fp8_wire;
	double step_s;
	int64_t ag_bytes, ar_bytes, rs_bytes;
};

static void run_row(struct row *r, const struct mesh *mesh, int64_t B, int64_t T, double gbps)
{
	struct model_config c;
	memset(&c, 0, sizeof(c));
	struct llama_config *lc = llama_cfg_init(&c);
	llama_config_preset(lc, "125M");
	llama_config_finish(lc);
	fp8_linear_configure(r->float8, FP8_TENSORWISE, "output");
	struct model m;
	const struct model_build_opts opts = {.own_params = false};
	CHECK(model_build(&m, &c, B, T, &opts) == CT_OK, "build");
	struct comm_stream *stream = comm_stream_create(STREAM_THREAD, 600);
	comm_stream_simulate(stream, gbps, 0);
	struct fsdp f;
	fsdp_build(&f, &m, mesh, true, FSDP_RESHARD_DEFAULT, stream);
	if (r->fp8_wire)
		fsdp_set_fp8_all_gather(&f, true);
	fsdp_init_params(&f, 1);
	struct adamw opt;
	adamw_init(&opt, f.shard_numel, 0.9, 0.95, 1e-8, 0.1);
	struct engine e;
	fsdp_engine(&f, &e);
	int64_t G = B * mesh->dp_group.size;
	int32_t *tok = malloc((size_t)(B * T) * 4), *tgt = malloc((size_t)(B * T) * 4);
	for (int s = 0; s < 2; s++) {
		synthetic_batch(1, m.vocab_size, s * G + mesh->dp_group.rank * B, B, T, tok, tgt);
		comm_barrier(&mesh->world_group);
		comm_reset_bytes();
		double t = timer_now();
		struct train_step_result res;
		const struct engine_step_in in = {
		    .tokens = tok, .targets = tgt, .accum = 1, .opt = &opt, .lr = 1e-4, .max_norm = 1.0,
		    .res = &res};
		CHECK(engine_step(&e, &in) == CT_OK, "step");
		r->step_s = timer_now() - t;
		r->ag_bytes = comm_bytes(COMM_ALL_GATHER);
		r->ar_bytes = comm_bytes(COMM_ALL_REDUCE);
		r->rs_bytes = comm_bytes(COMM_REDUCE_SCATTER);
	}
	free(tok), free(tgt);
	adamw_free(&opt);
	fsdp_free(&f);
	comm_stream_destroy(stream);
	model_free(&m);
}

int main(int argc, char **argv)
{
	double gbps = 10;
	int64_t T = 256, B = 1;
	CHECK(comm_init(&argc, &argv) == CT_OK, "comm init");
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--gbps") == 0)
			gbps = atof(argv[i + 1]);
		else if (strcmp(argv[i], "--seq") == 0)
			T = atoll(argv[i + 1]);
		else if (strcmp(argv[i], "--batch") == 0)
			B = atoll(argv[i + 1]);
	}
	struct mesh mesh;
	CHECK(mesh_build(&mesh, 1, 1, -1, 1) == CT_OK, "mesh");
	mm_engine_configure(MM_ENGINE_AUTO, MM_BF16);
	struct row rows[] = {{"bf16", false, false, 0, 0, 0, 0},
	                     {"float8+bf16 wire", true, false, 0, 0, 0, 0},
	                     {"float8+fp8 wire", true, true, 0, 0, 0, 0}};
	int n = (int)(sizeof(rows) / sizeof(rows[0]));
	for (int i = 0; i < n; i++)
		run_row(&rows[i], &mesh, B, T, gbps);
	if (mesh.rank == 0) {
		const struct cpu_info *ci = cpu_info();
		printf("125M, FSDP on %d ranks, batch %lld x seq %lld per rank, bf16 mixed precision, "
		       "simulated link %.1f Gb/s; step 2 of 2 per row\n",
		       mesh.world, (long long)B, (long long)T, gbps);
		printf("%-18s %9s %14s %12s %12s  %s\n", "row", "step s", "all-gather B",
		       "all-red. B", "red-scat. B", "cpu | engine | oneDNN ISA | fp8 casts");
		for (int i = 0; i < n; i++)
			printf("%-18s %9.3f %14lld %12lld %12lld  %s | %s | %s | %s\n", rows[i].name,
			       rows[i].step_s, (long long)rows[i].ag_bytes,
			       (long long)rows[i].ar_bytes, (long long)rows[i].rs_bytes, ci->brand,
			       mm_engine_name(mm_engine_get()), mm_onednn_isa(), fp8_isa());
		printf("fp8 wire / bf16 wire (float8 rows): all-gather bytes %.3f, step time %.3f "
		       "(%.2fx faster)\n",
		       (double)rows[2].ag_bytes / (double)rows[1].ag_bytes,
		       rows[2].step_s / rows[1].step_s, rows[1].step_s / rows[2].step_s);
	}
	mesh_free(&mesh);
	comm_finalize();
	return 0;
}
