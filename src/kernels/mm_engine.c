/* kernels/mm_engine: dispatch of float matmuls to oneDNN or OpenBLAS, bf16 operand rounding,
 * per-shape auto selection, and the OpenBLAS CPU-table guard. See mm_engine.h. */
#define _GNU_SOURCE
#include "kernels/mm_engine.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/bf16.h"
#include "base/cpu.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"

char *openblas_get_corename(void);

static const char *const mm_engine_names[] = {"auto", "onednn", "openblas"};
_Static_assert(sizeof(mm_engine_names) / sizeof(mm_engine_names[0]) == MM_ENGINE_COUNT,
               "engine names");

#define MM_SHAPES 256
#define MM_BT_MAX (4 << 20) /* largest B transposed into scratch, in floats (16 MiB) */
/* Smallest product that tries it: below a few ms the timing is too noisy to keep a choice
 * stable between runs (a resumed run would then round differently from the run it resumes) */
#define MM_BT_MIN_FLOPS 1e9

struct mm_shape {
	int64_t M, N, K;
	int ta, tb, dt, used;
	int acc;                         /* beta != 0: accumulates into C (timed so, see mm_tune) */
	enum mm_engine chosen;
	bool bt;                         /* auto: oneDNN on a transposed copy of B (see mm_run) */
	int impl;                        /* auto: oneDNN's implementation (mm_onednn.c), 0 or 1 */
	double tuned_s[MM_ENGINE_COUNT]; /* auto: best time of each engine on this shape */
	double tuned_bt_s;               /* auto: oneDNN with B transposed (copy included) */
	double tuned_alt_s;              /* auto: oneDNN's second implementation; 0: none */
	char impl_name[2][24];           /* auto: oneDNN's names of implementations 0 and 1 */
	double flops, seconds;           /* all calls */
	int64_t calls;
};

/* The ragged products of a family (transposes, dtype, the two sizes that stay: (N, K) when M
 * varies, (M, N) when K does), for the summary. */
#define MM_FAMILIES 64
struct mm_family {
	int64_t a, b;
	int ta, tb, dt, vary_k, used;
	double flops, seconds;
	int64_t calls;
};
static bool g_ragged_scope; /* mm_engine_ragged */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mm_family g_fam[MM_FAMILIES];
static enum mm_engine g_engine = MM_ENGINE_AUTO;
static enum mm_dtype g_dtype = MM_F32;
static int g_env_checked;
static struct mm_shape g_shapes[MM_SHAPES];
static double g_flops, g_seconds;
static bool g_warned_bf16;
/* Grow-only scratch: rounded operands (bf16 or bf16-valued floats) in 0 and 1, a transposed
 * B in 2. */
static void *g_scr[3];
static size_t g_scr_bytes[3];

int mm_engine_parse(const char *name, enum mm_engine *out)
{
	for (int i = 0; i < MM_ENGINE_COUNT; i++)
		if (strcmp(name, mm_engine_names[i]) == 0) {
			*out = (enum mm_engine)i;
			return 0;
		}
	return -1;
}

const char *mm_engine_name(enum mm_engine e)
{
	return e >= 0 && e < MM_ENGINE_COUNT ? mm_engine_names[e] : "?";
}

static void mm_env_override(void)
{
	if (g_env_checked)
		return;
	g_env_checked = 1;
	const char *s = getenv("CT_MATMUL_ENGINE");
	enum mm_engine e;
	if (!s || !*s)
		return;
	CHECK(mm_engine_parse(s, &e) == 0, "CT_MATMUL_ENGINE='%s' is not auto, onednn or openblas",
	      s);
	g_engine = e;
}

void mm_engine_configure(enum mm_engine e, enum mm_dtype dt)
{
	pthread_mutex_lock(&g_lock);
	g_engine = e;
	g_dtype = dt;
	g_env_checked = 0;
	mm_env_override();
	pthread_mutex_unlock(&g_lock);
}

enum mm_engine mm_engine_get(void)
{
	pthread_mutex_lock(&g_lock);
	mm_env_override();
	enum mm_engine e = g_engine;
	pthread_mutex_unlock(&g_lock);
	return e;
}

enum mm_dtype mm_engine_dtype(void)
{
	return g_dtype;
}

const char *mm_openblas_core(void)
{
	return openblas_get_corename();
}

static void *mm_scratch(int i, size_t bytes)
{
	if (bytes > g_scr_bytes[i]) {
		if (g_scr[i])
			mem_free(MEM_OTHER, g_scr[i], g_scr_bytes[i]);
		g_scr[i] = mem_alloc(MEM_OTHER, bytes);
		g_scr_bytes[i] = bytes;
	}
	return g_scr[i];
}

