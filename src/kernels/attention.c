/* Causal grouped-query attention, FlashAttention-2 style (Dao 2023), forward and backward.
 *
 * Shapes: q(B,T,H,D), k,v(B,T,KV,D), out(B,T,H,D), lse(B,H,T); query head h reads kv head
 * h / (H/KV). With s_ij = scale * q_i.k_j (scale = 1/sqrt(D)) and j <= i (causal):
 *   out_i = sum_j p_ij v_j,   p_ij = exp(s_ij - lse_i),   lse_i = log sum_{j<=i} exp(s_ij).
 *
 * The T x T score matrix never exists. Queries and keys are cut into ATTN_TILE-sized tiles;
 * one (query tile, key tile) pair is a small score tile in per-thread scratch. Key tiles
 * above the diagonal are skipped; in the diagonal tile only the lower triangle is computed
 * (at the granularity of register blocks) and masked.
 *   forward:  each query tile walks its key tiles keeping a running max m_i and sum l_i per
 *             row (online softmax), rescaling its output accumulator when the max grows;
 *             lse_i = m_i + log l_i is the only statistic saved.
 *   backward: recomputes p from q, k and lse, and with D_i = dout_i.out_i:
 *             dv_j += sum_i p_ij dout_i,  dp_ij = dout_i.v_j,  ds_ij = p_ij (dp_ij - D_i),
 *             dq_i += scale sum_j ds_ij k_j,  dk_j += scale sum_i ds_ij q_i.
 *
 * Every product goes through one register-tiled micro-kernel, mm_acc, whose vectors run
 * along a row of a 64-wide tile. So the operands that are reused are kept transposed:
 *   forward:  score tile st[j][i] (key j, query i) = k_j . (scale q^T), the output
 *             accumulator as out^T (D, TILE); every softmax statistic is then a vector over i.
 *   backward: score tile s[i][j] = q_i . (scale k^T), dk^T and dv^T accumulators (D, TILE);
 *             only dq_i += ds_i. k runs along the head dim instead.
 *
 * Threading: the forward splits (b, h, query tile); the backward splits (b, kv head), so the
 * query heads that share a kv head, and all their dk/dv rows, belong to one thread. Each
 * output element is summed in a fixed order: results are bitwise identical for any number
 * of threads.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/attn_span.h"
#include "kernels/kreal.h"

/* One SIMD register's worth of reals, as a GNU vector type, so the micro-kernel's register
 * tile is explicit rather than left to the auto-vectoriser. It must match the machine's
 * register width (GCC splits a wider vector through memory), and the register tile must fit
 * the register file: with 32 zmm (AVX-512), 16 accumulators as 16 rows x 1 vector or
 * 8 rows x 2 vectors; with 16 ymm (AVX2) or xmm, 8 rows x 1 vector (measured best there).
 * rvec_u is the same type with no alignment promise, for loads and stores. */
#if defined(__AVX512F__)
#define RVEC_BYTES 64
#define MM_ROWS_1V 16 /* rows of a register tile one vector wide */
#define MM_ROWS_2V 8  /* rows of a register tile two vectors wide; 0: not used */
#elif defined(__AVX__)
#define RVEC_BYTES 32
#define MM_ROWS_1V 8
#define MM_ROWS_2V 0
#else
#define RVEC_BYTES 16
#define MM_ROWS_1V 8
#define MM_ROWS_2V 0
#endif
typedef real rvec __attribute__((vector_size(RVEC_BYTES)));
typedef real rvec_u __attribute__((vector_size(RVEC_BYTES), aligned(sizeof(real)), may_alias));

enum {
	ATTN_TILE = 64,                          /* query and key tile size */
	VL = (int)(sizeof(rvec) / sizeof(real)), /* reals per vector */
};
_Static_assert(ATTN_TILE % (2 * VL) == 0, "tile rows are whole pairs of vectors");
_Static_assert(2 * MM_ROWS_2V <= MM_ROWS_1V, "both register tiles use the same accumulators");

/* Strides and sizes shared by every tile of one call. Rows of q/out/dq are q_rs apart,
 * rows of k/v/dk/dv kv_rs apart. */
struct attn_dims {
	int64_t B, T, H, KV, D, group, ntiles, q_rs, kv_rs;
	real scale;
};

static struct attn_dims attn_dims_make(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D)
{
	CHECK(B > 0 && T > 0 && H > 0 && KV > 0 && D > 0,
	      "attention: bad shape B=%lld T=%lld H=%lld KV=%lld D=%lld", (long long)B,
	      (long long)T, (long long)H, (long long)KV, (long long)D);
	CHECK(H % KV == 0, "attention: H=%lld not a multiple of KV=%lld", (long long)H,
	      (long long)KV);
	CHECK(D <= ATTN_MAX_HEAD_DIM, "attention: head dim %lld > ATTN_MAX_HEAD_DIM=%d",
	      (long long)D, ATTN_MAX_HEAD_DIM);
	struct attn_dims a = {
	    .B = B,
	    .T = T,
	    .H = H,
	    .KV = KV,
	    .D = D,
	    .group = H / KV,
	    .ntiles = (T + ATTN_TILE - 1) / ATTN_TILE,
	    .q_rs = H * D,
	    .kv_rs = KV * D,
	    .scale = (real)(1.0 / sqrt((double)D)),
	};
	return a;
}

