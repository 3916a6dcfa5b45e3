/* Tests of the position-aware attention kernel (src/kernels/attention_pos.c), the building
 * block of context parallelism:
 *   - with positions 0..T-1 it is the tiled causal kernel (attention.c), in double;
 *   - a head-tail shard of queries (the chunks r and 2cp-1-r of 2cp) against all keys in a
 *     permuted order gives the full causal attention's rows of those queries;
 *   - partials over disjoint key blocks, merged with their statistics, equal attention over
 *     the union (in any merge order), and rows that see no key are neutral;
 *   - the backward, summed over the key blocks with the merged out and lse, matches central
 *     finite differences of L = sum(out * g) in double (dq, dk, dv);
 *   - over several tiles: every rank's backward of its head-tail shard, summed over the
 *     ranks, is the tiled causal kernel's backward (whose FD test is test_attention's);
 *   - f32 against f64;
 *   - parallel/cp.c's token orders: the head-tail order is TorchTitan's and gives every rank
 *     the same causal work (query-key pairs), the contiguous one does not.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "parallel/cp.h"
#include "testutil.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static double *dalloc(int64_t n)
{
	double *p = calloc((size_t)n, sizeof(double));
	if (!p)
		abort();
	return p;
}

/* Head-tail order of T positions over cp ranks: rank r holds chunks r and 2cp-1-r. */
static void headtail_positions(int64_t *pos, int64_t T, int cp)
{
	int64_t c = T / (2 * cp), n = 0;
	for (int r = 0; r < cp; r++) {
		for (int64_t t = 0; t < c; t++)
			pos[n++] = r * c + t;
		for (int64_t t = 0; t < c; t++)
			pos[n++] = (2 * cp - 1 - r) * c + t;
	}
}

/* rows[i] of a (B, T, W) tensor taken at sequence index idx[i] (i < n) into (B, n, W) */
static void take_rows(double *dst, const double *src, const int64_t *idx, int64_t n, int64_t B,
                      int64_t T, int64_t W)
{
	for (int64_t b = 0; b < B; b++)
		for (int64_t i = 0; i < n; i++)
			memcpy(dst + (b * n + i) * W, src + (b * T + idx[i]) * W,
			       (size_t)W * sizeof(double));
}

TEST_CASE(identity_positions_match_tiled_kernel)
{
	const int64_t B = 2, T = 70, H = 4, KV = 2, D = 8;
	double *q = dalloc(B * T * H * D), *k = dalloc(B * T * KV * D), *v = dalloc(B * T * KV * D);
	double *o1 = dalloc(B * T * H * D), *o2 = dalloc(B * T * H * D);
	double *l1 = dalloc(B * H * T), *l2 = dalloc(B * H * T);
	int64_t pos[70];
	for (int64_t t = 0; t < T; t++)
		pos[t] = t;
	test_fill(q, B * T * H * D, -1.5, 1.5);
	test_fill(k, B * T * KV * D, -1.5, 1.5);
	test_fill(v, B * T * KV * D, -1, 1);
	attention_forward_f64(o1, l1, q, k, v, B, T, H, KV, D);
	attention_pos_forward_f64(o2, l2, q, pos, k, v, pos, B, T, T, H, KV, D);
	double eo = rel_err_f64(o2, o1, B * T * H * D), el = rel_err_f64(l2, l1, B * H * T);
	EXPECT(eo < 1e-12 && el < 1e-12, "out err %.3g lse err %.3g", eo, el);
	free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2);
}

/* The problem of the sharded tests: the full causal attention of (B, T) and one rank's
 * head-tail query shard against all keys held in head-tail order, split into nblk blocks. */
struct sharded {
	int64_t B, T, H, KV, D, Tq;
	double *q, *k, *v;       /* full sequences (B,T,..) */
	double *qs, *ks, *vs;    /* the shard's queries, all keys in head-tail order */
	int64_t *order, *qpos;   /* head-tail order of all T; the shard's positions */
	double *out, *lse, *g;   /* merged result of the shard (B,Tq,H,D), (B,H,Tq), dL/dout */
};