/* The stored rows x cols block of X (leading dimension ld) rounded to bf16, packed (ld = cols):
 * as bf16 (to_bf16) or as bf16-valued floats. */
static int64_t g_round_held, g_round_per_call; /* elements rounded (mm_bf16_round_totals) */

static void *mm_round(int slot, const float *X, int64_t rows, int64_t cols, int64_t ld,
                      bool to_bf16)
{
	g_round_per_call += rows * cols;
	void *out = mm_scratch(slot, (size_t)(rows * cols) * (to_bf16 ? 2 : 4));
	uint16_t *h = out;
	float *f = out;
#pragma omp parallel for schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const float *x = X + r * ld;
		if (to_bf16)
			for (int64_t c = 0; c < cols; c++)
				h[r * cols + c] = bf16_from_f32(x[c]);
		else
			for (int64_t c = 0; c < cols; c++)
				f[r * cols + c] = bf16_to_f32(bf16_from_f32(x[c]));
	}
	return out;
}

/* B (K x N, leading dimension ldb) transposed into packed scratch (N x K), in 32 x 32 blocks. */
static const float *mm_transpose_b(const float *B, int64_t K, int64_t N, int64_t ldb)
{
	float *bt = mm_scratch(2, (size_t)(K * N) * sizeof(float));
	const int64_t T = 32;
#pragma omp parallel for schedule(static)
	for (int64_t n0 = 0; n0 < N; n0 += T)
		for (int64_t k0 = 0; k0 < K; k0 += T) {
			int64_t n1 = n0 + T < N ? n0 + T : N, k1 = k0 + T < K ? k0 + T : K;
			for (int64_t n = n0; n < n1; n++)
				for (int64_t k = k0; k < k1; k++)
					bt[n * K + k] = B[k * ldb + n];
		}
	return bt;
}

/* bf16 twins: float buffers with a bf16 copy of the same layout (mm_bf16_twin_add). Read and
 * changed with g_lock held (mm_run runs under it). */
#define MM_TWINS 64
static struct {
	const float *w;
	const uint16_t *w16;
	int64_t n;
} g_twin[MM_TWINS];
static int g_n_twin;

void mm_bf16_twin_add(const float *w, const uint16_t *w16, int64_t n)
{
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < g_n_twin; i++)
		CHECK(g_twin[i].w != w, "mm_engine: bf16 twin of %p added twice", (const void *)w);
	CHECK(g_n_twin < MM_TWINS, "mm_engine: more than %d bf16 twins", MM_TWINS);
	g_twin[g_n_twin].w = w;
	g_twin[g_n_twin].w16 = w16;
	g_twin[g_n_twin].n = n;
	g_n_twin++;
	pthread_mutex_unlock(&g_lock);
}

void mm_bf16_twin_remove(const float *w)
{
	pthread_mutex_lock(&g_lock);
	for (int i = 0; i < g_n_twin; i++)
		if (g_twin[i].w == w) {
			g_twin[i] = g_twin[--g_n_twin];
			break;
		}
	pthread_mutex_unlock(&g_lock);
}

/* The bf16 copy of the stored rows x cols block of X (leading dimension ld), or NULL when X
 * has no twin covering all of it. */
static const uint16_t *mm_twin_of(const float *X, int64_t rows, int64_t cols, int64_t ld)
{
	for (int i = 0; i < g_n_twin; i++) {
		const float *w = g_twin[i].w;
		if (X >= w && X + (rows - 1) * ld + cols <= w + g_twin[i].n)
			return g_twin[i].w16 + (X - w);
	}
	return NULL;
}

/* Held activations (mm_bf16_hold): grow-only bf16 buffers, each the twin of one float
 * buffer while held. Used by the compute thread only. */
static struct {
	const float *x;
	uint16_t *h;
	size_t bytes;
} g_hold[MM_HOLDS];

bool mm_bf16_hold(const float *x, int64_t n)
{
	pthread_mutex_lock(&g_lock);
	mm_env_override();
	bool useful = g_dtype == MM_BF16 && g_engine != MM_ENGINE_OPENBLAS && !g_warned_bf16 &&
	              n > 0 && !mm_twin_of(x, 1, n, n);
	pthread_mutex_unlock(&g_lock);
	if (!useful)
		return false;
	int s = -1;
	for (int i = 0; i < MM_HOLDS; i++) {
		CHECK(g_hold[i].x != x, "mm_engine: %p held twice", (const void *)x);
		if (s < 0 && !g_hold[i].x)
			s = i;
	}
	CHECK(s >= 0, "mm_engine: more than %d operands held", MM_HOLDS);
	size_t bytes = (size_t)n * sizeof(uint16_t);
	if (bytes > g_hold[s].bytes) {
		if (g_hold[s].h)
			mem_free(MEM_ACTIVATIONS, g_hold[s].h, g_hold[s].bytes);
		g_hold[s].h = mem_alloc(MEM_ACTIVATIONS, bytes);
		g_hold[s].bytes = bytes;
	}
	uint16_t *h = g_hold[s].h;
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		h[i] = bf16_from_f32(x[i]);
	g_hold[s].x = x;
	g_round_held += n;
	mm_bf16_twin_add(x, h, n);
	return true;
}

