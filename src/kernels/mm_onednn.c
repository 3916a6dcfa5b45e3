/* kernels/mm_onednn: oneDNN matmul primitives (C API), one per (dtype, transposes, M, N, K,
 * leading dimensions, beta, implementation), created on first use and kept for the process;
 * for ragged products (mm_onednn_gemm_ragged) one per (dtype, transposes, the two fixed sizes,
 * beta) with the varying size and the leading dimensions given at each call (oneDNN's runtime
 * dimensions), so that a new token count creates no primitive.
 * Implementation 0 is oneDNN's own first choice; implementation k >= 1 is the k-th other one
 * it offers for the problem, reference (ref:*) implementations skipped — on AVX-512 CPUs
 * oneDNN 2.6 prefers its brgemm matmul (brg:*), and its jit sgemm (gemm:jit) comes next, which
 * is 10-30% faster at several backward shapes of the 125M model. Called with the engine mutex
 * held (mm_engine.c), so the cache and the memory objects need no lock of their own. */
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/mm_engine.h"

#define MMD_CACHE 512 /* open addressing; a model uses a few dozen shapes */

struct mmd_key {
	int64_t M, N, K, lda, ldb, ldc; /* DNNL_RUNTIME_DIM_VAL: given at each call (rt) */
	int dt, ta, tb, acc, impl, rt;
};

struct mmd_entry {
	struct mmd_key key;
	int used;
	int ok; /* 0: this shape/dtype cannot run here */
	dnnl_primitive_t prim;
	dnnl_memory_t a, b, c;
	char impl[40]; /* oneDNN's name of the implementation, e.g. "brg:avx512_core" */
};

static struct mmd_entry g_cache[MMD_CACHE];
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static int g_init; /* 0 not yet, 1 ok, -1 failed */
static char g_bf16_impl[64] = "not probed";
static const char *g_last_impl = "";

static bool mmd_init(void)
{
	if (g_init)
		return g_init > 0;
	g_init = -1;
	if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success)
		return false;
	if (dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags) != dnnl_success)
		return false;
	g_init = 1;
	return true;
}

static uint64_t mmd_hash(const struct mmd_key *k)
{
	const unsigned char *p = (const unsigned char *)k;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < sizeof(*k); i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static bool mmd_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, bool trans, int64_t ld,
                   dnnl_data_type_t dt)
{
	dnnl_dims_t dims = {rows, cols};
	dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
	return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides) == dnnl_success;
}

/* The primitive descriptor of implementation `impl` (see the top of this file) into *pd; false
 * when oneDNN offers no such implementation. oneDNN 2.6's iterator can list an implementation
 * twice (once a primitive of it exists, the cached one comes first, then the list from the
 * start), so implementations are counted by distinct name. */
static bool mmd_pick(dnnl_primitive_desc_t *pd, const dnnl_matmul_desc_t *desc,
                     const_dnnl_primitive_attr_t attr, int impl)
{
	enum { SEEN_MAX = 8 };
	char seen_name[SEEN_MAX][40];
	int seen = 0;
	dnnl_primitive_desc_iterator_t it = NULL;
	*pd = NULL;
	if (dnnl_primitive_desc_iterator_create(&it, desc, attr, g_engine, NULL) != dnnl_success)
		return false;
	for (int n = 0; n < 4 * SEEN_MAX && seen < SEEN_MAX; n++) {
		dnnl_primitive_desc_t cand = dnnl_primitive_desc_iterator_fetch(it);
		if (!cand)
			break;
		const char *name = NULL;
		if (dnnl_primitive_desc_query(cand, dnnl_query_impl_info_str, 0, &name) !=
		        dnnl_success ||
		    !name)
			name = "?";
		bool known = false;
		for (int i = 0; i < seen; i++)
			known = known || strcmp(seen_name[i], name) == 0;
		if (!known && (seen == 0 || strncmp(name, "ref", 3) != 0)) {
			if (seen == impl) {
				*pd = cand;
				break;
			}
			snprintf(seen_name[seen++], sizeof(seen_name[0]), "%s", name);
		}
		dnnl_primitive_desc_destroy(cand);
		if (dnnl_primitive_desc_iterator_next(it) != dnnl_success)
			break;
	}
	dnnl_primitive_desc_iterator_destroy(it);
	return *pd != NULL;
}

static void mmd_build(struct mmd_entry *e)
{
	const struct mmd_key *k = &e->key;
	dnnl_data_type_t in = k->dt == MM_BF16 ? dnnl_bf16 : dnnl_f32;
	dnnl_memory_desc_t a, b, c;
	dnnl_matmul_desc_t desc;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	const char *name = NULL;
	e->ok = 0;
	if (!mmd_md(&a, k->M, k->K, k->ta, k->lda, in) || !mmd_md(&b, k->K, k->N, k->tb, k->ldb, in) ||
	    !mmd_md(&c, k->M, k->N, false, k->ldc, dnnl_f32))
		return;
	/* runtime sizes: memory objects are made at each call, with the call's sizes */
	if (dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c) != dnnl_success)
		return;
	if (dnnl_primitive_attr_create(&attr) != dnnl_success)
		return;
	if (k->acc) {
		if (dnnl_post_ops_create(&po) != dnnl_success || dnnl_post_ops_append_sum(po, 1.0f) ||
		    dnnl_primitive_attr_set_post_ops(attr, po))
			goto out;
	}
	if (!mmd_pick(&pd, &desc, attr, k->impl)) {
		if (k->dt == MM_BF16 && k->impl == 0)
			snprintf(g_bf16_impl, sizeof(g_bf16_impl), "none");
		goto out;
	}
	if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) != dnnl_success ||
	    !name)
		name = "?";
	snprintf(e->impl, sizeof(e->impl), "%s", name);
	if (k->dt == MM_BF16 && k->impl == 0)
		snprintf(g_bf16_impl, sizeof(g_bf16_impl), "%s", name);
	if (dnnl_primitive_create(&e->prim, pd) != dnnl_success)
		goto out;
	if (!k->rt && (dnnl_memory_create(&e->a, &a, g_engine, DNNL_MEMORY_NONE) ||
	               dnnl_memory_create(&e->b, &b, g_engine, DNNL_MEMORY_NONE) ||
	               dnnl_memory_create(&e->c, &c, g_engine, DNNL_MEMORY_NONE)))
		goto out;
	e->ok = 1;