static struct sharded sharded_make(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int cp,
                                   int rank)
{
	struct sharded s = {.B = B, .T = T, .H = H, .KV = KV, .D = D, .Tq = T / cp};
	s.q = dalloc(B * T * H * D), s.k = dalloc(B * T * KV * D), s.v = dalloc(B * T * KV * D);
	test_fill(s.q, B * T * H * D, -1.5, 1.5);
	test_fill(s.k, B * T * KV * D, -1.5, 1.5);
	test_fill(s.v, B * T * KV * D, -1, 1);
	s.order = calloc((size_t)T, sizeof(int64_t));
	headtail_positions(s.order, T, cp);
	s.qpos = s.order + rank * s.Tq;
	s.qs = dalloc(B * s.Tq * H * D), s.ks = dalloc(B * T * KV * D), s.vs = dalloc(B * T * KV * D);
	take_rows(s.qs, s.q, s.qpos, s.Tq, B, T, H * D);
	take_rows(s.ks, s.k, s.order, T, B, T, KV * D);
	take_rows(s.vs, s.v, s.order, T, B, T, KV * D);
	s.out = dalloc(B * s.Tq * H * D), s.lse = dalloc(B * H * s.Tq), s.g = dalloc(B * s.Tq * H * D);
	test_fill(s.g, B * s.Tq * H * D, -1, 1);
	return s;
}

static void sharded_free(struct sharded *s)
{
	free(s->q), free(s->k), free(s->v), free(s->qs), free(s->ks), free(s->vs);
	free(s->order), free(s->out), free(s->lse), free(s->g);
}

/* Key block b of nblk (contiguous in the held order) as its own (B, Tb, KV, D) tensors. */
static void key_block(const struct sharded *s, int nblk, int blk, double *kb, double *vb,
                      int64_t *kpos)
{
	int64_t Tb = s->T / nblk, W = s->KV * s->D;
	for (int64_t b = 0; b < s->B; b++) {
		memcpy(kb + b * Tb * W, s->ks + (b * s->T + blk * Tb) * W, (size_t)(Tb * W) * 8);
		memcpy(vb + b * Tb * W, s->vs + (b * s->T + blk * Tb) * W, (size_t)(Tb * W) * 8);
	}
	memcpy(kpos, s->order + blk * Tb, (size_t)Tb * sizeof(int64_t));
}

/* Forward as ring attention does it: block by block in the order blk0, blk0-1, ... (mod
 * nblk), merging each partial into s->out / s->lse. */
static void sharded_forward(struct sharded *s, int nblk, int blk0)
{
	int64_t Tb = s->T / nblk, nq = s->B * s->Tq * s->H * s->D, nl = s->B * s->H * s->Tq;
	double *kb = dalloc(s->B * Tb * s->KV * s->D), *vb = dalloc(s->B * Tb * s->KV * s->D);
	double *ob = dalloc(nq), *lb = dalloc(nl);
	int64_t *kpos = calloc((size_t)Tb, sizeof(int64_t));
	for (int i = 0; i < nblk; i++) {
		int blk = ((blk0 - i) % nblk + nblk) % nblk;
		key_block(s, nblk, blk, kb, vb, kpos);
		attention_pos_forward_f64(i ? ob : s->out, i ? lb : s->lse, s->qs, s->qpos, kb, vb,
		                          kpos, s->B, s->Tq, Tb, s->H, s->KV, s->D);
		if (i)
			attention_merge_f64(s->out, s->lse, ob, lb, s->B, s->Tq, s->H, s->D);
	}
	free(kb), free(vb), free(ob), free(lb), free(kpos);
}

TEST_CASE(headtail_shard_matches_full_causal)
{
	const int64_t B = 2, T = 200, H = 4, KV = 2, D = 8; /* several tiles, chunks across them */
	double *of = dalloc(B * T * H * D), *lf = dalloc(B * H * T);
	for (int cp = 2; cp <= 4; cp += 2)
		for (int rank = 0; rank < cp; rank++)
			for (int nblk = 1; nblk <= cp; nblk *= cp) {
				struct sharded s = sharded_make(B, T, H, KV, D, cp, rank);
				attention_forward_f64(of, lf, s.q, s.k, s.v, B, T, H, KV, D);
				double *oref = dalloc(B * s.Tq * H * D), *lref = dalloc(B * H * s.Tq);
				take_rows(oref, of, s.qpos, s.Tq, B, T, H * D);
				for (int64_t bh = 0; bh < B * H; bh++)
					for (int64_t i = 0; i < s.Tq; i++)
						lref[bh * s.Tq + i] = lf[bh * T + s.qpos[i]];
				sharded_forward(&s, nblk, rank);
				double eo = rel_err_f64(s.out, oref, B * s.Tq * H * D);
				double el = rel_err_f64(s.lse, lref, B * H * s.Tq);
				EXPECT(eo < 1e-12 && el < 1e-12,
				       "cp=%d rank %d, %d key blocks: out err %.3g lse err %.3g", cp,
				       rank, nblk, eo, el);
				free(oref), free(lref);
				sharded_free(&s);
			}
	free(of), free(lf);
}