void mm_bf16_release(const float *x)
{
	for (int i = 0; i < MM_HOLDS; i++)
		if (g_hold[i].x == x) {
			mm_bf16_twin_remove(x);
			g_hold[i].x = NULL;
		}
}

void mm_bf16_round_totals(int64_t *held, int64_t *per_call)
{
	pthread_mutex_lock(&g_lock);
	*held = g_round_held;
	*per_call = g_round_per_call;
	pthread_mutex_unlock(&g_lock);
}

/* One call on one engine, the engine mutex held. bf16 operands: rounded here, or taken from
 * their bf16 twin (the same values: a twin holds the operand rounded once). bt (fp32, oneDNN,
 * B not transposed): B is copied transposed and oneDNN runs the B-transposed product, whose
 * kernel is faster at some backward shapes (dx = dy W) by more than the copy costs; impl:
 * oneDNN's implementation (0: its own first choice, 1: the next one, mm_onednn.c). Auto times
 * both per shape (mm_tune). Returns false when the oneDNN variant asked for could not run here
 * and another path computed the product (the same result, up to rounding). */
/* oneDNN, on a fixed-size primitive or (rag 1: M varies, 2: K varies) a run-time-size one,
 * which has only implementation 0 */
static int g_rag;
static int mm_dnn(enum mm_dtype dt, int impl, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C,
                  int64_t ldc)
{
	if (!g_rag)
		return mm_onednn_gemm(dt, impl, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
	if (impl > 0)
		return -1;
	return mm_onednn_gemm_ragged(dt, g_rag == 2, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

static bool mm_run(enum mm_engine e, bool bt, int impl, bool ta, bool tb, int64_t M, int64_t N,
                   int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                   float *C, int64_t ldc)
{
	int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
	if (g_dtype == MM_BF16) {
		if (e == MM_ENGINE_ONEDNN) {
			const uint16_t *ta16 = mm_twin_of(A, ar, ac, lda);
			const uint16_t *tb16 = mm_twin_of(B, br, bc, ldb);
			const void *a =
			    ta16 ? (const void *)ta16 : mm_round(0, A, ar, ac, lda, true);
			const void *b =
			    tb16 ? (const void *)tb16 : mm_round(1, B, br, bc, ldb, true);
			int64_t la = ta16 ? lda : ac, lb = tb16 ? ldb : bc;
			if (impl > 0 && mm_dnn(MM_BF16, impl, ta, tb, M, N, K, a, la, b, lb,
			                               beta, C, ldc) == 0)
				return true;
			int rc =
			    mm_dnn(MM_BF16, 0, ta, tb, M, N, K, a, la, b, lb, beta, C, ldc);
			if (rc == 0)
				return impl == 0;
			if (rc == -1 && !g_warned_bf16) {
				g_warned_bf16 = true;
				LOG_WARN(
				    "oneDNN cannot run bf16 matmuls on this CPU (%s): bf16 compute "
				    "runs as bf16-rounded operands through fp32 kernels (same "
				    "numerics, fp32 speed)",
				    mm_onednn_isa());
			}
		}
		A = mm_round(0, A, ar, ac, lda, false);
		B = mm_round(1, B, br, bc, ldb, false);
		lda = ac;
		ldb = bc;
	}
	if (e == MM_ENGINE_ONEDNN && bt && !tb && g_dtype == MM_F32 &&
	    mm_dnn(MM_F32, 0, ta, true, M, N, K, A, lda, mm_transpose_b(B, K, N, ldb), K,
	                   beta, C, ldc) == 0)
		return true;
	if (e == MM_ENGINE_ONEDNN && impl > 0 &&
	    mm_dnn(MM_F32, impl, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc) == 0)
		return true;
	if (e == MM_ENGINE_ONEDNN &&
	    mm_dnn(MM_F32, 0, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc) == 0)
		return !bt && impl == 0;
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
	            (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
	return e == MM_ENGINE_OPENBLAS;
}

/* auto's candidates on a shape: oneDNN's first and second implementation, oneDNN on a
 * transposed B, OpenBLAS. */
enum { CAND_ONEDNN, CAND_ONEDNN_ALT, CAND_ONEDNN_BT, CAND_OPENBLAS, CAND_COUNT };

static bool mm_cand_run(int c, const struct mm_shape *s, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float *out)
{
	return mm_run(c == CAND_OPENBLAS ? MM_ENGINE_OPENBLAS : MM_ENGINE_ONEDNN,
	              c == CAND_ONEDNN_BT, c == CAND_ONEDNN_ALT, s->ta, s->tb, s->M, s->N, s->K, A,
	              lda, B, ldb, s->acc ? 1.0f : 0.0f, out, s->N);
}

static bool mm_env_is(const char *name)
{
	const char *v = getenv(name);
	return v && strcmp(v, "1") == 0;
}

/* auto: time the candidates on this shape (into scratch output, with the shape's beta: oneDNN's
 * brgemm runs beta = 1 as a sum post-op, 15-30% slower than its jit sgemm's own beta on the
 * 125M model's accumulating products here, and equal or faster at beta = 0) and keep the
 * fastest. oneDNN's second implementation and oneDNN on a transposed B (fp32 products of
 * >= 1 GFLOP with B not transposed only) are kept when >= 10% faster than the incumbent
 * (oneDNN's first choice, or its jit sgemm, below), and OpenBLAS when
 * >= 15% faster than the best oneDNN variant, so that the choice is stable between runs. */
static void mm_tune(struct mm_shape *s, const float *A, int64_t lda, const float *B, int64_t ldb)
{
	int64_t M = s->M, N = s->N;
	size_t bytes = (size_t)(M * N) * sizeof(float);
	float *tmp = mem_alloc(MEM_OTHER, bytes);
	/* tests: the bt path, or oneDNN's second implementation, on every shape that has it */
	bool force_bt = mm_env_is("CT_MATMUL_FORCE_BT"),
	     force_alt = mm_env_is("CT_MATMUL_FORCE_IMPL");
	bool on[CAND_COUNT] = {true, true, false, true};
	on[CAND_ONEDNN_BT] =
	    !s->tb && g_dtype == MM_F32 && s->K * N <= MM_BT_MAX &&
	    (force_bt || 2.0 * (double)M * (double)N * (double)s->K >= MM_BT_MIN_FLOPS);
	double best[CAND_COUNT];
	for (int c = 0; c < CAND_COUNT; c++) {
		best[c] = 1e30;
		if (!on[c])
			continue;
		bool ran = mm_cand_run(c, s, A, lda, B, ldb, tmp); /* builds the primitive */
		if (c <= CAND_ONEDNN_ALT && ran)
			snprintf(s->impl_name[c], sizeof(s->impl_name[c]), "%s",
			         mm_onednn_last_impl());
		if (c == CAND_ONEDNN_ALT)
			on[c] = ran; /* oneDNN offers one implementation only */
	}
	double budget = timer_now() + 0.2;
	for (int r = 0; r < 5 && (r < 1 || timer_now() < budget); r++)
		for (int c = 0; c < CAND_COUNT; c++) {
			if (!on[c])
				continue;
			double t = timer_now();
			mm_cand_run(c, s, A, lda, B, ldb, tmp);
			t = timer_now() - t;
			if (t < best[c])
				best[c] = t;
		}
	mem_free(MEM_OTHER, tmp, bytes);
	s->tuned_s[MM_ENGINE_ONEDNN] = best[CAND_ONEDNN];
	s->tuned_s[MM_ENGINE_OPENBLAS] = best[CAND_OPENBLAS];
	s->tuned_bt_s = on[CAND_ONEDNN_BT] ? best[CAND_ONEDNN_BT] : 0;
	s->tuned_alt_s = on[CAND_ONEDNN_ALT] ? best[CAND_ONEDNN_ALT] : 0;
	/* the incumbent: oneDNN's first choice, or its jit sgemm where that comes second (after
	 * brgemm, oneDNN 2.6 on AVX-512): at near-ties in these timings the jit sgemm made whole
	 * 125M steps 2-9% faster on a Zen 5 EPYC, fp32 and bf16, partly outside the products'
	 * own time (README, Compute engines), which no per-product timing sees */
	int inc = on[CAND_ONEDNN_ALT] && strncmp(s->impl_name[1], "gemm:jit", 8) == 0 &&
	                  strncmp(s->impl_name[0], "brg:", 4) == 0
	              ? CAND_ONEDNN_ALT
	              : CAND_ONEDNN;
	int pick = inc;
	for (int c = CAND_ONEDNN; c <= CAND_ONEDNN_BT; c++)
		if (c != inc && on[c] && best[c] * 1.10 < best[inc] && best[c] < best[pick])
			pick = c;
	s->bt = pick == CAND_ONEDNN_BT;
	s->impl = pick == CAND_ONEDNN_ALT;
	s->chosen = best[CAND_OPENBLAS] * 1.15 < best[pick] ? MM_ENGINE_OPENBLAS : MM_ENGINE_ONEDNN;
	if (s->chosen != MM_ENGINE_ONEDNN)
		s->bt = false, s->impl = 0;
	if (on[CAND_ONEDNN_BT] && force_bt)
		s->chosen = MM_ENGINE_ONEDNN, s->bt = true, s->impl = 0;
	if (on[CAND_ONEDNN_ALT] && force_alt)
		s->chosen = MM_ENGINE_ONEDNN, s->bt = false, s->impl = 1;
}

int mm_engine_bt_shapes(void)
{
	pthread_mutex_lock(&g_lock);
	int n = 0;
	for (int64_t i = 0; i < MM_SHAPES; i++)
		n += g_shapes[i].used && g_shapes[i].bt;
	pthread_mutex_unlock(&g_lock);
	return n;
}

int mm_engine_alt_impl_shapes(void)
{
	pthread_mutex_lock(&g_lock);
	int n = 0;
	for (int64_t i = 0; i < MM_SHAPES; i++)
		n += g_shapes[i].used && g_shapes[i].impl > 0;
	pthread_mutex_unlock(&g_lock);
	return n;
}

static struct mm_shape *mm_shape_find(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                      bool acc)
{
	uint64_t h = ((uint64_t)M * 1000003u) ^ ((uint64_t)N * 8191u) ^ ((uint64_t)K * 131u) ^
	             (uint64_t)(ta * 2 + tb) ^ ((uint64_t)g_dtype << 3) ^ ((uint64_t)acc << 5);
	for (int64_t i = 0; i < MM_SHAPES; i++) {
		struct mm_shape *s = &g_shapes[(h + (uint64_t)i) % MM_SHAPES];
		if (!s->used) {
			*s = (struct mm_shape){.M = M,
			                       .N = N,
			                       .K = K,
			                       .ta = ta,
			                       .tb = tb,
			                       .dt = g_dtype,
			                       .acc = acc,
			                       .used = 1,
			                       .chosen = MM_ENGINE_COUNT};
			return s;
		}
		if (s->M == M && s->N == N && s->K == K && s->ta == ta && s->tb == tb &&
		    s->dt == (int)g_dtype && s->acc == acc)
			return s;
	}
	return NULL; /* more shapes than slots: not tracked */
}

static struct mm_family *mm_family_find(bool ta, bool tb, int64_t a, int64_t b, int vary_k)
{
	uint64_t h = ((uint64_t)a * 1000003u) ^ ((uint64_t)b * 8191u) ^ (uint64_t)(ta * 2 + tb) ^
	             ((uint64_t)g_dtype << 3) ^ ((uint64_t)vary_k << 5);
	for (int64_t i = 0; i < MM_FAMILIES; i++) {
		struct mm_family *f = &g_fam[(h + (uint64_t)i) % MM_FAMILIES];
		if (!f->used) {
			*f = (struct mm_family){.a = a, .b = b, .ta = ta, .tb = tb, .dt = g_dtype,
			                        .vary_k = vary_k, .used = 1};
			return f;
		}
		if (f->a == a && f->b == b && f->ta == ta && f->tb == tb && f->dt == (int)g_dtype &&
		    f->vary_k == vary_k)
			return f;
	}
	return NULL;
}

int mm_engine_ragged_families(void)
{
	pthread_mutex_lock(&g_lock);
	int n = 0;
	for (int64_t i = 0; i < MM_FAMILIES; i++)
		n += g_fam[i].used;
	pthread_mutex_unlock(&g_lock);
	return n;
}

void mm_engine_ragged(bool on)
{
	pthread_mutex_lock(&g_lock);
	g_ragged_scope = on;
	pthread_mutex_unlock(&g_lock);
}

/* A ragged product: no per-size tracking or timing; oneDNN's run-time-size primitive (unless
 * OpenBLAS is forced), OpenBLAS where oneDNN cannot. */
static void mm_gemm_ragged(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                           int64_t ldc)
{
	struct mm_family *f = ta ? mm_family_find(ta, tb, M, N, 1) : mm_family_find(ta, tb, N, K, 0);
	static struct mm_family spare; /* the summary's table is full: counted nowhere */
	if (!f)
		f = &spare;
	double t = timer_now();
	g_rag = ta ? 2 : 1;
	mm_run(g_engine == MM_ENGINE_OPENBLAS ? MM_ENGINE_OPENBLAS : MM_ENGINE_ONEDNN, false, 0, ta,
	       tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
	g_rag = 0;
	t = timer_now() - t;
	double fl = 2.0 * (double)M * (double)N * (double)K;
	g_flops += fl, g_seconds += t;
	f->flops += fl, f->seconds += t, f->calls++;
}

void mm_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
             const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
	if (M <= 0 || N <= 0)
		return;
	pthread_mutex_lock(&g_lock);
	mm_env_override();
	if (g_ragged_scope && K > 0) {
		mm_gemm_ragged(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
		pthread_mutex_unlock(&g_lock);
		return;
	}
	struct mm_shape *s = mm_shape_find(ta, tb, M, N, K, beta != 0.0f);
	enum mm_engine e = g_engine;
	if (s && s->chosen == MM_ENGINE_COUNT) {
		if (e == MM_ENGINE_AUTO && K > 0)
			mm_tune(s, A, lda, B, ldb);
		else
			s->chosen = e == MM_ENGINE_AUTO ? MM_ENGINE_ONEDNN : e;
	}
	bool bt = e == MM_ENGINE_AUTO && s && s->bt;
	int impl = e == MM_ENGINE_AUTO && s ? s->impl : 0;
	if (e == MM_ENGINE_AUTO)
		e = s ? s->chosen : MM_ENGINE_ONEDNN;
	double t = timer_now();
	if (K <= 0) {
		if (beta == 0.0f)
			for (int64_t i = 0; i < M; i++)
				memset(C + i * ldc, 0, (size_t)N * sizeof(float));
	} else {
		mm_run(e, bt, impl, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
	}
	t = timer_now() - t;
	double fl = 2.0 * (double)M * (double)N * (double)K;
	g_flops += fl;
	g_seconds += t;
	if (s) {
		s->flops += fl;
		s->seconds += t;
		s->calls++;
	}
	pthread_mutex_unlock(&g_lock);
}

static void mm_cpu_line(char *buf, size_t n)
{
	const struct cpu_info *c = cpu_info();
	snprintf(buf, n, "cpu %s | avx2 %d avx512 %d avx512_bf16 %d amx_bf16 %d | onednn %s",
	         c->brand, c->avx2, c->avx512, c->avx512_bf16, c->amx_bf16, mm_onednn_isa());
}

int mm_engine_choices_write(FILE *f)
{
	char cpu[256];
	mm_cpu_line(cpu, sizeof(cpu));
	pthread_mutex_lock(&g_lock);
	int n = 0;
	fprintf(f, "ctitan matmul choices v2\n%s\n", cpu);
	for (int64_t i = 0; i < MM_SHAPES; i++) {
		const struct mm_shape *s = &g_shapes[i];
		if (!s->used || s->chosen == MM_ENGINE_COUNT || s->K <= 0)
			continue;
		fprintf(f, "%lld %lld %lld %d %d %d %d %d %d %d\n", (long long)s->M,
		        (long long)s->N, (long long)s->K, s->ta, s->tb, s->dt, s->acc,
		        (int)s->chosen, (int)s->bt, s->impl);
		n++;
	}
	pthread_mutex_unlock(&g_lock);
	return n;
}

int mm_engine_choices_read(FILE *f)
{
	char line[512], cpu[256];
	mm_cpu_line(cpu, sizeof(cpu));
	if (!fgets(line, sizeof(line), f))
		return -1;
	if (strcmp(line, "ctitan matmul choices v1\n") == 0)
		return 0; /* an older ctitan's, keyed without beta: timed again */
	if (strcmp(line, "ctitan matmul choices v2\n") != 0)
		return -1;
	if (!fgets(line, sizeof(line), f))
		return -1;
	line[strcspn(line, "\n")] = 0;
	if (strcmp(line, cpu) != 0)
		return 0;
	struct mm_shape got[MM_SHAPES];
	int n = 0;
	while (fgets(line, sizeof(line), f)) {
		long long M, N, K;
		int ta, tb, dt, acc, e, bt, impl;
		if (n == MM_SHAPES ||
		    sscanf(line, "%lld %lld %lld %d %d %d %d %d %d %d", &M, &N, &K, &ta, &tb, &dt,
		           &acc, &e, &bt, &impl) != 10 ||
		    M <= 0 || N <= 0 || K <= 0 || (ta | tb | acc | bt) & ~1 || dt < 0 ||
		    dt >= MM_DTYPE_COUNT || e <= MM_ENGINE_AUTO || e >= MM_ENGINE_COUNT || impl < 0 ||
		    impl > 1)
			return -1;
		got[n++] = (struct mm_shape){.M = M,
		                             .N = N,
		                             .K = K,
		                             .ta = ta,
		                             .tb = tb,
		                             .dt = dt,
		                             .acc = acc,
		                             .chosen = (enum mm_engine)e,
		                             .bt = bt,
		                             .impl = impl};
	}
	pthread_mutex_lock(&g_lock);
	const enum mm_dtype saved = g_dtype;
	int taken = 0;
	for (int i = 0; i < n; i++) {
		g_dtype = (enum mm_dtype)got[i].dt; /* mm_shape_find keys on the current dtype */
		struct mm_shape *s =
		    mm_shape_find(got[i].ta, got[i].tb, got[i].M, got[i].N, got[i].K, got[i].acc);
		if (!s || s->chosen != MM_ENGINE_COUNT)
			continue;
		s->chosen = got[i].chosen, s->bt = got[i].bt, s->impl = got[i].impl;
		snprintf(s->impl_name[0], sizeof(s->impl_name[0]), "kept");
		snprintf(s->impl_name[1], sizeof(s->impl_name[1]), "%s",
		         got[i].impl ? "2nd impl" : "");
		taken++;
	}
	g_dtype = saved;
	pthread_mutex_unlock(&g_lock);
	return taken;
}

void mm_engine_totals(double *flops, double *seconds)
{
	pthread_mutex_lock(&g_lock);
	*flops = g_flops;
	*seconds = g_seconds;
	pthread_mutex_unlock(&g_lock);
}

void mm_engine_log_summary(void)
{
	pthread_mutex_lock(&g_lock);
	mm_env_override();
	LOG_INFO("matmul engine %s, compute %s; oneDNN ISA %s (bf16 implementation %s), OpenBLAS "
	         "kernel %s; %.1f GFLOP/s over %.3g GFLOP of matmuls so far",
	         mm_engine_name(g_engine), g_dtype == MM_BF16 ? "bf16" : "fp32", mm_onednn_isa(),
	         mm_onednn_bf16_impl(), mm_openblas_core(),
	         g_seconds > 0 ? g_flops / g_seconds / 1e9 : 0.0, g_flops / 1e9);
	if (g_dtype == MM_BF16)
		LOG_INFO("bf16 operands rounded: %.3g M elements once per held activation, %.3g M "
		         "per call (operands without a twin)",
		         (double)g_round_held / 1e6, (double)g_round_per_call / 1e6);
	for (int64_t i = 0; i < MM_FAMILIES; i++) {
		const struct mm_family *f = &g_fam[i];
		if (f->used)
			LOG_INFO("  %c%c %s=%lld %s=%lld %s, %s varying: ragged, oneDNN run-time sizes, "
			         "%.1f GFLOP/s over %lld calls",
			         f->ta ? 'T' : 'N', f->tb ? 'T' : 'N', f->vary_k ? "M" : "N",
			         (long long)f->a, f->vary_k ? "N" : "K", (long long)f->b,
			         f->dt == MM_BF16 ? "bf16" : "fp32", f->vary_k ? "K" : "M",
			         f->seconds > 0 ? f->flops / f->seconds / 1e9 : 0.0, (long long)f->calls);
	}
	for (int64_t i = 0; i < MM_SHAPES; i++) {
		const struct mm_shape *s = &g_shapes[i];
		if (!s->used || s->chosen == MM_ENGINE_COUNT || s->K <= 0)
			continue;
		double fl = 2.0 * (double)s->M * (double)s->N * (double)s->K;
		char tuned[192] = "", bt[48] = "", alt[64] = "", chosen[48];
		if (g_engine == MM_ENGINE_AUTO && s->tuned_bt_s > 0)
			snprintf(bt, sizeof(bt), ", on B transposed %.1f",
			         fl / s->tuned_bt_s / 1e9);
		if (g_engine == MM_ENGINE_AUTO && s->tuned_alt_s > 0)
			snprintf(alt, sizeof(alt), ", %s %.1f", s->impl_name[1],
			         fl / s->tuned_alt_s / 1e9);
		if (g_engine == MM_ENGINE_AUTO && !(s->tuned_s[MM_ENGINE_ONEDNN] > 0))
			snprintf(tuned, sizeof(tuned), " (kept from this job's matmul_choices)");
		else if (g_engine == MM_ENGINE_AUTO)
			snprintf(tuned, sizeof(tuned),
			         " (tuned: onednn %s %.1f%s%s, openblas %.1f GFLOP/s)",
			         s->impl_name[0], fl / s->tuned_s[MM_ENGINE_ONEDNN] / 1e9, alt, bt,
			         fl / s->tuned_s[MM_ENGINE_OPENBLAS] / 1e9);
		snprintf(chosen, sizeof(chosen), "%s%s%s", mm_engine_name(s->chosen),
		         s->impl > 0 ? " "
		         : s->bt     ? " on B transposed"
		                     : "",
		         s->impl > 0 ? s->impl_name[1] : "");
		LOG_INFO("  %c%c M=%lld N=%lld K=%lld %s%s: %s, %.1f GFLOP/s over %lld calls%s",
		         s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', (long long)s->M, (long long)s->N,
		         (long long)s->K, s->dt == MM_BF16 ? "bf16" : "fp32", s->acc ? " C+=" : "",
		         chosen,
		         s->seconds > 0 ? s->flops / s->seconds / 1e9 : 0.0, (long long)s->calls,
		         tuned);
	}
	pthread_mutex_unlock(&g_lock);
}

/* OpenBLAS CPU-table guard. Debian 12's OpenBLAS 0.3.21 falls back to a generic kernel
 * ("Prescott": SSE3) on CPUs newer than its table, several times slower. OpenBLAS picks its
 * kernel when the library loads, before main(), and reads OPENBLAS_CORETYPE only then; so when
 * the kernel it picked is below what this CPU's features allow, we set OPENBLAS_CORETYPE and
 * re-execute this same program (execv keeps the process id, so MPI launchers are unaffected).
 * A user-set OPENBLAS_CORETYPE is respected. Runs as a constructor so every binary linking the
 * engine (ctitan, the tests, the benchmarks) gets it before any MPI or OpenMP start-up. */
static int mm_core_tier(const char *core)
{
	static const char *const t3[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
	static const char *const t2[] = {"Haswell", "Zen", "Excavator"};
	static const char *const t1[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"};
	for (size_t i = 0; i < sizeof(t3) / sizeof(t3[0]); i++)
		if (strcasecmp(core, t3[i]) == 0)
			return 3;
	for (size_t i = 0; i < sizeof(t2) / sizeof(t2[0]); i++)
		if (strcasecmp(core, t2[i]) == 0)
			return 2;
	for (size_t i = 0; i < sizeof(t1) / sizeof(t1[0]); i++)
		if (strcasecmp(core, t1[i]) == 0)
			return 1;
	return 0; /* Prescott, Core2, Nehalem, Atom, Barcelona, ...: SSE kernels */
}

/* The OpenBLAS kernel to select when OpenBLAS picked a generic (SSE or AVX1) one on a CPU with
 * AVX2 or AVX-512; NULL when its choice stands. Conservative on AMD: the AVX2 "Zen" kernel,
 * since AVX-512 kernels of older OpenBLAS builds are known to misbehave on some AMD parts. */
const char *mm_openblas_wanted_core(const struct cpu_info *c, const char *current)
{
	if (mm_core_tier(current) >= 2)
		return NULL;
	bool amd = strcmp(c->vendor, "AuthenticAMD") == 0;
	if (c->avx512 && !amd)
		return c->avx512_bf16 ? "Cooperlake" : "SkylakeX";
	if (c->avx2)
		return amd ? "Zen" : "Haswell";
	return NULL;
}

__attribute__((constructor)) static void mm_openblas_guard(int argc, char **argv)
{
	(void)argc;
	const char *user = getenv("OPENBLAS_CORETYPE");
	if ((user && *user) || getenv("CT_OPENBLAS_GUARD_DONE") || !argv || !argv[0])
		return;
	/* tests only: pretend OpenBLAS picked this kernel, to exercise the re-exec */
	const char *assume = getenv("CT_OPENBLAS_GUARD_ASSUME");
	const char *core = assume && *assume ? assume : openblas_get_corename();
	const char *want = core ? mm_openblas_wanted_core(cpu_info(), core) : NULL;
	if (!want)
		return;
	setenv("OPENBLAS_CORETYPE", want, 1);
	setenv("CT_OPENBLAS_GUARD_DONE", core, 1); /* never loop; says what OpenBLAS picked */
	fprintf(stderr,
	        "ctitan: OpenBLAS chose its generic '%s' kernel on this CPU; restarting "
	        "with OPENBLAS_CORETYPE=%s\n",
	        core, want);
	execv("/proc/self/exe", argv);
	/* exec failed: carry on with the generic kernel */
	unsetenv("OPENBLAS_CORETYPE");
}