static inline int64_t tile_len(const struct attn_dims *a, int64_t tile)
{
	int64_t n = a->T - tile * ATTN_TILE;
	return n < ATTN_TILE ? n : ATTN_TILE;
}

static inline int64_t min64(int64_t x, int64_t y)
{
	return x < y ? x : y;
}

/* ---- micro-kernel ---------------------------------------------------------------------- */

/* Triangular structure of a product on a diagonal tile, where a query and a key index of
 * the same tile pair up only if key <= query. mm_acc skips the register blocks outside the
 * triangle: there an operand is zero, or the result is masked afterwards. */
enum mm_tri {
	MM_TRI_NONE,
	MM_TRI_C_N_GE_R, /* only c[r][n] with n >= r is used */
	MM_TRI_C_N_LE_R, /* only c[r][n] with n <= r is used */
	MM_TRI_A_K_LE_R, /* a(r,k) = 0 for k > r */
	MM_TRI_B_K_LE_N, /* b[k][n] = 0 for k > n */
	MM_TRI_B_K_GE_N, /* b[k][n] = 0 for k < n */
};

/* c[0:rows][0:nv*VL] = (load_c ? c : 0) + sum_{k<K} a(r,k) * b[k][0:nv*VL]:
 * a register tile of rows x nv vectors held while k runs; each vector of b feeds `rows`
 * FMAs, each scalar of a (broadcast) feeds nv. rows and nv are compile-time constants. */
static inline __attribute__((always_inline)) void
mm_block(real *restrict c, int64_t c_rs, const real *restrict a, int64_t a_rs, int64_t a_ks,
         const real *restrict b, int64_t b_ks, int64_t K, bool load_c, const int rows, const int nv)
{
	rvec acc[MM_ROWS_1V];
	for (int r = 0; r < rows; r++)
		for (int v = 0; v < nv; v++)
			acc[r * nv + v] = (rvec){0};
	if (load_c)
		for (int r = 0; r < rows; r++)
			for (int v = 0; v < nv; v++)
				acc[r * nv + v] = *(const rvec_u *)(c + r * c_rs + v * VL);
	for (int64_t k = 0; k < K; k++) {
		rvec bk[2];
		for (int v = 0; v < nv; v++)
			bk[v] = *(const rvec_u *)(b + k * b_ks + v * VL);
		for (int r = 0; r < rows; r++) {
			real ark = a[r * a_rs + k * a_ks];
			for (int v = 0; v < nv; v++)
				acc[r * nv + v] += ark * bk[v];
		}
	}
	for (int r = 0; r < rows; r++)
		for (int v = 0; v < nv; v++)
			*(rvec_u *)(c + r * c_rs + v * VL) = acc[r * nv + v];
}

/* Rows r0..R-1 of mm_acc, one at a time (leftovers of the register tiling, odd N). Ignores
 * the triangle: the skipped terms are zero or masked anyway. */
static void mm_rows(real *restrict c, int64_t c_rs, const real *restrict a, int64_t a_rs,
                    int64_t a_ks, const real *restrict b, int64_t b_ks, int64_t r0, int64_t R,
                    int64_t K, int64_t N, bool load_c)
{
	for (int64_t r = r0; r < R; r++) {
		real *cr = c + r * c_rs;
		if (!load_c)
			for (int64_t n = 0; n < N; n++)
				cr[n] = 0;
		for (int64_t k = 0; k < K; k++) {
			real ark = a[r * a_rs + k * a_ks];
			const real *bk = b + k * b_ks;
			for (int64_t n = 0; n < N; n++)
				cr[n] += ark * bk[n];
		}
	}
}

/* mm_acc with register blocks of rows x nv vectors; the k range of each block, or whether it
 * is needed at all, follows the triangle. */
static inline __attribute__((always_inline)) void
mm_tiles(real *restrict c, int64_t c_rs, const real *restrict a, int64_t a_rs, int64_t a_ks,
         const real *restrict b, int64_t b_ks, int64_t R, int64_t K, int64_t N, enum mm_tri tri,
         bool load_c, const int rows, const int nv)
{
	const int64_t w = nv * VL;
	int64_t r0 = 0;
	for (; r0 + rows <= R; r0 += rows) {
		for (int64_t n0 = 0; n0 < N; n0 += w) {
			if ((tri == MM_TRI_C_N_GE_R && n0 + w <= r0) ||
			    (tri == MM_TRI_C_N_LE_R && n0 >= r0 + rows))
				continue;
			int64_t k0 = tri == MM_TRI_B_K_GE_N ? min64(n0, K) : 0;
			int64_t k1 = tri == MM_TRI_B_K_LE_N   ? min64(n0 + w, K)
			             : tri == MM_TRI_A_K_LE_R ? min64(r0 + rows, K)
			                                      : K;
			mm_block(c + r0 * c_rs + n0, c_rs, a + r0 * a_rs + k0 * a_ks, a_rs, a_ks,
			         b + k0 * b_ks + n0, b_ks, k1 - k0, load_c, rows, nv);
		}
	}
	mm_rows(c, c_rs, a, a_rs, a_ks, b, b_ks, r0, R, K, N, load_c);
}