TEST_CASE(merge_order_and_empty_rows)
{
	/* rank 0 of cp=4 holds chunks 0 and 7: its chunk-0 rows see no key of the later blocks
	 * (neutral partials); any block order gives the same merge */
	const int64_t B = 1, T = 32, H = 2, KV = 1, D = 4;
	struct sharded a = sharded_make(B, T, H, KV, D, 4, 0);
	sharded_forward(&a, 4, 0);
	double *o0 = dalloc(B * a.Tq * H * D), *l0 = dalloc(B * H * a.Tq);
	memcpy(o0, a.out, (size_t)(B * a.Tq * H * D) * 8);
	memcpy(l0, a.lse, (size_t)(B * H * a.Tq) * 8);
	sharded_forward(&a, 4, 2);
	EXPECT(rel_err_f64(a.out, o0, B * a.Tq * H * D) < 1e-13, "merge order changes out");
	/* a block after every query: all rows -inf, out 0 */
	int64_t kpos[8], qpos[8];
	for (int i = 0; i < 8; i++)
		kpos[i] = 100 + i, qpos[i] = i;
	double kb[8 * 4] = {0}, vb[8 * 4] = {0}, ob[8 * 2 * 4], lb[2 * 8];
	attention_pos_forward_f64(ob, lb, a.qs, qpos, kb, vb, kpos, 1, 8, 8, H, KV, D);
	bool empty = true;
	for (int i = 0; i < 16; i++)
		empty = empty && lb[i] == -INFINITY && ob[i] == 0;
	EXPECT(empty, "rows that see no key are not -inf / 0");
	free(o0), free(l0);
	sharded_free(&a);
}

/* L = sum(out * g) of the merged sharded forward */
static double sharded_loss(struct sharded *s, int nblk)
{
	sharded_forward(s, nblk, 0);
	double L = 0;
	for (int64_t i = 0; i < s->B * s->Tq * s->H * s->D; i++)
		L += s->out[i] * s->g[i];
	return L;
}

TEST_CASE(backward_matches_finite_differences)
{
	const int64_t B = 1, T = 16, H = 4, KV = 2, D = 4;
	const int cp = 2, nblk = 2;
	for (int rank = 0; rank < cp; rank++) {
		struct sharded s = sharded_make(B, T, H, KV, D, cp, rank);
		int64_t Tb = T / nblk, nq = B * s.Tq * H * D, nk = B * T * KV * D;
		sharded_forward(&s, nblk, 0);
		/* analytic: the block contributions with the merged out and lse */
		double *dq = dalloc(nq), *dk = dalloc(nk), *dv = dalloc(nk);
		double *kb = dalloc(B * Tb * KV * D), *vb = dalloc(B * Tb * KV * D);
		double *dkb = dalloc(B * Tb * KV * D), *dvb = dalloc(B * Tb * KV * D);
		int64_t kpos[16];
		for (int blk = 0; blk < nblk; blk++) {
			key_block(&s, nblk, blk, kb, vb, kpos);
			memset(dkb, 0, (size_t)(B * Tb * KV * D) * 8);
			memset(dvb, 0, (size_t)(B * Tb * KV * D) * 8);
			attention_pos_backward_f64(dq, dkb, dvb, s.g, s.out, s.lse, s.qs, s.qpos, kb, vb,
			                           kpos, B, s.Tq, Tb, H, KV, D);
			for (int64_t b = 0; b < B; b++)
				for (int64_t x = 0; x < Tb * KV * D; x++) {
					dk[(b * T + blk * Tb) * KV * D + x] += dkb[b * Tb * KV * D + x];
					dv[(b * T + blk * Tb) * KV * D + x] += dvb[b * Tb * KV * D + x];
				}
		}
		struct {
			const char *name;
			double *x, *grad;
			int64_t n;
		} wrt[] = {{"dq", s.qs, dq, nq}, {"dk", s.ks, dk, nk}, {"dv", s.vs, dv, nk}};
		double *fd = dalloc(nk > nq ? nk : nq);
		for (int w = 0; w < 3; w++) {
			const double h = 1e-5;
			for (int64_t i = 0; i < wrt[w].n; i++) {
				double x0 = wrt[w].x[i];
				wrt[w].x[i] = x0 + h;
				double lp = sharded_loss(&s, nblk);
				wrt[w].x[i] = x0 - h;
				double lm = sharded_loss(&s, nblk);
				wrt[w].x[i] = x0;
				fd[i] = (lp - lm) / (2 * h);
			}
			double e = rel_err_f64(wrt[w].grad, fd, wrt[w].n);
			EXPECT(e < 1e-7, "rank %d: %s rel err %.3g vs FD", rank, wrt[w].name, e);
		}
		free(fd), free(dq), free(dk), free(dv), free(kb), free(vb), free(dkb), free(dvb);
		sharded_free(&s);
	}
}

