/* Pipeline schedules as data (one process):
 *  - every generator checks (each compute once, transfers matched, dependencies in order, no
 *    deadlock) and its unit-time bubble equals theory: (p-1)/(m+p-1) for GPipe and 1F1B,
 *    (p-1)/(vm+p-1) for Interleaved1F1B, (p-1)/(3m+p-1) for ZB-H1, for p = 2, 4 and
 *    m = 4, 8, 16;
 *  - in-flight micro-batches: GPipe holds m on every rank, 1F1B p - r on rank r (p on the
 *    first), ZB-H1 at most p + 1;
 *  - damaged schedules fail with the reason: a random receive removed (unmatched send), a
 *    random compute action removed, a rank's order reversed (deadlock or broken dependency);
 *  - CSV: written and read back identical; compute-only CSV gets its transfers; bad cells,
 *    an unmatched send, wrong micro-batch counts and unknown names are rejected;
 *  - every rank's step as schedule nodes (sched_build_pp) validates for every style, and
 *    validation rejects it with a node removed (a transfer's WAIT, a compute node) or a SEND
 *    moved before the compute it sends;
 *  - the forward-only schedule (validation) checks for p = 2, 4, v = 1, 2, m = 4, 8: each
 *    rank v x m forwards and no backward or backward transfer; it fails with a forward removed
 *    or a backward added; its nodes validate without reduce-scatter, CLIP or OPTIM, and not
 *    with a forward removed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "schedule/pp_schedule.h"
#include "schedule/sched_cost.h"
#include "schedule/schedule.h"
#include "testutil.h"

static const enum pp_style styles[] = {PP_GPIPE, PP_1F1B, PP_INTERLEAVED_1F1B, PP_ZB_H1};

TEST_CASE(bubbles_and_memory)
{
	for (int si = 0; si < 4; si++)
		for (int p = 2; p <= 4; p += 2)
			for (int m = 4; m <= 16; m *= 2) {
				enum pp_style st = styles[si];
				int v = st == PP_INTERLEAVED_1F1B ? 2 : 1;
				struct pp_sched s;
				EXPECT(pp_sched_generate(&s, st, p, v, m) == CT_OK, "generate");
				struct pp_sim sim;
				char why[256] = "";
				bool ok = pp_sched_check(&s, &sim, why, sizeof(why));
				EXPECT(ok, "%s p=%d m=%d: %s", pp_style_name(st), p, m, why);
				if (!ok) {
					pp_sched_free(&s);
					continue;
				}
				double th = pp_bubble_theory(st, p, v, m);
				printf("  %-16s p=%d v=%d m=%2d  bubble %.4f  theory %.4f  in-flight",
				       pp_style_name(st), p, v, m, sim.bubble, th);
				for (int r = 0; r < p; r++)
					printf(" %d", sim.peak_inflight[r]);
				printf("\n");
				EXPECT(sim.bubble < th + 1e-12 && sim.bubble > th - 1e-12,
				       "%s p=%d m=%d bubble %g, theory %g", pp_style_name(st), p, m,
				       sim.bubble, th);
				for (int r = 0; r < p; r++) {
					int pk = sim.peak_inflight[r];
					if (st == PP_GPIPE)
						EXPECT(pk == m, "GPipe rank %d holds %d, not m=%d", r, pk,
						       m);
					if (st == PP_1F1B)
						EXPECT(pk == p - r, "1F1B rank %d holds %d, not p-r=%d", r,
						       pk, p - r);
					if (st == PP_ZB_H1)
						EXPECT(pk <= p + 1, "ZB-H1 rank %d holds %d > p+1", r, pk);
				}
				pp_sim_free(&sim);
				pp_sched_free(&s);
			}
}

/* Remove action i of rank r (returns what was removed). */
static struct pp_action drop(struct pp_sched *s, int r, int i)
{
	struct pp_action a = s->a[r][i];
	memmove(&s->a[r][i], &s->a[r][i + 1], (size_t)(s->n[r] - i - 1) * sizeof(a));
	s->n[r]--;
	return a;
}

