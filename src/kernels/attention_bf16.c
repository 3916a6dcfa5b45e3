/* kernels/attention_bf16: see attention_bf16.h.
 *
 * One micro-kernel does every product: c[r][n] (+)= sum_p A[r][p] . B[p][n] on vdpbf16ps,
 * where A[r][p] is the pair (a(r,2p), a(r,2p+1)) of bf16 values in one 32-bit word (element
 * 2p in the low half: a row of bf16 values read as words) and B[p][n] the pair (b(2p,n),
 * b(2p+1,n)); one instruction adds 2 products in each of 16 fp32 lanes. Operands are packed to
 * those layouts once: the forward packs every key tile (scaled k, pairs along the head dim)
 * and value tile (pairs along the key index) per call and each query tile per work item; the
 * backward packs, per (b, kv head), its query heads' q and dout as rows and as pairs along the
 * query index, and each key tile's k and v; per tile pair the softmax writes p and ds straight
 * into the layouts their products read.
 *
 * With s_ij = q_i . (scale k_j), p_ij = exp(s_ij - lse_i), D_i = dout_i . out_i (fp32) and
 * ds_ij = p_ij (dp_ij - D_i), dp_ij = dout_i . v_j:
 *   forward:  s = q (scale k)^T per key tile, online softmax in fp32 (running max m and sum l
 *             per query row, the sum of the fp32 p), o = o corr + p v;
 *   backward: dv_j += sum_i p_ij dout_i (as dv^T = dout^T p), dk_j += scale sum_i ds_ij q_i
 *             (as dk^T = q^T ds, scaled when added), dq_i += sum_j ds_ij (scale k_j).
 * Which (query, key) pairs exist follows positions, as attention_pos.c: a tile pair is skipped
 * when no query of it sees a key of it and masked element by element when some do not; the
 * plain causal entries run the same code at positions 0..T-1.
 *
 * Threads: the forward splits (b, h, query tile) and the backward (b, kv head), as the fp32
 * kernels; every output element is summed in a fixed order, so any thread count gives the same
 * bits.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "base/cpu.h"
#include "base/log.h"
#include "kernels/attention_bf16.h"
#include "kernels/attn_span.h"
#include "kernels/kreal.h"
#include "kernels/mm_engine.h"

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

typedef uint32_t pair; /* two bf16: the even-indexed element in the low half */

enum { TL = 64, TPAIRS = TL / 2 }; /* tile rows and columns; pairs along a tile */

static inline pair pk(float lo, float hi)
{
	return (pair)bf16_from_f32(lo) | (pair)bf16_from_f32(hi) << 16;
}