out:
	if (pd)
		dnnl_primitive_desc_destroy(pd);
	if (po)
		dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
}

/* The cache entry of key (built on first use); NULL when the cache is full. */
static struct mmd_entry *mmd_find(const struct mmd_key *key)
{
	uint64_t h = mmd_hash(key);
	for (int64_t i = 0; i < MMD_CACHE; i++) {
		struct mmd_entry *x = &g_cache[(h + (uint64_t)i) % MMD_CACHE];
		if (!x->used) {
			x->used = 1;
			x->key = *key;
			mmd_build(x);
			return x;
		}
		if (memcmp(&x->key, key, sizeof(*key)) == 0)
			return x;
	}
	return NULL;
}

static int mmd_gemm(enum mm_dtype dt, int impl, int rt, bool ta, bool tb, int64_t M, int64_t N,
                    int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                    float *C, int64_t ldc)
{
	if (!mmd_init())
		return -1;
	struct mmd_key key;
	memset(&key, 0, sizeof(key)); /* hashed bytewise: padding must be zero */
	const int64_t R = DNNL_RUNTIME_DIM_VAL;
	key.M = rt == 1 ? R : M, key.N = N, key.K = rt == 2 ? R : K;
	key.lda = rt ? R : lda, key.ldb = rt ? R : ldb, key.ldc = rt ? R : ldc;
	key.dt = (int)dt, key.ta = ta, key.tb = tb, key.acc = beta != 0.0f, key.impl = impl;
	key.rt = rt;
	struct mmd_entry *e = mmd_find(&key);
	if (!e) /* more shapes than the cache holds (long generation sessions): OpenBLAS */
		return -2;
	if (!e->ok)
		return -1;
	g_last_impl = e->impl;
	dnnl_memory_t ma = e->a, mb = e->b, mc = e->c;
	if (rt) { /* this call's sizes */
		dnnl_data_type_t in = dt == MM_BF16 ? dnnl_bf16 : dnnl_f32;
		dnnl_memory_desc_t a, b, c;
		CHECK(mmd_md(&a, M, K, ta, lda, in) && mmd_md(&b, K, N, tb, ldb, in) &&
		          mmd_md(&c, M, N, false, ldc, dnnl_f32) &&
		          dnnl_memory_create(&ma, &a, g_engine, (void *)A) == dnnl_success &&
		          dnnl_memory_create(&mb, &b, g_engine, (void *)B) == dnnl_success &&
		          dnnl_memory_create(&mc, &c, g_engine, C) == dnnl_success,
		      "oneDNN matmul %lldx%lldx%lld: memory objects", (long long)M, (long long)N,
		      (long long)K);
	} else {
		dnnl_memory_set_data_handle(ma, (void *)A);
		dnnl_memory_set_data_handle(mb, (void *)B);
		dnnl_memory_set_data_handle(mc, C);
	}
	dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
	dnnl_status_t st = dnnl_primitive_execute(e->prim, g_stream, 3, args);
	CHECK(st == dnnl_success, "oneDNN matmul %lldx%lldx%lld failed (status %d)", (long long)M,
	      (long long)N, (long long)K, (int)st);
	dnnl_stream_wait(g_stream);
	if (rt)
		dnnl_memory_destroy(ma), dnnl_memory_destroy(mb), dnnl_memory_destroy(mc);
	return 0;
}

int mm_onednn_gemm(enum mm_dtype dt, int impl, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C,
                   int64_t ldc)
{
	return mmd_gemm(dt, impl, 0, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

int mm_onednn_gemm_ragged(enum mm_dtype dt, bool vary_k, bool ta, bool tb, int64_t M, int64_t N,
                          int64_t K, const void *A, int64_t lda, const void *B, int64_t ldb,
                          float beta, float *C, int64_t ldc)
{
	return mmd_gemm(dt, 0, vary_k ? 2 : 1, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

const char *mm_onednn_isa(void)
{
	switch (dnnl_get_effective_cpu_isa()) {
	case dnnl_cpu_isa_sse41: return "sse41";
	case dnnl_cpu_isa_avx: return "avx";
	case dnnl_cpu_isa_avx2: return "avx2";
	case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
	case dnnl_cpu_isa_avx512_core: return "avx512_core";
	case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
	case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
	case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
	default: return "other";
	}
}

const char *mm_onednn_last_impl(void)
{
	return g_last_impl;
}

const char *mm_onednn_bf16_impl(void)
{
	return g_bf16_impl;
}