TEST_CASE(sharded_backward_matches_tiled_kernel)
{
	const int64_t B = 2, T = 200, H = 4, KV = 2, D = 8;
	const int64_t nq = B * T * H * D, nk = B * T * KV * D;
	for (int cp = 2; cp <= 4; cp += 2) {
		struct sharded s0 = sharded_make(B, T, H, KV, D, cp, 0);
		/* the full problem: forward and backward with dout g (full layout) */
		double *of = dalloc(nq), *lf = dalloc(B * H * T), *gf = dalloc(nq);
		double *dqf = dalloc(nq), *dkf = dalloc(nk), *dvf = dalloc(nk);
		test_fill(gf, nq, -1, 1);
		attention_forward_f64(of, lf, s0.q, s0.k, s0.v, B, T, H, KV, D);
		attention_backward_f64(dqf, dkf, dvf, gf, of, lf, s0.q, s0.k, s0.v, B, T, H, KV, D);
		/* every rank's shard against all keys (held in head-tail order) */
		double *dk = dalloc(nk), *dv = dalloc(nk), eq = 0;
		for (int r = 0; r < cp; r++) {
			const int64_t Tq = T / cp, *qpos = s0.order + r * Tq;
			double *qs = dalloc(B * Tq * H * D), *gs = dalloc(B * Tq * H * D);
			double *os = dalloc(B * Tq * H * D), *ls = dalloc(B * H * Tq);
			double *dq = dalloc(B * Tq * H * D), *dqr = dalloc(B * Tq * H * D);
			take_rows(qs, s0.q, qpos, Tq, B, T, H * D);
			take_rows(gs, gf, qpos, Tq, B, T, H * D);
			take_rows(dqr, dqf, qpos, Tq, B, T, H * D);
			attention_pos_forward_f64(os, ls, qs, qpos, s0.ks, s0.vs, s0.order, B, Tq, T, H,
			                          KV, D);
			attention_pos_backward_f64(dq, dk, dv, gs, os, ls, qs, qpos, s0.ks, s0.vs,
			                           s0.order, B, Tq, T, H, KV, D);
			double e = rel_err_f64(dq, dqr, B * Tq * H * D);
			eq = e > eq ? e : eq;
			free(qs), free(gs), free(os), free(ls), free(dq), free(dqr);
		}
		double *dkr = dalloc(nk), *dvr = dalloc(nk);
		take_rows(dkr, dkf, s0.order, T, B, T, KV * D);
		take_rows(dvr, dvf, s0.order, T, B, T, KV * D);
		double ek = rel_err_f64(dk, dkr, nk), ev = rel_err_f64(dv, dvr, nk);
		EXPECT(eq < 1e-12 && ek < 1e-12 && ev < 1e-12,
		       "cp=%d: dq err %.3g, dk err %.3g, dv err %.3g vs the tiled kernel", cp, eq, ek,
		       ev);
		free(of), free(lf), free(gf), free(dqf), free(dkf), free(dvf), free(dk), free(dv);
		free(dkr), free(dvr);
		sharded_free(&s0);
	}
}