TEST_CASE(damaged_schedules_fail)
{
	for (int trial = 0; trial < 40; trial++) {
		enum pp_style st = styles[trial % 4];
		int p = 2 + (int)test_uniform(0, 3), v = st == PP_INTERLEAVED_1F1B ? 2 : 1;
		int m = p * (1 + (int)test_uniform(0, 3));
		struct pp_sched s;
		EXPECT(pp_sched_generate(&s, st, p, v, m) == CT_OK, "generate");
		int r = (int)test_uniform(0, p), kind = trial % 3;
		char why[256] = "", what[32] = "";
		if (kind == 0 || kind == 1) {
			/* a receive (kind 0) or a compute action (kind 1) at random */
			int i;
			do {
				i = (int)test_uniform(0, s.n[r]);
			} while (kind == 0 ? (s.a[r][i].kind != PP_RECV_F &&
			                      s.a[r][i].kind != PP_RECV_B)
			                   : s.a[r][i].kind > PP_W);
			struct pp_action a = drop(&s, r, i);
			pp_action_str(&a, what, sizeof(what));
		} else {
			for (int i = 0; i < s.n[r] / 2; i++) {
				struct pp_action t = s.a[r][i];
				s.a[r][i] = s.a[r][s.n[r] - 1 - i];
				s.a[r][s.n[r] - 1 - i] = t;
			}
			snprintf(what, sizeof(what), "reversed rank %d", r);
		}
		bool ok = pp_sched_check(&s, NULL, why, sizeof(why));
		EXPECT(!ok, "%s p=%d m=%d: damaged (%s) but checks", pp_style_name(st), p, m,
		       what);
		if (kind == 0)
			EXPECT(strstr(why, "unmatched send"), "%s: '%s'", what, why);
		if (trial < 3)
			printf("  damaged %s: %s\n", what, why);
		pp_sched_free(&s);
	}
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	fputs(text, f);
	fclose(f);
}

TEST_CASE(csv)
{
	char dir[] = "/tmp/ct_ppcsvXXXXXX", path[64];
	EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof(path), "%s/s.csv", dir);
	for (int si = 0; si < 4; si++) {
		enum pp_style st = styles[si];
		struct pp_sched s, back;
		pp_sched_generate(&s, st, 4, st == PP_INTERLEAVED_1F1B ? 2 : 1, 8);
		EXPECT(pp_sched_write_csv(&s, path) == CT_OK, "write");
		EXPECT(pp_sched_read_csv(&back, path, 4, 8) == CT_OK, "read back %s",
		       pp_style_name(st));
		bool same = back.n_stages == s.n_stages;
		for (int r = 0; same && r < 4; r++)
			same = back.n[r] == s.n[r] &&
			       memcmp(back.a[r], s.a[r], (size_t)s.n[r] * sizeof(**s.a)) == 0;
		EXPECT(same, "%s: CSV round trip differs", pp_style_name(st));
		pp_sched_free(&s);
		pp_sched_free(&back);
	}
	/* compute only (TorchTitan's usual form): transfers inserted, 1F1B on 2 ranks */
	write_text(path, "0F0,0F1,0B0,0F2,0B1,0B2\n,1F0,1B0,1F1,1B1,1F2,1B2\n");
	struct pp_sched s;
	EXPECT(pp_sched_read_csv(&s, path, 2, 3) == CT_OK, "compute-only CSV");
	EXPECT(pp_sched_has_comms(&s), "transfers inserted");
	pp_sched_free(&s);
	static const struct {
		const char *text;
		int m;
		const char *msg;
	} bad[] = {
	    {"0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n", 1, "unmatched send"},
	    {"0F0,0X0\n1F0,1B0\n", 1, "not an action"},
	    {"0F0,0B0\n1F0,1B0\n", 2, "micro-batches"},
	    {"0F0,0B0\n", 1, "rows"},
	    {"1F0,0F0,0B0\n1B0\n", 1, "runs on rank"},
	    {"0F0\n1F0,1B0\n", 1, "never runs"},
	    {"0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1\n"
	     "1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F0,1F0,1B0,1SEND_B0\n",
	     2, "deadlock"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_text(path, bad[i].text);
		char err[1024] = "", errpath[80];
		snprintf(errpath, sizeof(errpath), "%s/err.txt", dir);
		fflush(stderr);
		int saved = dup(2);
		FILE *ef = fopen(errpath, "w+");
		dup2(fileno(ef), 2);
		int rc = pp_sched_read_csv(&s, path, 2, bad[i].m);
		fflush(stderr);
		dup2(saved, 2);
		close(saved);
		rewind(ef);
		size_t got = fread(err, 1, sizeof(err) - 1, ef);
		err[got] = 0;
		fclose(ef);
		unlink(errpath);
		EXPECT(rc == CT_ERR_USAGE, "bad CSV %zu accepted", i);
		EXPECT(strstr(err, bad[i].msg) && strstr(err, "pipeline_parallel_schedule_csv"),
		       "bad CSV %zu: message '%s' lacks '%s'", i, err, bad[i].msg);
		if (rc == CT_OK)
			pp_sched_free(&s);
	}
	unlink(path);
	rmdir(dir);
}