static inline int64_t mn(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

bool attention_bf16_usable(int64_t D)
{
	const struct cpu_info *c = cpu_info();
	const char *e = getenv("CT_ATTENTION");
	if (e && strcmp(e, "f32") == 0)
		return false;
	return c->avx512 && c->avx512_bf16 && D > 0 && D % 16 == 0;
}

/* ---- micro-kernel ------------------------------------------------------------------------ */

/* A rows x nv register tile (16 fp32 lanes per vector) of c, over P pairs of k. */
static inline __attribute__((always_inline)) BF16_TARGET void
dp_block(float *restrict c, int64_t c_rs, const pair *restrict a, int64_t a_rs,
         const pair *restrict b, int64_t b_rs, int64_t P, bool load, const int rows, const int nv)
{
	__m512 acc[16];
	for (int r = 0; r < rows; r++)
		for (int v = 0; v < nv; v++)
			acc[r * nv + v] =
			    load ? _mm512_loadu_ps(c + r * c_rs + 16 * v) : _mm512_setzero_ps();
	for (int64_t p = 0; p < P; p++) {
		__m512i bv[4];
		for (int v = 0; v < nv; v++)
			bv[v] = _mm512_loadu_si512(b + p * b_rs + 16 * v);
		for (int r = 0; r < rows; r++) {
			const __m512i ar = _mm512_set1_epi32((int)a[r * a_rs + p]);
			for (int v = 0; v < nv; v++)
				acc[r * nv + v] = _mm512_dpbf16_ps(acc[r * nv + v], (__m512bh)ar,
				                                   (__m512bh)bv[v]);
		}
	}
	for (int r = 0; r < rows; r++)
		for (int v = 0; v < nv; v++)
			_mm512_storeu_ps(c + r * c_rs + 16 * v, acc[r * nv + v]);
}

static inline __attribute__((always_inline)) BF16_TARGET void
dp_tiles(float *c, int64_t c_rs, const pair *a, int64_t a_rs, const pair *b, int64_t b_rs,
         int64_t R, int64_t P, int64_t N, bool load, const int rows, const int nv)
{
	int64_t r0 = 0;
	for (; r0 + rows <= R; r0 += rows)
		for (int64_t n0 = 0; n0 < N; n0 += 16 * nv)
			dp_block(c + r0 * c_rs + n0, c_rs, a + r0 * a_rs, a_rs, b + n0, b_rs, P, load,
			         rows, nv);
	for (; r0 < R; r0++)
		for (int64_t n0 = 0; n0 < N; n0 += 16 * nv)
			dp_block(c + r0 * c_rs + n0, c_rs, a + r0 * a_rs, a_rs, b + n0, b_rs, P, load, 1,
			         nv);
}

/* c[r][0:N] (+)= sum_{p<P} A[r][p] . B[p][0:N] for r < R; N a multiple of 16. c is fp32 with
 * rows c_rs floats apart; A rows a_rs pairs apart; B rows b_rs pairs apart. The sum over p
 * runs in increasing p from a zero or loaded accumulator: deterministic. */
static BF16_TARGET void dp_mm(float *c, int64_t c_rs, const pair *a, int64_t a_rs, const pair *b,
                              int64_t b_rs, int64_t R, int64_t P, int64_t N, bool load)
{
	if (N % 64 == 0)
		dp_tiles(c, c_rs, a, a_rs, b, b_rs, R, P, N, load, 4, 4);
	else if (N % 32 == 0)
		dp_tiles(c, c_rs, a, a_rs, b, b_rs, R, P, N, load, 8, 2);
	else
		dp_tiles(c, c_rs, a, a_rs, b, b_rs, R, P, N, load, 16, 1);
}

/* ---- packing ----------------------------------------------------------------------------- */

/* dst[r][p] = (x_r[2p], x_r[2p+1]) for r < n (row r of x at x + r*x_rs), D/2 pairs a row;
 * rows n..rows-1 zero: token rows as the A operand of a product over the head dim. A row of
 * pairs is the row's D bf16 values in order (x86 is little-endian: the even one in the low
 * half), written as such so that the loop vectorises. */
typedef uint16_t bf16_alias __attribute__((may_alias));
static void pack_rows(pair *dst, const float *x, int64_t x_rs, int64_t n, int64_t rows,
                      int64_t D, float alpha)
{
	const int64_t P = D / 2;
	for (int64_t r = 0; r < n; r++) {
		bf16_alias *h = (bf16_alias *)(dst + r * P);
		const float *xr = x + r * x_rs;
		for (int64_t c = 0; c < D; c++)
			h[c] = bf16_from_f32(alpha * xr[c]);
	}
	memset(dst + n * P, 0, (size_t)((rows - n) * P) * sizeof(pair));
}

/* dst[p][j] = (x_j[2p], x_j[2p+1]) for j < n, zero for n <= j < TL: a tile of token rows as
 * the B operand of a product over the head dim (D/2 rows of TL pairs). */
static void pack_t(pair *dst, const float *x, int64_t x_rs, int64_t n, int64_t D, float alpha)
{
	for (int64_t p = 0; p < D / 2; p++) {
		for (int64_t j = 0; j < n; j++)
			dst[p * TL + j] = pk(alpha * x[j * x_rs + 2 * p], alpha * x[j * x_rs + 2 * p + 1]);
		for (int64_t j = n; j < TL; j++)
			dst[p * TL + j] = 0;
	}
}

/* dst[p][d] = (x_2p[d], x_2p+1[d]) for 2p < n, zero past n (rows to TL): token rows as the B
 * operand of a product over the token index (TPAIRS rows of D pairs). */
static void pack_pairs(pair *dst, const float *x, int64_t x_rs, int64_t n, int64_t D,
                       float alpha)
{
	for (int64_t p = 0; p < TPAIRS; p++)
		for (int64_t d = 0; d < D; d++) {
			float lo = 2 * p < n ? alpha * x[2 * p * x_rs + d] : 0;
			float hi = 2 * p + 1 < n ? alpha * x[(2 * p + 1) * x_rs + d] : 0;
			dst[p * D + d] = pk(lo, hi);
		}
}

/* dst[d][p] = (x_2p[d], x_2p+1[d]) for 2p < n, zero past n, rows of n_pairs pairs: token rows
 * transposed, as the A operand (rows d) of a product over the token index. The pairs of one p
 * are built along d (contiguous reads: the loop vectorises), then stored down column p. */
static void pack_cols(pair *dst, const float *x, int64_t x_rs, int64_t n, int64_t n_pairs,
                      int64_t D)
{
	pair col[ATTN_MAX_HEAD_DIM];
	for (int64_t p = 0; p < n_pairs; p++) {
		const float *lo = x + 2 * p * x_rs, *hi = lo + x_rs;
		if (2 * p + 1 < n)
			for (int64_t d = 0; d < D; d++)
				col[d] = pk(lo[d], hi[d]);
		else if (2 * p < n)
			for (int64_t d = 0; d < D; d++)
				col[d] = pk(lo[d], 0);
		else
			for (int64_t d = 0; d < D; d++)
				col[d] = 0;
		for (int64_t d = 0; d < D; d++)
			dst[d * n_pairs + p] = col[d];
	}
}

/* A fp32 TL x TL tile t[i][j] as the A operand over j (rows of TPAIRS pairs) ... */
static BF16_TARGET void tile_rows_bf16(pair *dst, const float *t)
{
	for (int64_t i = 0; i < TL; i++)
		for (int64_t h = 0; h < TL; h += 32) {
			__m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(t + i * TL + h + 16),
			                                 _mm512_loadu_ps(t + i * TL + h));
			_mm512_storeu_si512(dst + i * TPAIRS + h / 2, (__m512i)r);
		}
}