/* c[r][0:N] (+)= sum_{k<K} a(r,k) * b[k][0:N]   for r < R,
 * with a(r,k) = a[r*a_rs + k*a_ks] (so a may be read transposed), row r of c at c + r*c_rs,
 * row k of b at b + k*b_ks; c is overwritten unless load_c. The sum over k always runs in
 * increasing k, from a zero or loaded accumulator: deterministic. */
static void mm_acc(real *restrict c, int64_t c_rs, const real *restrict a, int64_t a_rs,
                   int64_t a_ks, const real *restrict b, int64_t b_ks, int64_t R, int64_t K,
                   int64_t N, enum mm_tri tri, bool load_c)
{
	if (MM_ROWS_2V > 0 && N % (2 * VL) == 0)
		mm_tiles(c, c_rs, a, a_rs, a_ks, b, b_ks, R, K, N, tri, load_c,
		         MM_ROWS_2V > 0 ? MM_ROWS_2V : 1, 2);
	else if (N % VL == 0)
		mm_tiles(c, c_rs, a, a_rs, a_ks, b, b_ks, R, K, N, tri, load_c, MM_ROWS_1V, 1);
	else
		mm_rows(c, c_rs, a, a_rs, a_ks, b, b_ks, 0, R, K, N, load_c);
}

/* ---- tiles and scratch ----------------------------------------------------------------- */

/* dst[d][i] = alpha * (row i of src)[d] for i < n; columns n..ATTN_TILE-1 are zero.
 * Turns a tile of strided token rows into a transposed (D, ATTN_TILE) operand. */
static void tile_load_t(real *restrict dst, const real *restrict src, int64_t src_rs, int64_t n,
                        int64_t D, real alpha)
{
	for (int64_t d = 0; d < D; d++) {
		real *row = dst + d * ATTN_TILE;
		for (int64_t i = 0; i < n; i++)
			row[i] = alpha * src[i * src_rs + d];
		for (int64_t i = n; i < ATTN_TILE; i++)
			row[i] = 0;
	}
}

/* (row i of dst)[d] += src[d][i] for i < n: adds a transposed (D, ATTN_TILE) accumulator
 * into strided token rows. */
static void tile_add_t(real *restrict dst, int64_t dst_rs, const real *restrict src, int64_t n,
                       int64_t D)
{
	for (int64_t i = 0; i < n; i++)
		for (int64_t d = 0; d < D; d++)
			dst[i * dst_rs + d] += src[d * ATTN_TILE + i];
}

/* Per-thread scratch, allocated (zeroed) once per call: tiles bounded by the tile size and
 * the head dim. */
struct attn_scratch {
	real *dt[4];  /* 4 x (D, TILE): transposed operands and accumulators */
	real *tt[2];  /* 2 x (TILE, TILE): score, probability and gradient tiles */
	real *vec[3]; /* 3 x (TILE): per-query statistics of one tile */
	void *mem;
};

static void attn_scratch_init(struct attn_scratch *w, int64_t D)
{
	size_t n_dt = (size_t)D * ATTN_TILE, n_tt = (size_t)ATTN_TILE * ATTN_TILE;
	size_t bytes = (4 * n_dt + 2 * n_tt + 3 * ATTN_TILE) * sizeof(real);
	bytes = (bytes + 63) / 64 * 64;
	w->mem = aligned_alloc(64, bytes);
	CHECK(w->mem, "attention: out of memory for %zu bytes of scratch", bytes);
	memset(w->mem, 0, bytes);
	real *p = w->mem;
	for (int i = 0; i < 4; i++, p += n_dt)
		w->dt[i] = p;
	for (int i = 0; i < 2; i++, p += n_tt)
		w->tt[i] = p;
	for (int i = 0; i < 3; i++, p += ATTN_TILE)
		w->vec[i] = p;
}

/* Announces n strided rows of D reals that will be written soon: their cache misses overlap
 * the tile's compute instead of stalling the final loop. */
static void rows_prefetch(const real *x, int64_t rs, int64_t n, int64_t D)
{
	for (int64_t i = 0; i < n; i++)
		for (int64_t d = 0; d < D; d += 64 / (int64_t)sizeof(real))
			__builtin_prefetch(x + i * rs + d, 1);
}

/* ---- forward --------------------------------------------------------------------------- */

/* st[j][i] = -inf where key j comes after query i (the diagonal tile only). */
static void mask_causal_t(real *st, int64_t nk)
{
	for (int64_t j = 1; j < nk; j++)
		for (int64_t i = 0; i < j; i++)
			st[j * ATTN_TILE + i] = -INFINITY;
}

/* Online softmax over one key tile, all vectors over the query index i:
 *   m'_i = max(m_i, max_j s_ji),  corr_i = exp(m_i - m'_i),
 *   p_ji = exp(s_ji - m'_i),      l_i = l_i corr_i + sum_j p_ji.
 * Masked scores are -inf, so their p is 0. st is overwritten by p. */