TEST_CASE(bad_names_and_counts)
{
	enum pp_style st;
	EXPECT(pp_style_parse("interleaved1f1b", &st) == CT_OK && st == PP_INTERLEAVED_1F1B,
	       "case-insensitive");
	EXPECT(pp_style_parse("ZBH1", &st) == CT_OK && st == PP_ZB_H1, "alias");
	EXPECT(pp_style_parse("LoopedDFS", &st) == CT_ERR_USAGE, "unknown name");
	struct pp_sched s;
	EXPECT(pp_sched_generate(&s, PP_INTERLEAVED_1F1B, 4, 2, 6) == CT_ERR_USAGE,
	       "m=6 on p=4 interleaved");
	EXPECT(pp_sched_generate(&s, PP_1F1B, 2, 2, 4) == CT_ERR_USAGE, "v=2 for 1F1B");
}

/* A copy of s without node `drop`, or with node `from` moved to position `to`. */
static void edited(const struct sched *s, int drop, int from, int to, struct sched *out)
{
	sched_init_like(out, s);
	for (int i = 0; i < s->n_nodes; i++) {
		if (i == to && from >= 0)
			sched_push(out, s->nodes[from]);
		if (i != drop && i != from)
			sched_push(out, s->nodes[i]);
	}
}

static int find(const struct sched *s, enum sched_kind k, enum sched_kind wk, int after)
{
	for (int i = after + 1; i < s->n_nodes; i++)
		if (s->nodes[i].kind == k && (k != SCHED_WAIT || s->nodes[i].wait_kind == wk))
			return i;
	return -1;
}