/* ... and as the B operand over i (TPAIRS rows of TL pairs): dst[p][j] = (t[2p][j], t[2p+1][j]). */
static BF16_TARGET void tile_pairs_bf16(pair *dst, const float *t)
{
	/* cvtne2ps(b, a) holds a's 16 values then b's; this index interleaves them pairwise */
	const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
	                                     9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
	                                     17, 1, 16, 0);
	for (int64_t p = 0; p < TPAIRS; p++)
		for (int64_t j = 0; j < TL; j += 16) {
			__m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(t + (2 * p + 1) * TL + j),
			                                   _mm512_loadu_ps(t + 2 * p * TL + j));
			_mm512_storeu_si512(dst + p * TL + j,
			                    _mm512_permutexvar_epi16(ilv, (__m512i)two));
		}
}

/* ---- positions --------------------------------------------------------------------------- */

/* kp[j] = kpos[j] for j < nk, past the tile's keys a position no query reaches */
static void key_positions(int64_t *kp, const int64_t *kpos, int64_t nk)
{
	for (int64_t j = 0; j < TL; j++)
		kp[j] = j < nk ? kpos[j] : INT64_MAX;
}

/* max and sum of a tile row, in a fixed order (vectors, then across lanes) */
static BF16_TARGET float row_max(const float *x)
{
	__m512 a = _mm512_max_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
	__m512 b = _mm512_max_ps(_mm512_loadu_ps(x + 32), _mm512_loadu_ps(x + 48));
	return _mm512_reduce_max_ps(_mm512_max_ps(a, b));
}

/* 2^t in 16 lanes: 2^n 2^f with n = round(t), f in [-1/2, 1/2], 2^f a degree-5 polynomial
 * fitted for relative error (2.3e-7 with fp32 Horner, kexpf's 2e-7) and 2^n applied by
 * vscalefps, which gives subnormals and exact underflow to 0 (t is clamped at -160, so -inf
 * lanes give 0; a NaN stays NaN). About half kexpf's instructions: no clamp at the top, no
 * exponent built in integer lanes, no blend. The softmax tiles call it with
 * t = (s - m) log2(e) by one fused multiply-subtract; the error of that rounding, 6e-8 |t|
 * relative, and the polynomial's sit four orders below bf16's rounding of p (2^-9). */
static inline __attribute__((always_inline)) BF16_TARGET __m512 exp2_16(__m512 t)
{
	t = _mm512_max_ps(_mm512_set1_ps(-160.0f), t);
	const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	const __m512 f = _mm512_sub_ps(t, n);
	__m512 p = _mm512_set1_ps(0.0013276455f);
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00967554003f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0555071346f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240221202f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.693146944f));
	p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.00000012f));
	return _mm512_scalef_ps(p, n);
}

#define LOG2E 1.44269504088896341f

/* x[j] = exp(x[j] - m) over a tile row; returns the row's sum in row_max's fixed order */
static inline __attribute__((always_inline)) BF16_TARGET float row_exp_sum(float *x, float m)
{
	const __m512 l2e = _mm512_set1_ps(LOG2E), ml = _mm512_set1_ps(m * LOG2E);
	__m512 e[4];
	for (int v = 0; v < 4; v++) {
		e[v] = exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(x + 16 * v), l2e, ml));
		_mm512_storeu_ps(x + 16 * v, e[v]);
	}
	return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]),
	                                          _mm512_add_ps(e[2], e[3])));
}

/* corr[i] = exp(m[i] - mx[i]) for the TL rows of a tile, as row_exp_sum rounds (m = -inf
 * gives 0; rows whose mx is -inf are not used) */
