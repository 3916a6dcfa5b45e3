/* Position-aware causal grouped-query attention: query rows and key rows at arbitrary global
 * positions, the building block of context parallelism (a rank's query shard against the keys
 * of one or all sequence shards, in any order, e.g. head-tail load balancing).
 *
 * Shapes: q(B,Tq,H,D) with positions qpos(Tq), k,v(B,Tk,KV,D) with positions kpos(Tk), the
 * same for every batch row; out(B,Tq,H,D), lse(B,H,Tq). Query i sees key j iff
 * kpos[j] <= qpos[i]. With s_ij = scale q_i.k_j (scale = 1/sqrt(D)):
 *   lse_i = log sum_{j visible} exp(s_ij),  out_i = sum_{j visible} exp(s_ij - lse_i) v_j;
 * a row that sees no key has lse_i = -inf and out_i = 0, so it is neutral in a merge.
 *
 * Partial results over disjoint key sets merge exactly with their statistics
 * (attention_merge): lse = log(e^lse_a + e^lse_b), out = e^(lse_a-lse) out_a + e^(lse_b-lse)
 * out_b, evaluated around the larger lse. The backward takes the FINAL (merged) out and lse,
 * so each key block's contribution to dq, dk, dv is exact on its own and blocks may be
 * processed in any order (ring attention's backward):
 *   p_ij = exp(s_ij - lse_i), D_i = dout_i.out_i, ds_ij = p_ij (dout_i.v_j - D_i),
 *   dv_j += sum_i p_ij dout_i, dq_i += scale sum_j ds_ij k_j, dk_j += scale sum_i ds_ij q_i.
 *
 * Rows one at a time with an online softmax (no tiling: written for exactness and clarity;
 * the one-rank path keeps the tiled kernel of attention.c). The forward threads over
 * (b, h, query row); the backward over (b, kv head), which owns that head's dk/dv rows and its
 * query heads' dq rows, summing in a fixed order: bitwise the same for any thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/kreal.h"

static void pos_check(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	CHECK(B > 0 && Tq > 0 && Tk > 0 && H > 0 && KV > 0 && D > 0 && H % KV == 0 &&
	          D <= ATTN_MAX_HEAD_DIM,
	      "attention_pos: bad shape B=%lld Tq=%lld Tk=%lld H=%lld KV=%lld D=%lld",
	      (long long)B, (long long)Tq, (long long)Tk, (long long)H, (long long)KV,
	      (long long)D);
}

/* a.b in DOT_LANES independent partial sums (a vector register's worth the compiler can keep
 * in lanes, which one running sum would forbid without reassociation), added in a fixed order
 * at the end: deterministic. */
enum { DOT_LANES = 8 };

static inline real dotr(const real *restrict a, const real *restrict b, int64_t D)
{
	real lane[DOT_LANES] = {0};
	int64_t d = 0;
	for (; d + DOT_LANES <= D; d += DOT_LANES)
		for (int l = 0; l < DOT_LANES; l++)
			lane[l] += a[d + l] * b[d + l];
	real s = 0;
	for (int l = 0; l < DOT_LANES; l++)
		s += lane[l];
	for (; d < D; d++)
		s += a[d] * b[d];
	return s;
}