TEST_CASE(pipeline_nodes)
{
	for (int si = 0; si < 4; si++)
		for (int p = 2; p <= 4; p += 2) {
			enum pp_style st = styles[si];
			int v = st == PP_INTERLEAVED_1F1B ? 2 : 1, m = 8, S = p * v, L = 2 * S - 2;
			struct pp_sched ps;
			EXPECT(pp_sched_generate(&ps, st, p, v, m) == CT_OK, "generate");
			int *u0 = calloc((size_t)S + 1, sizeof(int));
			for (int k = 0; k <= S; k++) /* two units per stage */
				u0[k] = 2 * k;
			struct sched_unit *units = calloc((size_t)L + 2, sizeof(*units));
			for (int r = 0; r < p; r++) {
				struct sched s, bad;
				char why[256] = "";
				sched_build_pp(&s, &ps, r, units, L + 2, u0);
				EXPECT(sched_validate(&s, why, sizeof(why)), "%s p=%d rank %d: %s",
				       pp_style_name(st), p, r, why);
				/* the WAIT of a receive removed: its compute reads nothing */
				int w = find(&s, SCHED_WAIT, SCHED_PP_RECV, -1);
				edited(&s, w, -1, -1, &bad);
				EXPECT(!sched_validate(&bad, why, sizeof(why)),
				       "%s rank %d: a receive never waited passes", pp_style_name(st),
				       r);
				sched_free(&bad);
				/* a compute node removed */
				edited(&s, find(&s, SCHED_PP_F, SCHED_WAIT, -1), -1, -1, &bad);
				EXPECT(!sched_validate(&bad, why, sizeof(why)),
				       "%s rank %d: a missing forward passes", pp_style_name(st), r);
				sched_free(&bad);
				/* a send moved before the compute that writes its buffer */
				int snd = find(&s, SCHED_PP_SEND, SCHED_WAIT, -1);
				int f = snd - 1;
				while (f >= 0 && !sched_kind_pp_compute(s.nodes[f].kind))
					f--;
				edited(&s, -1, snd, f, &bad);
				EXPECT(!sched_validate(&bad, why, sizeof(why)),
				       "%s rank %d: a send before its compute passes", pp_style_name(st),
				       r);
				sched_free(&bad);
				sched_free(&s);
			}
			free(units), free(u0);
			pp_sched_free(&ps);
		}
}

TEST_CASE(forward_only)
{
	for (int p = 2; p <= 4; p += 2)
		for (int v = 1; v <= 2; v++)
			for (int m = 4; m <= 8; m += 4) {
				struct pp_sched s;
				char why[256] = "";
				EXPECT(pp_sched_forward_only(&s, PP_1F1B, p, v, m) == CT_OK, "generate");
				EXPECT(pp_sched_check(&s, NULL, why, sizeof(why)),
				       "forward-only p=%d v=%d m=%d: %s", p, v, m, why);
				for (int r = 0; r < p; r++) {
					int nf = 0, nb = 0;
					for (int i = 0; i < s.n[r]; i++) {
						nf += s.a[r][i].kind == PP_F;
						nb += s.a[r][i].kind != PP_F &&
						      s.a[r][i].kind != PP_SEND_F &&
						      s.a[r][i].kind != PP_RECV_F;
					}
					EXPECT(nf == v * m && nb == 0,
					       "forward-only p=%d v=%d rank %d: %d F, %d other", p, v,
					       r, nf, nb);
				}
				/* the nodes of every rank validate, with no tail */
				int S = p * v, *u0 = calloc((size_t)S + 1, sizeof(int));
				for (int k = 0; k <= S; k++)
					u0[k] = 2 * k;
				struct sched_unit *units = calloc((size_t)2 * S, sizeof(*units));
				for (int r = 0; r < p; r++) {
					struct sched n, bad;
					sched_build_pp(&n, &s, r, units, 2 * S, u0);
					EXPECT(sched_validate(&n, why, sizeof(why)),
					       "forward-only nodes p=%d rank %d: %s", p, r, why);
					EXPECT(find(&n, SCHED_REDUCE_SCATTER, SCHED_WAIT, -1) < 0 &&
					           find(&n, SCHED_OPTIM, SCHED_WAIT, -1) < 0,
					       "forward-only nodes have a tail");
					edited(&n, find(&n, SCHED_PP_F, SCHED_WAIT, -1), -1, -1, &bad);
					EXPECT(!sched_validate(&bad, why, sizeof(why)),
					       "forward-only rank %d: a missing forward passes", r);
					sched_free(&bad);
					sched_free(&n);
				}
				free(units), free(u0);
				/* damaged: a forward dropped; a backward added */
				int r = (int)test_uniform(0, p), i;
				do {
					i = (int)test_uniform(0, s.n[r]);
				} while (s.a[r][i].kind != PP_F);
				struct pp_action a = drop(&s, r, i);
				EXPECT(!pp_sched_check(&s, NULL, why, sizeof(why)),
				       "forward-only without %dF%d checks", a.stage, a.micro);
				pp_sched_free(&s);
				pp_sched_forward_only(&s, PP_1F1B, p, v, m);
				s.a[p - 1][s.n[p - 1] - 1] = (struct pp_action){PP_B, S - 1, m - 1};
				EXPECT(!pp_sched_check(&s, NULL, why, sizeof(why)) &&
				           strstr(why, "runs a backward"),
				       "forward-only with a backward: '%s'", why);
				if (p == 2 && v == 1 && m == 4)
					printf("  forward-only with a backward: %s\n", why);
				pp_sched_free(&s);
			}
}