static inline __attribute__((always_inline)) BF16_TARGET void
tile_corr(float *corr, const float *m, const float *mx)
{
	const __m512 l2e = _mm512_set1_ps(LOG2E);
	for (int v = 0; v < TL / 16; v++)
		_mm512_storeu_ps(corr + 16 * v,
		                 exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(m + 16 * v), l2e,
		                                         _mm512_mul_ps(_mm512_loadu_ps(mx + 16 * v), l2e))));
}

BF16_TARGET float attention_bf16_row_exp(float *x, float m)
{
	return row_exp_sum(x, m);
}

/* The backward's tile row: p[j] = exp(s[j] - lse) where key j is seen (kp[j] <= qp, or every
 * key when !masked), else 0; ds[j] = p[j] (dp[j] - dsum). */
static inline __attribute__((always_inline)) BF16_TARGET void
row_p_ds(float *p, float *ds, float lse, float dsum, const int64_t *kp, int64_t qp, bool masked)
{
	const __m512 l2e = _mm512_set1_ps(LOG2E), ll = _mm512_set1_ps(lse * LOG2E);
	const __m512 di = _mm512_set1_ps(dsum);
	const __m512i q8 = _mm512_set1_epi64(qp);
	for (int v = 0; v < 4; v++) {
		__m512 e = exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(p + 16 * v), l2e, ll));
		if (masked) {
			const __mmask16 hide =
			    (__mmask16)(_mm512_cmpgt_epi64_mask(_mm512_loadu_si512(kp + 16 * v), q8) |
			                _mm512_cmpgt_epi64_mask(_mm512_loadu_si512(kp + 16 * v + 8), q8)
			                    << 8);
			e = _mm512_maskz_mov_ps((__mmask16)~hide, e);
		}
		_mm512_storeu_ps(p + 16 * v, e);
		_mm512_storeu_ps(ds + 16 * v,
		                 _mm512_mul_ps(e, _mm512_sub_ps(_mm512_loadu_ps(ds + 16 * v), di)));
	}
}

/* ---- forward ----------------------------------------------------------------------------- */

struct fwd_args {
	float *out, *lse;
	const float *q, *k, *v;
	const int64_t *qpos, *kpos;
	int64_t B, Tq, Tk, H, KV, D, group, nqt, nkt;
	float scale;
	pair *kt_all, *v_all; /* per (b, kv head, key tile): D/2 x TL and TPAIRS x D pairs */
};

static BF16_TARGET __attribute__((noinline)) void fwd_pack(const struct fwd_args *f, int64_t it)
{
	const int64_t kt = it % f->nkt, bg = it / f->nkt, b = bg / f->KV, g = bg % f->KV;
	const int64_t k0 = kt * TL, nk = mn(TL, f->Tk - k0), kv_rs = f->KV * f->D;
	const int64_t off = ((b * f->Tk + k0) * f->KV + g) * f->D;
	pack_t(f->kt_all + it * TL * f->D / 2, f->k + off, kv_rs, nk, f->D, f->scale);
	pack_pairs(f->v_all + it * TPAIRS * f->D, f->v + off, kv_rs, nk, f->D, 1);
}

struct fwd_scratch {
	pair *qa, *pa;
	float *s, *o, *m, *l;
};