static void softmax_online(real *restrict st, real *restrict m, real *restrict l,
                           real *restrict corr, int64_t nk)
{
	real mnew[ATTN_TILE];
	for (int64_t i = 0; i < ATTN_TILE; i++)
		mnew[i] = m[i];
	for (int64_t j = 0; j < nk; j++)
		for (int64_t i = 0; i < ATTN_TILE; i++)
			mnew[i] = st[j * ATTN_TILE + i] > mnew[i] ? st[j * ATTN_TILE + i] : mnew[i];
	for (int64_t i = 0; i < ATTN_TILE; i++) {
		corr[i] = KEXP(m[i] - mnew[i]);
		l[i] *= corr[i];
		m[i] = mnew[i];
	}
	for (int64_t j = 0; j < nk; j++) {
		real *pj = st + j * ATTN_TILE;
		for (int64_t i = 0; i < ATTN_TILE; i++) {
			pj[i] = KEXP(pj[i] - mnew[i]);
			l[i] += pj[i];
		}
	}
}

/* One (b, h, query tile): walks key tiles 0..qtile, writes nq rows of out and lse. */
static void attn_forward_tile(const struct attn_dims *a, struct attn_scratch *w, real *out,
                              real *lse, const real *q, const real *k, const real *v, int64_t b,
                              int64_t h, int64_t qtile)
{
	const int64_t D = a->D, q0 = qtile * ATTN_TILE, nq = tile_len(a, qtile);
	const int64_t qoff = ((b * a->T + q0) * a->H + h) * D;
	const int64_t kvoff = (b * a->T * a->KV + h / a->group) * D; /* token 0 of the kv head */
	real *qt = w->dt[0];                                         /* (D, TILE): scale q^T */
	real *acct = w->dt[1]; /* (D, TILE): out^T, unnormalised */
	real *st = w->tt[0];   /* (TILE, TILE): st[j][i] = s_ij, then p */
	real *m = w->vec[0], *l = w->vec[1], *corr = w->vec[2];

	tile_load_t(qt, q + qoff, a->q_rs, nq, D, a->scale);
	rows_prefetch(out + qoff, a->q_rs, nq, D);
	memset(acct, 0, (size_t)(D * ATTN_TILE) * sizeof(real));
	for (int64_t i = 0; i < ATTN_TILE; i++)
		m[i] = -INFINITY, l[i] = 0;

	for (int64_t kt = 0; kt <= qtile; kt++) {
		const int64_t nk = tile_len(a, kt);
		const real *kj = k + kvoff + kt * ATTN_TILE * a->kv_rs;
		const real *vj = v + kvoff + kt * ATTN_TILE * a->kv_rs;
		const bool diag = kt == qtile;
		/* st[j][i] = k_j . (scale q_i) */
		mm_acc(st, ATTN_TILE, kj, a->kv_rs, 1, qt, ATTN_TILE, nk, D, ATTN_TILE,
		       diag ? MM_TRI_C_N_GE_R : MM_TRI_NONE, false);
		if (diag)
			mask_causal_t(st, nk);
		softmax_online(st, m, l, corr, nk);
		/* out^T[d][i] = out^T[d][i] corr_i + sum_j v_j[d] p_ji */
		for (int64_t d = 0; d < D; d++)
			for (int64_t i = 0; i < ATTN_TILE; i++)
				acct[d * ATTN_TILE + i] *= corr[i];
		mm_acc(acct, ATTN_TILE, vj, 1, a->kv_rs, st, ATTN_TILE, D, nk, ATTN_TILE,
		       diag ? MM_TRI_B_K_LE_N : MM_TRI_NONE, true);
	}

	/* lse_i = m_i + log l_i,  out_i = out^T[:][i] / l_i */
	real *ob = out + qoff, *lb = lse + (b * a->H + h) * a->T + q0;
	for (int64_t i = 0; i < nq; i++) {
		lb[i] = m[i] + KLOG(l[i]);
		l[i] = 1 / l[i]; /* l now holds 1/l */
	}
	for (int64_t i = 0; i < nq; i++)
		for (int64_t d = 0; d < D; d++)
			ob[i * a->q_rs + d] = acct[d * ATTN_TILE + i] * l[i];
}

void KFN(attention_forward)(real *out, real *lse, const real *q, const real *k, const real *v,
                            int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D)
{
	const struct attn_dims a = attn_dims_make(B, T, H, KV, D);
	const int64_t nbh = B * H, nitems = nbh * a.ntiles;
#pragma omp parallel
	{
		struct attn_scratch w;
		attn_scratch_init(&w, D);
		/* Items cost (query tile + 1) key tiles: hand out the late tiles first. */
#pragma omp for schedule(dynamic, 1)
		for (int64_t it = 0; it < nitems; it++) {
			int64_t qtile = a.ntiles - 1 - it / nbh, bh = it % nbh;
			attn_forward_tile(&a, &w, out, lse, q, k, v, bh / H, bh % H, qtile);
		}
		free(w.mem);
	}
}