void KFN(attention_pos_forward)(real *out, real *lse, const real *q, const int64_t *qpos,
                                const real *k, const real *v, const int64_t *kpos, int64_t B,
                                int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	pos_check(B, Tq, Tk, H, KV, D);
	const int64_t group = H / KV, nrows = B * H * Tq;
	const real scale = (real)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(dynamic, 16)
	for (int64_t it = 0; it < nrows; it++) {
		const int64_t i = it % Tq, bh = it / Tq, h = bh % H, b = bh / H;
		const real *qi = q + ((b * Tq + i) * H + h) * D;
		real *oi = out + ((b * Tq + i) * H + h) * D;
		real acc[ATTN_MAX_HEAD_DIM];
		real m = -INFINITY, l = 0;
		for (int64_t d = 0; d < D; d++)
			acc[d] = 0;
		for (int64_t j = 0; j < Tk; j++) {
			if (kpos[j] > qpos[i])
				continue;
			const int64_t kvoff = ((b * Tk + j) * KV + h / group) * D;
			real s = scale * dotr(qi, k + kvoff, D);
			if (s > m) { /* rescale what was summed around the old max */
				real corr = KEXP(m - s);
				l *= corr;
				for (int64_t d = 0; d < D; d++)
					acc[d] *= corr;
				m = s;
			}
			real p = KEXP(s - m);
			l += p;
			for (int64_t d = 0; d < D; d++)
				acc[d] += p * v[kvoff + d];
		}
		real *li = lse + bh * Tq + i;
		if (l == 0) {
			*li = -INFINITY;
			for (int64_t d = 0; d < D; d++)
				oi[d] = 0;
		} else {
			*li = m + KLOG(l);
			for (int64_t d = 0; d < D; d++)
				oi[d] = acc[d] / l;
		}
	}
}

void KFN(attention_merge)(real *out, real *lse, const real *out_b, const real *lse_b, int64_t B,
                          int64_t T, int64_t H, int64_t D)
{
#pragma omp parallel for schedule(static)
	for (int64_t it = 0; it < B * H * T; it++) {
		const int64_t i = it % T, bh = it / T, h = bh % H, b = bh / H;
		const real la = lse[it], lb = lse_b[it];
		if (lb == -INFINITY)
			continue;
		real *o = out + ((b * T + i) * H + h) * D;
		const real *ob = out_b + ((b * T + i) * H + h) * D;
		if (la == -INFINITY) {
			memcpy(o, ob, (size_t)D * sizeof(real));
			lse[it] = lb;
			continue;
		}
		const real mx = la > lb ? la : lb;
		const real ea = KEXP(la - mx), eb = KEXP(lb - mx), sum = ea + eb;
		const real wa = ea / sum, wb = eb / sum;
		for (int64_t d = 0; d < D; d++)
			o[d] = wa * o[d] + wb * ob[d];
		lse[it] = mx + KLOG(sum);
	}
}

void KFN(attention_pos_backward)(real *dq, real *dk, real *dv, const real *dout, const real *out,
                                 const real *lse, const real *q, const int64_t *qpos,
                                 const real *k, const real *v, const int64_t *kpos, int64_t B,
                                 int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	pos_check(B, Tq, Tk, H, KV, D);
	const int64_t group = H / KV;
	const real scale = (real)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(dynamic, 1)
	for (int64_t it = 0; it < B * KV; it++) {
		const int64_t b = it / KV, g = it % KV;
		for (int64_t hh = 0; hh < group; hh++) {
			const int64_t h = g * group + hh;
			for (int64_t i = 0; i < Tq; i++) {
				const real li = lse[(b * H + h) * Tq + i];
				if (li == -INFINITY)
					continue;
				const int64_t qoff = ((b * Tq + i) * H + h) * D;
				const real *qi = q + qoff, *doi = dout + qoff;
				real *dqi = dq + qoff;
				const real Di = dotr(doi, out + qoff, D);
				for (int64_t j = 0; j < Tk; j++) {
					if (kpos[j] > qpos[i])
						continue;
					const int64_t kvoff = ((b * Tk + j) * KV + g) * D;
					const real *kj = k + kvoff, *vj = v + kvoff;
					real p = KEXP(scale * dotr(qi, kj, D) - li);
					real ds = p * (dotr(doi, vj, D) - Di) * scale;
					real *dkj = dk + kvoff, *dvj = dv + kvoff;
					for (int64_t d = 0; d < D; d++) {
						dvj[d] += p * doi[d];
						dqi[d] += ds * kj[d];
						dkj[d] += ds * qi[d];
					}
				}
			}
		}
	}
}