static BF16_TARGET __attribute__((noinline)) void
fwd_tile(const struct fwd_args *f, const struct fwd_scratch *w, int64_t b, int64_t h,
         int64_t qt)
{
	const int64_t D = f->D, q0 = qt * TL, nq = mn(TL, f->Tq - q0), q_rs = f->H * D;
	const int64_t qoff = ((b * f->Tq + q0) * f->H + h) * D, g = h / f->group;
	const struct pos_span qs = pos_span_of(f->qpos + q0, nq);
	float *s = w->s, *o = w->o, *m = w->m, *l = w->l;

	pack_rows(w->qa, f->q + qoff, q_rs, nq, nq, D, 1);
	memset(o, 0, (size_t)(TL * D) * sizeof(float));
	for (int64_t i = 0; i < TL; i++)
		m[i] = -INFINITY, l[i] = 0;
	for (int64_t kt = 0; kt < f->nkt; kt++) {
		const int64_t k0 = kt * TL, nk = mn(TL, f->Tk - k0);
		const struct pos_span ks = pos_span_of(f->kpos + k0, nk);
		if (ks.lo > qs.hi)
			continue;
		const int64_t tile = (b * f->KV + g) * f->nkt + kt;
		dp_mm(s, TL, w->qa, D / 2, f->kt_all + tile * TL * D / 2, TL, nq, D / 2, TL, false);
		const bool masked = ks.hi > qs.lo || nk < TL;
		int64_t kp[TL];
		key_positions(kp, f->kpos + k0, nk);
		/* the rows' new maxima, then their correction factors exp(m - mx) in vectors */
		float mx[TL], corr[TL];
		for (int64_t i = 0; i < nq; i++) {
			float *si = s + i * TL;
			if (masked) {
				const int64_t qp = f->qpos[q0 + i];
				for (int64_t j = 0; j < TL; j++)
					si[j] = kp[j] > qp ? -INFINITY : si[j];
			}
			mx[i] = fmaxf(m[i], row_max(si));
		}
		for (int64_t i = nq; i < TL; i++)
			mx[i] = 0;
		tile_corr(corr, m, mx);
		for (int64_t i = 0; i < nq; i++) {
			float *si = s + i * TL;
			if (mx[i] == -INFINITY) { /* no key seen yet: p 0, the row stays 0 */
				memset(si, 0, TL * sizeof(float));
				continue;
			}
			l[i] = l[i] * corr[i] + row_exp_sum(si, mx[i]);
			m[i] = mx[i];
			for (int64_t d = 0; d < D; d++)
				o[i * D + d] *= corr[i];
		}
		for (int64_t i = nq; i < TL; i++)
			memset(s + i * TL, 0, TL * sizeof(float));
		tile_rows_bf16(w->pa, s);
		dp_mm(o, D, w->pa, TPAIRS, f->v_all + tile * TPAIRS * D, D, nq, (nk + 1) / 2, D, true);
	}
	float *ob = f->out + qoff, *lb = f->lse + (b * f->H + h) * f->Tq + q0;
	for (int64_t i = 0; i < nq; i++) {
		lb[i] = l[i] > 0 ? m[i] + logf(l[i]) : -INFINITY;
		const float inv = l[i] > 0 ? 1 / l[i] : 0;
		for (int64_t d = 0; d < D; d++)
			ob[i * q_rs + d] = o[i * D + d] * inv;
	}
}

static void fwd_run(struct fwd_args *f)
{
	f->group = f->H / f->KV;
	f->nqt = (f->Tq + TL - 1) / TL;
	f->nkt = (f->Tk + TL - 1) / TL;
	f->scale = (float)(1.0 / sqrt((double)f->D));
	const int64_t npack = f->B * f->KV * f->nkt, tile_pairs = TL * f->D / 2;
	f->kt_all = aligned_alloc(64, (size_t)(2 * npack * tile_pairs) * sizeof(pair));
	CHECK(f->kt_all, "attention (bf16): out of memory for %lld key/value tiles",
	      (long long)npack);
	f->v_all = f->kt_all + npack * tile_pairs;
	const int64_t nbh = f->B * f->H, nitems = nbh * f->nqt, D = f->D;
#pragma omp parallel
	{
#pragma omp for schedule(static)
		for (int64_t it = 0; it < npack; it++)
			fwd_pack(f, it);
		const size_t bytes = (size_t)(TL * D / 2 + TL * TPAIRS) * sizeof(pair) +
		                     (size_t)(TL * TL + TL * D + 2 * TL) * sizeof(float);
		char *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
		CHECK(mem, "attention (bf16): out of memory for %zu bytes of scratch", bytes);
		struct fwd_scratch w;
		w.qa = (pair *)mem;
		w.pa = w.qa + TL * D / 2;
		w.s = (float *)(w.pa + TL * TPAIRS);
		w.o = w.s + TL * TL;
		w.m = w.o + TL * D;
		w.l = w.m + TL;
		/* items cost up to their query tile's key tiles: the late tiles first */
#pragma omp for schedule(dynamic, 1)
		for (int64_t it = 0; it < nitems; it++) {
			const int64_t qt = f->nqt - 1 - it / nbh, bh = it % nbh;
			fwd_tile(f, &w, bh / f->H, bh % f->H, qt);
		}
		free(mem);
	}
	free(f->kt_all);
}

static int64_t *iota(int64_t T)
{
	int64_t *p = malloc((size_t)T * sizeof(int64_t));
	CHECK(p, "attention (bf16): out of memory for %lld positions", (long long)T);
	for (int64_t t = 0; t < T; t++)
		p[t] = t;
	return p;
}

/* The entries' shape contract (and the CPU's: callers check usable first). */
static void check_shape(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	CHECK(D <= ATTN_MAX_HEAD_DIM, "attention (bf16): head dim %lld > ATTN_MAX_HEAD_DIM=%d",
	      (long long)D, ATTN_MAX_HEAD_DIM); /* pack_cols' column buffer */
	CHECK(B > 0 && Tq > 0 && Tk > 0 && KV > 0 && H % KV == 0 && attention_bf16_usable(D),
	      "attention (bf16): bad shape B=%lld Tq=%lld Tk=%lld H=%lld KV=%lld D=%lld, or no "
	      "AVX512-BF16",
	      (long long)B, (long long)Tq, (long long)Tk, (long long)H, (long long)KV,
	      (long long)D);
}