/* ---- backward -------------------------------------------------------------------------- */

/* Backward of one (b, h, query tile, key tile) pair, s[i][j] layout (query i, key j):
 *   p = exp(s - lse_i),  ds = scale p (dp - D_i),
 *   dv^T += dout^T p,  dk^T += q^T ds,  dq_i += sum_j ds_ij k_j.
 * kt/vt are scale k^T and v^T of the key tile; dkt/dvt its accumulators; dsum holds D_i of
 * this query tile. */
static void attn_backward_pair(const struct attn_dims *a, struct attn_scratch *w, real *dq,
                               const real *dout, const real *lse, const real *dsum, const real *q,
                               const real *k, int64_t b, int64_t h, int64_t qtile, int64_t ktile)
{
	const int64_t D = a->D, q0 = qtile * ATTN_TILE, nq = tile_len(a, qtile);
	const int64_t nk = tile_len(a, ktile);
	const int64_t qoff = ((b * a->T + q0) * a->H + h) * D;
	const real *qb = q + qoff, *dob = dout + qoff;
	const real *kj = k + (b * a->T * a->KV + h / a->group) * D + ktile * ATTN_TILE * a->kv_rs;
	const real *lse_t = lse + (b * a->H + h) * a->T + q0;
	const real *kt = w->dt[0], *vt = w->dt[1];
	real *dkt = w->dt[2], *dvt = w->dt[3];
	real *p = w->tt[0], *ds = w->tt[1];
	const bool diag = qtile == ktile;

	/* p[i][j] = exp(q_i . (scale k_j) - lse_i), zero where key j comes after query i */
	mm_acc(p, ATTN_TILE, qb, a->q_rs, 1, kt, ATTN_TILE, nq, D, ATTN_TILE,
	       diag ? MM_TRI_C_N_LE_R : MM_TRI_NONE, false);
	for (int64_t i = 0; i < nq; i++) {
		real *pi = p + i * ATTN_TILE;
		int64_t jend = diag ? i + 1 : ATTN_TILE;
		for (int64_t j = 0; j < jend; j++)
			pi[j] = KEXP(pi[j] - lse_t[i]);
		for (int64_t j = jend; j < ATTN_TILE; j++)
			pi[j] = 0;
	}
	/* ds[i][j] = dp_ij = dout_i . v_j, then scale p_ij (dp_ij - D_i) */
	mm_acc(ds, ATTN_TILE, dob, a->q_rs, 1, vt, ATTN_TILE, nq, D, ATTN_TILE,
	       diag ? MM_TRI_C_N_LE_R : MM_TRI_NONE, false);
	for (int64_t i = 0; i < nq; i++) {
		real *dsi = ds + i * ATTN_TILE;
		const real *pi = p + i * ATTN_TILE;
		int64_t jend = diag ? i + 1 : ATTN_TILE;
		for (int64_t j = 0; j < jend; j++)
			dsi[j] = a->scale * pi[j] * (dsi[j] - dsum[i]);
		for (int64_t j = jend; j < ATTN_TILE; j++)
			dsi[j] = 0;
	}
	/* dv^T[d][j] += sum_i dout_i[d] p_ij;  dk^T[d][j] += sum_i q_i[d] ds_ij */
	mm_acc(dvt, ATTN_TILE, dob, 1, a->q_rs, p, ATTN_TILE, D, nq, ATTN_TILE,
	       diag ? MM_TRI_B_K_GE_N : MM_TRI_NONE, true);
	mm_acc(dkt, ATTN_TILE, qb, 1, a->q_rs, ds, ATTN_TILE, D, nq, ATTN_TILE,
	       diag ? MM_TRI_B_K_GE_N : MM_TRI_NONE, true);
	/* dq_i += sum_j ds_ij k_j */
	mm_acc(dq + qoff, a->q_rs, ds, ATTN_TILE, 1, kj, a->kv_rs, nq, nk, D,
	       diag ? MM_TRI_A_K_LE_R : MM_TRI_NONE, true);
}

/* dsum[(b*H + h)*T + t] = D_t = dout_t . out_t for every (b, t, h), one pass over dout and
 * out in memory order (threads split the tokens): a kv group's items then read their query
 * heads' rows of it instead of walking dout and out a head at a time, a row per cache line.
 * Also the bf16 kernel's (kernels.h). */
void KFN(attention_row_dots)(real *dsum, const real *dout, const real *out, int64_t B, int64_t T,
                             int64_t H, int64_t D)
{
#pragma omp for schedule(static)
	for (int64_t bt = 0; bt < B * T; bt++) {
		const int64_t b = bt / T, t = bt % T;
		for (int64_t h = 0; h < H; h++) {
			int64_t off = (bt * H + h) * D;
			real s = 0;
			for (int64_t d = 0; d < D; d++)
				s += dout[off + d] * out[off + d];
			dsum[(b * H + h) * T + t] = s;
		}
	}
}

/* Backward of one (b, kv head): for each key tile, every query head of the group and every
 * query tile at or below it, in a fixed order. Owns dk/dv of that kv head. */