TEST_CASE(f32_matches_f64)
{
	const int64_t B = 2, T = 40, H = 4, KV = 2, D = 8, Tq = 20;
	int64_t qpos[20], kpos[40];
	headtail_positions(kpos, T, 2);
	memcpy(qpos, kpos + Tq, sizeof(qpos)); /* rank 1's shard */
	int64_t nq = B * Tq * H * D, nk = B * T * KV * D, nl = B * H * Tq;
	double *q = dalloc(nq), *k = dalloc(nk), *v = dalloc(nk), *g = dalloc(nq);
	double *o = dalloc(nq), *l = dalloc(nl), *dq = dalloc(nq), *dk = dalloc(nk), *dv = dalloc(nk);
	test_fill(q, nq, -1.5, 1.5), test_fill(k, nk, -1.5, 1.5), test_fill(v, nk, -1, 1);
	test_fill(g, nq, -1, 1);
	attention_pos_forward_f64(o, l, q, qpos, k, v, kpos, B, Tq, T, H, KV, D);
	attention_pos_backward_f64(dq, dk, dv, g, o, l, q, qpos, k, v, kpos, B, Tq, T, H, KV, D);
	float *f[10];
	const double *src[5] = {q, k, v, g, NULL};
	int64_t ns[5] = {nq, nk, nk, nq, 0};
	for (int i = 0; i < 4; i++) {
		f[i] = calloc((size_t)ns[i], sizeof(float));
		for (int64_t j = 0; j < ns[i]; j++)
			f[i][j] = (float)src[i][j];
	}
	f[4] = calloc((size_t)nq, 4), f[5] = calloc((size_t)nl, 4), f[6] = calloc((size_t)nq, 4);
	f[7] = calloc((size_t)nk, 4), f[8] = calloc((size_t)nk, 4);
	attention_pos_forward_f32(f[4], f[5], f[0], qpos, f[1], f[2], kpos, B, Tq, T, H, KV, D);
	attention_pos_backward_f32(f[6], f[7], f[8], f[3], f[4], f[5], f[0], qpos, f[1], f[2], kpos,
	                           B, Tq, T, H, KV, D);
	const double *ref[5] = {o, l, dq, dk, dv};
	int64_t nr[5] = {nq, nl, nq, nk, nk};
	const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
	for (int i = 0; i < 5; i++) {
		double *x = dalloc(nr[i]);
		for (int64_t j = 0; j < nr[i]; j++)
			x[j] = f[4 + i][j];
		double e = rel_err_f64(x, ref[i], nr[i]);
		EXPECT(e < 1e-5, "%s: f32 vs f64 rel err %.3g", names[i], e);
		free(x);
	}
	for (int i = 0; i < 9; i++)
		free(f[i]);
	free(q), free(k), free(v), free(g), free(o), free(l), free(dq), free(dk), free(dv);
}

TEST_CASE(token_orders_and_balance)
{
	int64_t o[8];
	cp_token_order(o, 8, 2, CP_BALANCE_HEADTAIL);
	const int64_t want[8] = {0, 1, 6, 7, 2, 3, 4, 5};
	EXPECT(memcmp(o, want, sizeof(o)) == 0, "head-tail order of 8 on 2 ranks");
	cp_token_order(o, 8, 4, CP_BALANCE_HEADTAIL); /* chunks of one token */
	const int64_t want4[8] = {0, 7, 1, 6, 2, 5, 3, 4};
	EXPECT(memcmp(o, want4, sizeof(o)) == 0, "head-tail order of 8 on 4 ranks");
	for (int b = 0; b < 2; b++)
		for (int cp = 2; cp <= 8; cp *= 2) {
			const int64_t T = 64, Tl = T / cp;
			int64_t order[64], lo = INT64_MAX, hi = 0;
			cp_token_order(order, T, cp, (enum cp_balancer)b);
			for (int r = 0; r < cp; r++) {
				int64_t pairs = 0; /* a query at position p sees p + 1 keys */
				for (int64_t i = 0; i < Tl; i++)
					pairs += order[r * Tl + i] + 1;
				lo = pairs < lo ? pairs : lo;
				hi = pairs > hi ? pairs : hi;
			}
			if (b == CP_BALANCE_HEADTAIL)
				EXPECT(lo == hi, "head-tail cp=%d: causal pairs per rank %lld..%lld", cp,
				       (long long)lo, (long long)hi);
			else
				EXPECT(hi > 2 * lo, "contiguous cp=%d: pairs %lld..%lld", cp,
				       (long long)lo, (long long)hi);
		}
}

int main(void)
{
	test_seed();
	RUN(identity_positions_match_tiled_kernel);
	RUN(headtail_shard_matches_full_causal);
	RUN(merge_order_and_empty_rows);
	RUN(backward_matches_finite_differences);
	RUN(sharded_backward_matches_tiled_kernel);
	RUN(f32_matches_f64);
	RUN(token_orders_and_balance);
	return test_summary();
}