void attention_bf16_pos_forward(float *out, float *lse, const float *q, const int64_t *qpos,
                                const float *k, const float *v, const int64_t *kpos, int64_t B,
                                int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	check_shape(B, Tq, Tk, H, KV, D);
	struct fwd_args f = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .qpos = qpos,
	                     .kpos = kpos, .B = B, .Tq = Tq, .Tk = Tk, .H = H, .KV = KV, .D = D};
	fwd_run(&f);
}

void attention_bf16_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t D)
{
	int64_t *pos = iota(T);
	attention_bf16_pos_forward(out, lse, q, pos, k, v, pos, B, T, T, H, KV, D);
	free(pos);
}

/* ---- backward ---------------------------------------------------------------------------- */

struct bwd_args {
	float *dq, *dk, *dv;
	const float *dout, *out, *lse, *q, *k, *v;
	const int64_t *qpos, *kpos;
	int64_t B, Tq, Tk, H, KV, D, group, nqt, nkt, Tp; /* Tp: Tq padded to whole tiles */
	float scale;
	float *dsum; /* (B, H, Tq): D_t = dout_t . out_t (attention_row_dots_f32) */
};

struct bwd_scratch {
	pair *qa, *da, *qc, *dc; /* per query head of the group: rows (Tp x D/2), cols (D x Tp/2) */
	pair *kt, *vt, *k2;      /* the key tile: D/2 x TL, D/2 x TL, TPAIRS x D */
	pair *p2, *s2, *sa;      /* p and ds over i (TPAIRS x TL), ds over j (TL x TPAIRS) */
	float *p, *ds, *dkt, *dvt; /* TL x TL, TL x TL, D x TL, D x TL */
};

static BF16_TARGET __attribute__((noinline)) void bwd_item(const struct bwd_args *f,
                                                          const struct bwd_scratch *w,
                                                          int64_t b, int64_t g)
{
	const int64_t D = f->D, P = D / 2, Tp = f->Tp, q_rs = f->H * D, kv_rs = f->KV * D;
	for (int64_t hh = 0; hh < f->group; hh++) {
		const int64_t h = g * f->group + hh, off = (b * f->Tq * f->H + h) * D;
		pack_rows(w->qa + hh * Tp * P, f->q + off, q_rs, f->Tq, Tp, D, 1);
		pack_rows(w->da + hh * Tp * P, f->dout + off, q_rs, f->Tq, Tp, D, 1);
		pack_cols(w->qc + hh * D * (Tp / 2), f->q + off, q_rs, f->Tq, Tp / 2, D);
		pack_cols(w->dc + hh * D * (Tp / 2), f->dout + off, q_rs, f->Tq, Tp / 2, D);
	}
	for (int64_t kt = 0; kt < f->nkt; kt++) {
		const int64_t k0 = kt * TL, nk = mn(TL, f->Tk - k0);
		const int64_t koff = ((b * f->Tk + k0) * f->KV + g) * D;
		const struct pos_span ks = pos_span_of(f->kpos + k0, nk);
		int64_t kp[TL];
		key_positions(kp, f->kpos + k0, nk);
		pack_t(w->kt, f->k + koff, kv_rs, nk, D, f->scale);
		pack_t(w->vt, f->v + koff, kv_rs, nk, D, 1);
		pack_pairs(w->k2, f->k + koff, kv_rs, nk, D, f->scale);
		memset(w->dkt, 0, (size_t)(D * TL) * sizeof(float));
		memset(w->dvt, 0, (size_t)(D * TL) * sizeof(float));
		for (int64_t hh = 0; hh < f->group; hh++)
			for (int64_t qt = 0; qt < f->nqt; qt++) {
				const int64_t q0 = qt * TL, nq = mn(TL, f->Tq - q0);
				const struct pos_span qs = pos_span_of(f->qpos + q0, nq);
				if (ks.lo > qs.hi)
					continue;
				const bool masked = ks.hi > qs.lo || nk < TL;
				const int64_t h = g * f->group + hh;
				const float *lse = f->lse + (b * f->H + h) * f->Tq + q0;
				const float *dsum = f->dsum + (b * f->H + h) * f->Tq + q0;
				float *p = w->p, *ds = w->ds;
				/* p = exp(q (scale k)^T - lse), zero where a key is not seen or absent */
				dp_mm(p, TL, w->qa + (hh * Tp + q0) * P, P, w->kt, TL, nq, P, TL, false);
				dp_mm(ds, TL, w->da + (hh * Tp + q0) * P, P, w->vt, TL, nq, P, TL, false);
				for (int64_t i = 0; i < nq; i++) {
					float *pi = p + i * TL, *dsi = ds + i * TL;
					const int64_t qp = f->qpos[q0 + i];
					const float li = lse[i], di = dsum[i];
					if (li == -INFINITY) { /* the query sees no key at all */
						memset(pi, 0, TL * sizeof(float));
						memset(dsi, 0, TL * sizeof(float));
					} else
						row_p_ds(pi, dsi, li, di, kp, qp, masked);
				}
				for (int64_t i = nq; i < TL; i++) {
					memset(p + i * TL, 0, TL * sizeof(float));
					memset(ds + i * TL, 0, TL * sizeof(float));
				}
				tile_pairs_bf16(w->p2, p);
				tile_pairs_bf16(w->s2, ds);
				tile_rows_bf16(w->sa, ds);
				const int64_t npair = (nq + 1) / 2, cs = Tp / 2;
				/* dv^T += dout^T p,  dk^T += q^T ds  (over the query pairs of this tile) */
				dp_mm(w->dvt, TL, w->dc + hh * D * cs + q0 / 2, cs, w->p2, TL, D, npair, TL,
				      true);
				dp_mm(w->dkt, TL, w->qc + hh * D * cs + q0 / 2, cs, w->s2, TL, D, npair, TL,
				      true);
				/* dq_i += sum_j ds_ij (scale k_j) */
				dp_mm(f->dq + ((b * f->Tq + q0) * f->H + h) * D, q_rs, w->sa, TPAIRS, w->k2,
				      D, nq, (nk + 1) / 2, D, true);
			}
		/* key j's column of the transposed accumulators into its rows of dk and dv: the
		 * column copied out first (strided), then added along the row (vectorised) */
		float *dkj = f->dk + koff, *dvj = f->dv + koff;
		const float sc = f->scale;
		float ck[ATTN_MAX_HEAD_DIM], cv[ATTN_MAX_HEAD_DIM];
		for (int64_t j = 0; j < nk; j++) {
			for (int64_t d = 0; d < D; d++) {
				ck[d] = w->dkt[d * TL + j];
				cv[d] = w->dvt[d * TL + j];
			}
			float *restrict rk = dkj + j * kv_rs, *restrict rv = dvj + j * kv_rs;
			for (int64_t d = 0; d < D; d++) {
				rk[d] += sc * ck[d];
				rv[d] += cv[d];
			}
		}
	}
}