static void attn_backward_kv(const struct attn_dims *a, struct attn_scratch *w, real *dq, real *dk,
                             real *dv, const real *dout, const real *dsum_all, const real *lse,
                             const real *q, const real *k, const real *v, int64_t b, int64_t g)
{
	const int64_t D = a->D, kvoff = (b * a->T * a->KV + g) * D;
	const real *dsum = dsum_all + (b * a->H + g * a->group) * a->T; /* the group's heads */
	for (int64_t kt = 0; kt < a->ntiles; kt++) {
		const int64_t k0 = kt * ATTN_TILE, nk = tile_len(a, kt);
		real *dkj = dk + kvoff + k0 * a->kv_rs, *dvj = dv + kvoff + k0 * a->kv_rs;
		tile_load_t(w->dt[0], k + kvoff + k0 * a->kv_rs, a->kv_rs, nk, D, a->scale);
		tile_load_t(w->dt[1], v + kvoff + k0 * a->kv_rs, a->kv_rs, nk, D, 1);
		memset(w->dt[2], 0, (size_t)(D * ATTN_TILE) * sizeof(real)); /* dk^T */
		memset(w->dt[3], 0, (size_t)(D * ATTN_TILE) * sizeof(real)); /* dv^T */
		rows_prefetch(dkj, a->kv_rs, nk, D);
		rows_prefetch(dvj, a->kv_rs, nk, D);
		for (int64_t hh = 0; hh < a->group; hh++)
			for (int64_t qt = kt; qt < a->ntiles; qt++)
				attn_backward_pair(a, w, dq, dout, lse,
				                   dsum + hh * a->T + qt * ATTN_TILE, q, k, b,
				                   g * a->group + hh, qt, kt);
		tile_add_t(dkj, a->kv_rs, w->dt[2], nk, D);
		tile_add_t(dvj, a->kv_rs, w->dt[3], nk, D);
	}
}

void KFN(attention_backward)(real *dq, real *dk, real *dv, const real *dout, const real *out,
                             const real *lse, const real *q, const real *k, const real *v,
                             int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D)
{
	const struct attn_dims a = attn_dims_make(B, T, H, KV, D);
	real *dsum = malloc((size_t)(B * H * T) * sizeof(real));
	CHECK(dsum, "attention: out of memory for %lld row statistics", (long long)(B * H * T));
#pragma omp parallel
	{
		struct attn_scratch w;
		attn_scratch_init(&w, D);
		KFN(attention_row_dots)(dsum, dout, out, B, T, H, D); /* ends in a barrier */
#pragma omp for schedule(dynamic, 1)
		for (int64_t it = 0; it < B * KV; it++)
			attn_backward_kv(&a, &w, dq, dk, dv, dout, dsum, lse, q, k, v, it / KV,
			                 it % KV);
		free(w.mem);
	}
	free(dsum);
}

/* ---- position-aware (kernels.h: attention_pos_*; the maths in attention_pos.c) ----------
 *
 * The same tiles and micro-kernel with query positions qpos(Tq) and key positions kpos(Tk)
 * instead of the diagonal: query i sees key j iff kpos[j] <= qpos[i]. A (query tile, key
 * tile) pair is skipped when its smallest key position is after its largest query position,
 * computed unmasked when its largest key position is at or before its smallest query
 * position, and masked element by element otherwise. A query may see no key of a tile, or of
 * any tile (lse -inf, out 0), so the online softmax guards a row whose maximum is still
 * -inf. Threads as above: forward over (b, h, query tile), backward over (b, kv head). */

static int64_t len_at(int64_t T, int64_t tile)
{
	return min64(ATTN_TILE, T - tile * ATTN_TILE);
}

/* softmax_online with rows that may have seen no key yet (max -inf: p 0, l and out stay 0) */
static void softmax_online_pos(real *restrict st, real *restrict m, real *restrict l,
                               real *restrict corr, int64_t nk)
{
	real mnew[ATTN_TILE];
	for (int64_t i = 0; i < ATTN_TILE; i++)
		mnew[i] = m[i];
	for (int64_t j = 0; j < nk; j++)
		for (int64_t i = 0; i < ATTN_TILE; i++)
			mnew[i] = st[j * ATTN_TILE + i] > mnew[i] ? st[j * ATTN_TILE + i] : mnew[i];
	for (int64_t i = 0; i < ATTN_TILE; i++) {
		corr[i] = mnew[i] == -INFINITY ? 1 : KEXP(m[i] - mnew[i]);
		l[i] *= corr[i];
		m[i] = mnew[i];
	}
	for (int64_t j = 0; j < nk; j++) {
		real *pj = st + j * ATTN_TILE;
		for (int64_t i = 0; i < ATTN_TILE; i++) {
			pj[i] = mnew[i] == -INFINITY ? 0 : KEXP(pj[i] - mnew[i]);
			l[i] += pj[i];
		}
	}
}