/* The pipeline's cost model on ranks that share cores: with host_load 2 (4 ranks on 2 cores,
 * rates calibrated with all computing) the bubbles' compute runs at twice the calibrated
 * rate, so the step is shorter than the fully shared timing but no shorter than half of it;
 * host_load 1 (a core per rank) leaves the timing as it is. */
TEST_CASE(pipeline_cost_shared_cores)
{
	int p = 2, m = 4, S = 2, L = 2 * S - 2, U = L + 2;
	struct pp_sched ps;
	EXPECT(pp_sched_generate(&ps, PP_1F1B, p, 1, m) == CT_OK, "generate");
	int u0[3] = {0, 2, 4};
	struct sched_unit *units = calloc((size_t)U, sizeof(*units));
	struct sched ranks[2];
	for (int r = 0; r < p; r++)
		sched_build_pp(&ranks[r], &ps, r, units, U, u0);
	struct sched_cost_model cm;
	memset(&cm, 0, sizeof(cm));
	cm.n_units = U;
	cm.matmul_flops = 1e9, cm.attn_flops = 1e9, cm.mem_bytes_s = 1e12;
	cm.dp_shard = 1;
	for (int k = 0; k < SCHED_WORK_COUNT; k++) /* forward 1 ms a unit, backward 2 ms */
		for (int t = 0; t < SCHED_TERM_COUNT; t++) {
			cm.work[k][t] = calloc((size_t)U, sizeof(double));
			for (int u = 0; u < U && t == SCHED_TERM_MATMUL; u++)
				cm.work[k][t][u] = k == SCHED_WORK_FWD ? 1e6 : k == SCHED_WORK_BWD ? 2e6 : 0;
		}
	struct sched_pp_link link = {.latency_s = 1e-5, .bytes_s = 1e9, .bytes = 1000};
	struct sched_pp_prediction shared, one, two;
	sched_predict_pp(ranks, &cm, &link, &shared);
	link.host_load = 1.0;
	sched_predict_pp(ranks, &cm, &link, &one);
	link.host_load = 2.0;
	sched_predict_pp(ranks, &cm, &link, &two);
	EXPECT(one.step_s == shared.step_s, "host load 1 changed the step: %g vs %g s", one.step_s,
	       shared.step_s);
	EXPECT(shared.bubble > 0.05, "no bubble to test with (%g)", shared.bubble);
	EXPECT(two.step_s < 0.97 * shared.step_s && two.step_s >= 0.5 * shared.step_s,
	       "host load 2: step %g s, fully shared %g s (bubble %g)", two.step_s, shared.step_s,
	       shared.bubble);
	for (int k = 0; k < SCHED_WORK_COUNT; k++)
		for (int t = 0; t < SCHED_TERM_COUNT; t++)
			free(cm.work[k][t]);
	for (int r = 0; r < p; r++)
		sched_free(&ranks[r]);
	free(units);
	pp_sched_free(&ps);
}

int main(void)
{
	printf("seed %llu\n", (unsigned long long)test_seed());
	RUN(bubbles_and_memory);
	RUN(damaged_schedules_fail);
	RUN(csv);
	RUN(bad_names_and_counts);
	RUN(pipeline_nodes);
	RUN(forward_only);
	RUN(pipeline_cost_shared_cores);
	return test_summary();
}