void attention_bf16_pos_backward(float *dq, float *dk, float *dv, const float *dout,
                                 const float *out, const float *lse, const float *q,
                                 const int64_t *qpos, const float *k, const float *v,
                                 const int64_t *kpos, int64_t B, int64_t Tq, int64_t Tk,
                                 int64_t H, int64_t KV, int64_t D)
{
	check_shape(B, Tq, Tk, H, KV, D);
	struct bwd_args f = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .out = out, .lse = lse,
	                     .q = q, .k = k, .v = v, .qpos = qpos, .kpos = kpos, .B = B, .Tq = Tq,
	                     .Tk = Tk, .H = H, .KV = KV, .D = D};
	f.group = H / KV;
	f.nqt = (Tq + TL - 1) / TL;
	f.nkt = (Tk + TL - 1) / TL;
	f.Tp = f.nqt * TL;
	f.scale = (float)(1.0 / sqrt((double)D));
	const int64_t P = D / 2, G = f.group, Tp = f.Tp;
	f.dsum = malloc((size_t)(B * H * Tq) * sizeof(float));
	CHECK(f.dsum, "attention (bf16): out of memory for %lld row statistics",
	      (long long)(B * H * Tq));
#pragma omp parallel
	{
		const size_t pairs = (size_t)(4 * G * Tp * P + 2 * P * TL + TPAIRS * D + 3 * TL * TPAIRS);
		const size_t floats = (size_t)(2 * TL * TL + 2 * D * TL);
		const size_t bytes = pairs * sizeof(pair) + floats * sizeof(float);
		char *mem = aligned_alloc(64, (bytes + 63) / 64 * 64);
		CHECK(mem, "attention (bf16): out of memory for %zu bytes of scratch", bytes);
		struct bwd_scratch w;
		w.qa = (pair *)mem;
		w.da = w.qa + G * Tp * P;
		w.qc = w.da + G * Tp * P;
		w.dc = w.qc + G * Tp * P;
		w.kt = w.dc + G * Tp * P;
		w.vt = w.kt + P * TL;
		w.k2 = w.vt + P * TL;
		w.p2 = w.k2 + TPAIRS * D;
		w.s2 = w.p2 + TL * TPAIRS;
		w.sa = w.s2 + TL * TPAIRS;
		w.p = (float *)(w.sa + TL * TPAIRS);
		w.ds = w.p + TL * TL;
		w.dkt = w.ds + TL * TL;
		w.dvt = w.dkt + D * TL;
		attention_row_dots_f32(f.dsum, dout, out, B, Tq, H, D); /* ends in a barrier */
#pragma omp for schedule(dynamic, 1)
		for (int64_t it = 0; it < B * KV; it++)
			bwd_item(&f, &w, it / KV, it % KV);
		free(mem);
	}
	free(f.dsum);
}