static void attn_pos_forward_tile(const struct attn_dims *a, struct attn_scratch *w, real *out,
                                  real *lse, const real *q, const int64_t *qpos, const real *k,
                                  const real *v, const int64_t *kpos, int64_t Tq, int64_t Tk,
                                  int64_t b, int64_t h, int64_t qtile)
{
	const int64_t D = a->D, q0 = qtile * ATTN_TILE, nq = len_at(Tq, qtile);
	const int64_t qoff = ((b * Tq + q0) * a->H + h) * D;
	const int64_t kvoff = (b * Tk * a->KV + h / a->group) * D;
	const struct pos_span qs = pos_span_of(qpos + q0, nq);
	real *qt = w->dt[0], *acct = w->dt[1], *st = w->tt[0];
	real *m = w->vec[0], *l = w->vec[1], *corr = w->vec[2];

	tile_load_t(qt, q + qoff, a->q_rs, nq, D, a->scale);
	memset(acct, 0, (size_t)(D * ATTN_TILE) * sizeof(real));
	for (int64_t i = 0; i < ATTN_TILE; i++)
		m[i] = -INFINITY, l[i] = 0;
	for (int64_t kt = 0; kt * ATTN_TILE < Tk; kt++) {
		const int64_t k0 = kt * ATTN_TILE, nk = len_at(Tk, kt);
		const struct pos_span ks = pos_span_of(kpos + k0, nk);
		if (ks.lo > qs.hi)
			continue;
		const real *kj = k + kvoff + k0 * a->kv_rs, *vj = v + kvoff + k0 * a->kv_rs;
		mm_acc(st, ATTN_TILE, kj, a->kv_rs, 1, qt, ATTN_TILE, nk, D, ATTN_TILE, MM_TRI_NONE,
		       false);
		if (ks.hi > qs.lo) { /* partly visible: mask key j after query i */
			for (int64_t j = 0; j < nk; j++)
				for (int64_t i = 0; i < nq; i++)
					if (kpos[k0 + j] > qpos[q0 + i])
						st[j * ATTN_TILE + i] = -INFINITY;
			softmax_online_pos(st, m, l, corr, nk);
		} else { /* every query sees every key: no row's maximum stays -inf, so the
			    guarded softmax's values are the plain one's (its branches cost
			    the vector loops) */
			softmax_online(st, m, l, corr, nk);
		}
		for (int64_t d = 0; d < D; d++)
			for (int64_t i = 0; i < ATTN_TILE; i++)
				acct[d * ATTN_TILE + i] *= corr[i];
		mm_acc(acct, ATTN_TILE, vj, 1, a->kv_rs, st, ATTN_TILE, D, nk, ATTN_TILE, MM_TRI_NONE,
		       true);
	}
	real *ob = out + qoff, *lb = lse + (b * a->H + h) * Tq + q0;
	for (int64_t i = 0; i < nq; i++) {
		lb[i] = l[i] > 0 ? m[i] + KLOG(l[i]) : -INFINITY;
		l[i] = l[i] > 0 ? 1 / l[i] : 0;
	}
	for (int64_t i = 0; i < nq; i++)
		for (int64_t d = 0; d < D; d++)
			ob[i * a->q_rs + d] = acct[d * ATTN_TILE + i] * l[i];
}

void KFN(attention_pos_forward)(real *out, real *lse, const real *q, const int64_t *qpos,
                                const real *k, const real *v, const int64_t *kpos, int64_t B,
                                int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	CHECK(Tk > 0, "attention_pos: no keys");
	const struct attn_dims a = attn_dims_make(B, Tq, H, KV, D);
	const int64_t nbh = B * H, nitems = nbh * a.ntiles;
#pragma omp parallel
	{
		struct attn_scratch w;
		attn_scratch_init(&w, D);
#pragma omp for schedule(dynamic, 1)
		for (int64_t it = 0; it < nitems; it++)
			attn_pos_forward_tile(&a, &w, out, lse, q, qpos, k, v, kpos, Tq, Tk,
			                      (it % nbh) / H, (it % nbh) % H, it / nbh);
		free(w.mem);
	}
}

/* attn_backward_pair at positions: rows of query tile qtile (head h) against the key tile
 * loaded in w (scale k^T, v^T; accumulators dk^T, dv^T), key positions kp of nk keys */
static void attn_pos_backward_pair(const struct attn_dims *a, struct attn_scratch *w, real *dq,
                                   const real *dout, const real *lse, const real *dsum,
                                   const real *q, const int64_t *qpos, const real *kj,
                                   const int64_t *kp, int64_t nk, bool masked, int64_t Tq,
                                   int64_t b, int64_t h, int64_t qtile)
{
	const int64_t D = a->D, q0 = qtile * ATTN_TILE, nq = len_at(Tq, qtile);
	const int64_t qoff = ((b * Tq + q0) * a->H + h) * D;
	const real *qb = q + qoff, *dob = dout + qoff, *lse_t = lse + (b * a->H + h) * Tq + q0;
	const real *kt = w->dt[0], *vt = w->dt[1];
	real *dkt = w->dt[2], *dvt = w->dt[3], *p = w->tt[0], *ds = w->tt[1];
	mm_acc(p, ATTN_TILE, qb, a->q_rs, 1, kt, ATTN_TILE, nq, D, ATTN_TILE, MM_TRI_NONE, false);
	for (int64_t i = 0; i < nq; i++) {
		real *pi = p + i * ATTN_TILE;
		if (masked) {
			for (int64_t j = 0; j < ATTN_TILE; j++)
				pi[j] = j < nk && kp[j] <= qpos[q0 + i] ? KEXP(pi[j] - lse_t[i]) : 0;
			continue;
		}
		/* every key visible: the same values through a loop the compiler vectorises */
		for (int64_t j = 0; j < nk; j++)
			pi[j] = KEXP(pi[j] - lse_t[i]);
		for (int64_t j = nk; j < ATTN_TILE; j++)
			pi[j] = 0;
	}
	mm_acc(ds, ATTN_TILE, dob, a->q_rs, 1, vt, ATTN_TILE, nq, D, ATTN_TILE, MM_TRI_NONE, false);
	for (int64_t i = 0; i < nq; i++) {
		real *dsi = ds + i * ATTN_TILE;
		const real *pi = p + i * ATTN_TILE;
		for (int64_t j = 0; j < ATTN_TILE; j++)
			dsi[j] = a->scale * pi[j] * (dsi[j] - dsum[i]);
	}
	mm_acc(dvt, ATTN_TILE, dob, 1, a->q_rs, p, ATTN_TILE, D, nq, ATTN_TILE, MM_TRI_NONE, true);
	mm_acc(dkt, ATTN_TILE, qb, 1, a->q_rs, ds, ATTN_TILE, D, nq, ATTN_TILE, MM_TRI_NONE, true);
	mm_acc(dq + qoff, a->q_rs, ds, ATTN_TILE, 1, kj, a->kv_rs, nq, nk, D, MM_TRI_NONE, true);
}

static void attn_pos_backward_kv(const struct attn_dims *a, struct attn_scratch *w, real *dq,
                                 real *dk, real *dv, const real *dout, const real *dsum_all,
                                 const real *lse, const real *q, const int64_t *qpos,
                                 const real *k, const real *v, const int64_t *kpos, int64_t Tq,
                                 int64_t Tk, int64_t b, int64_t g)
{
	const int64_t D = a->D, kvoff = (b * Tk * a->KV + g) * D;
	/* D_i = dout_i . out_i of the group's query heads; rows that see no key: 0 (unused) */
	const real *dsum = dsum_all + (b * a->H + g * a->group) * Tq;
	for (int64_t kt = 0; kt * ATTN_TILE < Tk; kt++) {
		const int64_t k0 = kt * ATTN_TILE, nk = len_at(Tk, kt);
		const struct pos_span ks = pos_span_of(kpos + k0, nk);
		real *dkj = dk + kvoff + k0 * a->kv_rs, *dvj = dv + kvoff + k0 * a->kv_rs;
		tile_load_t(w->dt[0], k + kvoff + k0 * a->kv_rs, a->kv_rs, nk, D, a->scale);
		tile_load_t(w->dt[1], v + kvoff + k0 * a->kv_rs, a->kv_rs, nk, D, 1);
		memset(w->dt[2], 0, (size_t)(D * ATTN_TILE) * sizeof(real));
		memset(w->dt[3], 0, (size_t)(D * ATTN_TILE) * sizeof(real));
		for (int64_t hh = 0; hh < a->group; hh++)
			for (int64_t qt = 0; qt < a->ntiles; qt++) {
				const struct pos_span qs =
				    pos_span_of(qpos + qt * ATTN_TILE, len_at(Tq, qt));
				if (ks.lo > qs.hi)
					continue;
				attn_pos_backward_pair(a, w, dq, dout, lse,
				                       dsum + hh * Tq + qt * ATTN_TILE, q, qpos,
				                       k + kvoff + k0 * a->kv_rs, kpos + k0, nk,
				                       ks.hi > qs.lo, Tq, b, g * a->group + hh, qt);
			}
		tile_add_t(dkj, a->kv_rs, w->dt[2], nk, D);
		tile_add_t(dvj, a->kv_rs, w->dt[3], nk, D);
	}
}

void KFN(attention_pos_backward)(real *dq, real *dk, real *dv, const real *dout, const real *out,
                                 const real *lse, const real *q, const int64_t *qpos,
                                 const real *k, const real *v, const int64_t *kpos, int64_t B,
                                 int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t D)
{
	CHECK(Tk > 0, "attention_pos: no keys");
	const struct attn_dims a = attn_dims_make(B, Tq, H, KV, D);
	real *dsum = malloc((size_t)(B * H * Tq) * sizeof(real));
	CHECK(dsum, "attention_pos: out of memory for %lld row statistics", (long long)(B * H * Tq));
#pragma omp parallel
	{
		struct attn_scratch w;
		attn_scratch_init(&w, D);
		KFN(attention_row_dots)(dsum, dout, out, B, Tq, H, D); /* ends in a barrier */
#pragma omp for schedule(dynamic, 1)
		for (int64_t it = 0; it < B * KV; it++)
			attn_pos_backward_kv(&a, &w, dq, dk, dv, dout, dsum, lse, q, qpos, k, v, kpos,
			                     Tq, Tk, it / KV, it % KV);
		free(w.mem);
	}
	free(dsum);
}