void attention_bf16_backward(float *dq, float *dk, float *dv, const float *dout,
                             const float *out, const float *lse, const float *q, const float *k,
                             const float *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D)
{
	int64_t *pos = iota(T);
	attention_bf16_pos_backward(dq, dk, dv, dout, out, lse, q, pos, k, v, pos, B, T, T, H, KV,
	                            D);
	free(pos);
}

/* ---- what the model calls ---------------------------------------------------------------- */

/* Below this head dim the fp32 kernel was as fast: measured with test_attention --bench on one
 * thread (AMD EPYC, AVX512-BF16), bf16 over fp32 forward / backward: D = 64 1.37x / 1.37x,
 * D = 32 1.13x / 1.37x, D = 16 0.85x / 1.0x at first (the 64 x 64 softmax tile outweighs
 * products over 16 values), 1.0x / 1.2x with the vectorised row packing, and since the tiles'
 * exponential runs on vscalefps (exp2_16, 2026-12-07, Zen 4 EPYC) 1.3x / 1.5x: the debug
 * model (head dim 16) takes the bf16 kernel too. */
enum { ATTN_BF16_MIN_D = 16 };

bool attention_mixed_is_bf16(int64_t D)
{
	return mm_engine_dtype() == MM_BF16 && D >= ATTN_BF16_MIN_D && attention_bf16_usable(D);
}

const char *attention_mixed_name(int64_t D)
{
	return attention_mixed_is_bf16(D) ? "bf16 (AVX512-BF16)" : "fp32";
}

/* What the mixed entries ran last (compute thread only), for attention_mixed_log_summary. */
static int64_t g_ran_D = -1;
static bool g_ran_bf16;

static bool ran(int64_t D)
{
	g_ran_D = D;
	g_ran_bf16 = attention_mixed_is_bf16(D);
	return g_ran_bf16;
}

void attention_mixed_log_summary(void)
{
	if (g_ran_D > 0)
		LOG_INFO("attention kernel %s at head dim %lld", g_ran_bf16 ? "bf16 (AVX512-BF16)" : "fp32",
		         (long long)g_ran_D);
}

void attention_mixed_forward(float *out, float *lse, const float *q, const float *k,
                             const float *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D)
{
	if (ran(D))
		attention_bf16_forward(out, lse, q, k, v, B, T, H, KV, D);
	else
		attention_forward_f32(out, lse, q, k, v, B, T, H, KV, D);
}

void attention_mixed_backward(float *dq, float *dk, float *dv, const float *dout,
                              const float *out, const float *lse, const float *q,
                              const float *k, const float *v, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D)
{
	if (attention_mixed_is_bf16(D))
		attention_bf16_backward(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D);
	else
		attention_backward_f32(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, D);
}

void attention_mixed_pos_forward(float *out, float *lse, const float *q, const int64_t *qpos,
                                 const float *k, const float *v, const int64_t *kpos,
                                 int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                                 int64_t D)
{
	if (ran(D))
		attention_bf16_pos_forward(out, lse, q, qpos, k, v, kpos, B, Tq, Tk, H, KV, D);
	else
		attention_pos_forward_f32(out, lse, q, qpos, k, v, kpos, B, Tq, Tk, H, KV, D);
}

void attention_mixed_pos_backward(float *dq, float *dk, float *dv, const float *dout,
                                  const float *out, const float *lse, const float *q,
                                  const int64_t *qpos, const float *k, const float *v,
                                  const int64_t *kpos, int64_t B, int64_t Tq, int64_t Tk,
                                  int64_t H, int64_t KV, int64_t D)
{
	if (attention_mixed_is_bf16(D))
		attention_bf16_pos_backward(dq, dk, dv, dout, out, lse, q, qpos, k, v, kpos, B, Tq,
		                            Tk, H, KV, D);
	else
		attention_pos_backward_f32(dq, dk, dv, dout, out, lse, q, qpos, k, v, kpos, B, Tq,
		                           Tk, H, KV, D);
}
