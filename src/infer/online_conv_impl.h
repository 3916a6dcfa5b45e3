/* infer/online_conv_impl.h: the body of infer/online_conv, written once over OC_REAL and
 * included twice by online_conv.c (float + fftwf_, double + fftw_), the same twin scheme as
 * kernels/kreal.h. Not a public header: no include guard on purpose. Every name defined here
 * goes through OC_S() so the two instantiations do not collide.
 *
 * Expects: OC_REAL (float|double), OC_S(name) (name##_f32|_f64), OC_FFTW(name)
 * (fftwf_##name|fftw_##name).
 */

typedef OC_REAL OC_S(oc_real);
typedef OC_FFTW(complex) OC_S(oc_cpx);
typedef OC_FFTW(plan) OC_S(oc_plan);

#define OC_MAX_LOG 48

struct OC_S(oc_engine) {
	struct oc_config cfg;
	int64_t G;  /* generated positions: L - P */
	int64_t r;  /* current generated position (relative) */
	int64_t Lr; /* reversed taps kept per (conv, channel) */
	int64_t nthreads;
	uint8_t *red_done;    /* (nconv): red cell done at r */
	uint8_t *prompt_done; /* (nconv) */
	OC_S(oc_real) * y;    /* (nconv, B, C, G) inputs, channel-major */
	OC_S(oc_real) * acc;  /* (nconv, B, C, G) sums over past inputs */
	OC_S(oc_real) * rho0; /* (nconv, C) */
	OC_S(oc_real) * rf;   /* (nconv, C, L) forward taps, or NULL */
	OC_S(oc_real) * rr;   /* (nconv, C, Lr) reversed taps: rr[Lr-1-m] = rho[m], or NULL */
	/* flash: per level q (U = 2^q), spectra of rho[0..2U-1] / (2U), (nconv, C, U+1) */
	int nlev;
	OC_S(oc_cpx) * ghat[OC_MAX_LOG];
	/* FFTW plans of size 2^k, out of place between a real buffer and a complex one */
	OC_S(oc_plan) fwd[OC_MAX_LOG], inv[OC_MAX_LOG];
	/* per-thread scratch, fftw_malloc'd (every array of a plan has the same alignment) */
	int64_t scratch_n;               /* reals per buffer */
	OC_S(oc_real) * *sbuf;           /* (nthreads)[scratch_n] */
	OC_S(oc_cpx) * *sspec, **sspec2; /* (nthreads)[scratch_n/2+1] */
	size_t bytes;
};

static int OC_S(oc_log2)(int64_t n)
{
	int k = 0;
	while (((int64_t)1 << k) < n)
		k++;
	return k;
}

static void *OC_S(oc_alloc)(struct OC_S(oc_engine) * e, size_t n, size_t size)
{
	e->bytes += n * size;
	return xcalloc(n ? n : 1, size);
}

/* Scratch of n reals (and n/2+1 complex, twice) per thread; grows, never shrinks. */
static void OC_S(oc_scratch)(struct OC_S(oc_engine) * e, int64_t n)
{
	if (n <= e->scratch_n)
		return;
	for (int64_t t = 0; t < e->nthreads; t++) {
		if (e->sbuf[t]) {
			OC_FFTW(free)(e->sbuf[t]);
			OC_FFTW(free)(e->sspec[t]);
			OC_FFTW(free)(e->sspec2[t]);
		}
		e->sbuf[t] = OC_FFTW(malloc)((size_t)n * sizeof(OC_S(oc_real)));
		e->sspec[t] = OC_FFTW(malloc)((size_t)(n / 2 + 1) * sizeof(OC_S(oc_cpx)));
		e->sspec2[t] = OC_FFTW(malloc)((size_t)(n / 2 + 1) * sizeof(OC_S(oc_cpx)));
		CHECK(e->sbuf[t] && e->sspec[t] && e->sspec2[t], "online_conv: out of memory");
	}
	if (e->scratch_n > 0)
		e->bytes -= (size_t)e->nthreads *
		            ((size_t)e->scratch_n * sizeof(OC_S(oc_real)) +
		             2 * (size_t)(e->scratch_n / 2 + 1) * sizeof(OC_S(oc_cpx)));
	e->bytes += (size_t)e->nthreads * ((size_t)n * sizeof(OC_S(oc_real)) +
	                                   2 * (size_t)(n / 2 + 1) * sizeof(OC_S(oc_cpx)));
	e->scratch_n = n;
	/* plans are tied to the alignment of the arrays they were made on: fftw_malloc gives
	 * every buffer the same (SIMD) alignment, so old plans stay valid */
}

/* Plans of size 2^k (made on thread 0's scratch, executed on any thread's: planning is not
 * thread-safe, execution with new arrays is). Called only from the creating thread. */
static void OC_S(oc_plans)(struct OC_S(oc_engine) * e, int k)
{
	CHECK(k < OC_MAX_LOG, "online_conv: FFT size 2^%d too large", k);
	if (e->fwd[k])
		return;
	int n = 1 << k;
	OC_S(oc_scratch)(e, n);
	unsigned flags = e->cfg.fft_flags ? e->cfg.fft_flags : FFTW_ESTIMATE;
	e->fwd[k] = OC_FFTW(plan_dft_r2c_1d)(n, e->sbuf[0], e->sspec[0], flags);
	e->inv[k] = OC_FFTW(plan_dft_c2r_1d)(n, e->sspec[0], e->sbuf[0], flags);
	CHECK(e->fwd[k] && e->inv[k], "online_conv: FFTW could not plan size %d", n);
}

static inline void OC_S(oc_cmul)(OC_S(oc_cpx) * a, const OC_S(oc_cpx) * b, int64_t n,
                                 OC_S(oc_real) scale)
{
	for (int64_t i = 0; i < n; i++) {
		OC_S(oc_real) re = a[i][0] * b[i][0] - a[i][1] * b[i][1];
		OC_S(oc_real) im = a[i][0] * b[i][1] + a[i][1] * b[i][0];
		a[i][0] = re * scale;
		a[i][1] = im * scale;
	}
}

struct OC_S(oc_engine) * OC_S(oc_create)(const struct oc_config *cfg, const OC_S(oc_real) * rho)
{
	CHECK(cfg->nconv >= 1 && cfg->B >= 1 && cfg->C >= 1 && cfg->L >= 1,
	      "online_conv: bad sizes nconv=%lld B=%lld C=%lld L=%lld", (long long)cfg->nconv,
	      (long long)cfg->B, (long long)cfg->C, (long long)cfg->L);
	CHECK(cfg->P >= 0 && cfg->P <= cfg->L && cfg->thr >= 0 && cfg->mode >= 0 &&
	          cfg->mode < OC_MODE_COUNT,
	      "online_conv: bad prompt length %lld, thr %lld or mode", (long long)cfg->P,
	      (long long)cfg->thr);
	struct OC_S(oc_engine) *e = xcalloc(1, sizeof(*e));
	e->cfg = *cfg;
	const int64_t nc = cfg->nconv, B = cfg->B, C = cfg->C, L = cfg->L;
	e->G = L - cfg->P;
#ifdef _OPENMP
	e->nthreads = omp_get_max_threads();
#else
	e->nthreads = 1;
#endif
	e->sbuf = OC_S(oc_alloc)(e, (size_t)e->nthreads, sizeof(*e->sbuf));
	e->sspec = OC_S(oc_alloc)(e, (size_t)e->nthreads, sizeof(*e->sspec));
	e->sspec2 = OC_S(oc_alloc)(e, (size_t)e->nthreads, sizeof(*e->sspec2));
	e->red_done = OC_S(oc_alloc)(e, (size_t)nc, 1);
	e->prompt_done = OC_S(oc_alloc)(e, (size_t)nc, 1);
	size_t hist = (size_t)(nc * B * C * e->G);
	e->y = OC_S(oc_alloc)(e, hist, sizeof(OC_S(oc_real)));
	e->acc = OC_S(oc_alloc)(e, hist, sizeof(OC_S(oc_real)));
	e->rho0 = OC_S(oc_alloc)(e, (size_t)(nc * C), sizeof(OC_S(oc_real)));
	for (int64_t i = 0; i < nc * C; i++)
		e->rho0[i] = rho[i * L];
	enum oc_mode m = cfg->mode;
	if (m == OC_EAGER || m == OC_RECOMPUTE || cfg->P > 0) {
		e->rf = OC_S(oc_alloc)(e, (size_t)(nc * C * L), sizeof(OC_S(oc_real)));
		memcpy(e->rf, rho, (size_t)(nc * C * L) * sizeof(OC_S(oc_real)));
	}
	e->Lr = m == OC_LAZY ? L : (m == OC_FLASH ? (2 * cfg->thr < L ? 2 * cfg->thr : L) : 0);
	if (e->Lr > 0) {
		e->rr = OC_S(oc_alloc)(e, (size_t)(nc * C * e->Lr), sizeof(OC_S(oc_real)));
		for (int64_t i = 0; i < nc * C; i++)
			for (int64_t j = 0; j < e->Lr; j++)
				e->rr[i * e->Lr + e->Lr - 1 - j] = rho[i * L + j];
	}
	if (m == OC_RECOMPUTE && e->G >= 2) {
		/* sizes 2^k >= 2 (r+2) for r = 0 .. G-2 */
		for (int k = OC_S(oc_log2)(4); k <= OC_S(oc_log2)(2 * e->G); k++)
			OC_S(oc_plans)(e, k);
	}
	if (m == OC_FLASH && e->G >= 2) {
		/* levels q with U = 2^q <= G-1 (the largest lowbit of a step that has outputs) */
		e->nlev = 0;
		while (((int64_t)1 << e->nlev) <= e->G - 1)
			e->nlev++;
		for (int q = 0; q < e->nlev; q++) {
			int64_t U = (int64_t)1 << q;
			if (U <= cfg->thr)
				continue;
			OC_S(oc_plans)(e, q + 1);
			e->ghat[q] =
			    OC_S(oc_alloc)(e, (size_t)(nc * C * (U + 1)), sizeof(OC_S(oc_cpx)));
			const OC_S(oc_real) scale = (OC_S(oc_real))1 / (OC_S(oc_real))(2 * U);
#pragma omp parallel for schedule(static)
			for (int64_t i = 0; i < nc * C; i++) {
#ifdef _OPENMP
				int th = omp_get_thread_num();
#else
				int th = 0;
#endif
				OC_S(oc_real) *buf = e->sbuf[th];
				int64_t n = 2 * U < L ? 2 * U : L;
				memcpy(buf, rho + i * L, (size_t)n * sizeof(*buf));
				memset(buf + n, 0, (size_t)(2 * U - n) * sizeof(*buf));
				/* transform into aligned scratch: plans assume fftw_malloc
				 * alignment */
				OC_S(oc_cpx) *gh = e->ghat[q] + i * (U + 1), *sp = e->sspec[th];
				OC_FFTW(execute_dft_r2c)(e->fwd[q + 1], buf, sp);
				for (int64_t s = 0; s <= U; s++)
					gh[s][0] = sp[s][0] * scale, gh[s][1] = sp[s][1] * scale;
			}
		}
	}
	return e;
}

void OC_S(oc_free)(struct OC_S(oc_engine) * e)
{
	if (!e)
		return;
	for (int k = 0; k < OC_MAX_LOG; k++) {
		if (e->fwd[k])
			OC_FFTW(destroy_plan)(e->fwd[k]);
		if (e->inv[k])
			OC_FFTW(destroy_plan)(e->inv[k]);
		free(e->ghat[k]);
	}
	for (int64_t t = 0; t < e->nthreads; t++) {
		if (e->sbuf[t]) {
			OC_FFTW(free)(e->sbuf[t]);
			OC_FFTW(free)(e->sspec[t]);
			OC_FFTW(free)(e->sspec2[t]);
		}
	}
	free(e->sbuf), free(e->sspec), free(e->sspec2);
	free(e->red_done), free(e->prompt_done);
	free(e->y), free(e->acc), free(e->rho0), free(e->rf), free(e->rr);
	free(e);
}

static inline int OC_S(oc_thread)(void)
{
#ifdef _OPENMP
	return omp_get_thread_num();
#else
	return 0;
#endif
}

/* Linear convolution of y (stride ys, n_y values) with rho[0..n_r-1] by FFT of size 2^k;
 * the scaled result is left in the thread's buf. rs holds rho's spectrum when have_rs. */
static OC_S(oc_real) * OC_S(oc_fftconv)(struct OC_S(oc_engine) * e, int k, const OC_S(oc_real) * y,
                                        int64_t ys, int64_t n_y, const OC_S(oc_real) * rho,
                                        int64_t n_r, bool have_rs)
{
	const int64_t n = (int64_t)1 << k;
	int th = OC_S(oc_thread)();
	OC_S(oc_real) *buf = e->sbuf[th];
	OC_S(oc_cpx) *sy = e->sspec[th], *sr = e->sspec2[th];
	if (!have_rs) {
		memcpy(buf, rho, (size_t)n_r * sizeof(*buf));
		memset(buf + n_r, 0, (size_t)(n - n_r) * sizeof(*buf));
		OC_FFTW(execute_dft_r2c)(e->fwd[k], buf, sr);
	}
	for (int64_t p = 0; p < n_y; p++)
		buf[p] = y[p * ys];
	memset(buf + n_y, 0, (size_t)(n - n_y) * sizeof(*buf));
	OC_FFTW(execute_dft_r2c)(e->fwd[k], buf, sy);
	OC_S(oc_cmul)(sy, sr, n / 2 + 1, (OC_S(oc_real))1 / (OC_S(oc_real))n);
	OC_FFTW(execute_dft_c2r)(e->inv[k], sy, buf);
	return buf;
}

/* The prompt's own outputs come from dyadic output blocks [a, 2a) (and [0, 1)), each a
 * convolution of the prefix y[0..2a) by an FFT of size 4a: the rounding error of an FFT
 * scales with the norms of its whole operands, so one big FFT would swamp the early outputs
 * (whose sums are small) with the error of the late ones. The blocks cost O(P log P) in all.
 * The prompt's contribution to the generated positions is one FFT per channel. */
void OC_S(oc_prompt)(struct OC_S(oc_engine) * e, int64_t conv, const OC_S(oc_real) * y,
                     OC_S(oc_real) * z)
{
	const int64_t B = e->cfg.B, C = e->cfg.C, L = e->cfg.L, P = e->cfg.P, G = e->G;
	CHECK(conv >= 0 && conv < e->cfg.nconv && P > 0 && e->r == 0 && !e->prompt_done[conv],
	      "online_conv: prompt of instance %lld out of order", (long long)conv);
	e->prompt_done[conv] = 1;
	/* future: outputs 0..L-1 of y[0..P-1] * rho[0..L-1] must not wrap */
	const int kf = OC_S(oc_log2)(P + L - 1 > 2 ? P + L - 1 : 2);
	OC_S(oc_plans)(e, kf);
	for (int64_t a = 1; a < P; a *= 2)
		OC_S(oc_plans)(e, OC_S(oc_log2)(4 * a));
	OC_S(oc_plans)(e, 1);
#pragma omp parallel for schedule(static) if (C * (P + L) > 65536)
	for (int64_t c = 0; c < C; c++) {
		const OC_S(oc_real) *rc = e->rf + (conv * C + c) * L;
		for (int64_t a = 0; a < P; a = a ? 2 * a : 1) {
			int64_t end = a ? (2 * a < P ? 2 * a : P) : 1;
			int k = OC_S(oc_log2)(a ? 4 * a : 2);
			for (int64_t b = 0; b < B; b++) {
				const OC_S(oc_real) *out = OC_S(oc_fftconv)(
				    e, k, y + b * P * C + c, C, end, rc, end < L ? end : L, b > 0);
				for (int64_t p = a; p < end; p++)
					z[(b * P + p) * C + c] = out[p];
			}
		}
		for (int64_t b = 0; b < B && G > 0; b++) {
			const OC_S(oc_real) *out =
			    OC_S(oc_fftconv)(e, kf, y + b * P * C + c, C, P, rc, L, b > 0);
			OC_S(oc_real) *acc = e->acc + ((conv * B + b) * C + c) * G;
			for (int64_t j = 0; j < G; j++)
				acc[j] += out[P + j];
		}
	}
}

void OC_S(oc_red)(struct OC_S(oc_engine) * e, int64_t conv, const OC_S(oc_real) * y,
                  OC_S(oc_real) * z)
{
	const int64_t B = e->cfg.B, C = e->cfg.C, G = e->G, r = e->r;
	CHECK(conv >= 0 && conv < e->cfg.nconv && r < G && !e->red_done[conv] &&
	          (e->cfg.P == 0 || e->prompt_done[conv]),
	      "online_conv: red cell of instance %lld at position %lld out of order",
	      (long long)conv, (long long)(e->cfg.P + r));
	e->red_done[conv] = 1;
	const OC_S(oc_real) *rho0 = e->rho0 + conv * C;
	for (int64_t b = 0; b < B; b++) {
		OC_S(oc_real) *yh = e->y + (conv * B + b) * C * G + r;
		const OC_S(oc_real) *acc = e->acc + (conv * B + b) * C * G + r;
		for (int64_t c = 0; c < C; c++) {
			OC_S(oc_real) v = y[b * C + c];
			yh[c * G] = v;
			z[b * C + c] = acc[c * G] + rho0[c] * v;
		}
	}
}

/* acc[r+1] += sum_{k<=r} rho[r+1-k] y[k] */
static void OC_S(oc_lazy_item)(struct OC_S(oc_engine) * e, int64_t conv, int64_t b, int64_t c)
{
	const int64_t G = e->G, r = e->r, L = e->cfg.L, C = e->cfg.C;
	const OC_S(oc_real) *yh = e->y + ((conv * e->cfg.B + b) * C + c) * G;
	const OC_S(oc_real) *w = e->rr + (conv * C + c) * L + (L - 2 - r);
	OC_S(oc_real) s = 0;
#pragma omp simd reduction(+ : s)
	for (int64_t k = 0; k <= r; k++)
		s += yh[k] * w[k];
	e->acc[((conv * e->cfg.B + b) * C + c) * G + r + 1] += s;
}

/* acc[j] += rho[j-r] y[r] for j = r+1 .. G-1 */
static void OC_S(oc_eager_item)(struct OC_S(oc_engine) * e, int64_t conv, int64_t b, int64_t c)
{
	const int64_t G = e->G, r = e->r, L = e->cfg.L, C = e->cfg.C;
	OC_S(oc_real) *acc = e->acc + ((conv * e->cfg.B + b) * C + c) * G + r + 1;
	const OC_S(oc_real) v = e->y[((conv * e->cfg.B + b) * C + c) * G + r];
	const OC_S(oc_real) *w = e->rf + (conv * C + c) * L + 1;
#pragma omp simd
	for (int64_t j = 0; j < G - r - 1; j++)
		acc[j] += w[j] * v;
}

/* acc[r+1] += (y[0..r] * rho)[r+1], from a full FFT convolution of the prefix */
static void OC_S(oc_recompute_item)(struct OC_S(oc_engine) * e, int64_t conv, int64_t b, int64_t c)
{
	const int64_t G = e->G, r = e->r, L = e->cfg.L, C = e->cfg.C;
	int k = OC_S(oc_log2)(2 * (r + 2));
	int64_t n = (int64_t)1 << k;
	int th = OC_S(oc_thread)();
	OC_S(oc_real) *buf = e->sbuf[th];
	OC_S(oc_cpx) *ys = e->sspec[th], *rs = e->sspec2[th];
	const OC_S(oc_real) *yh = e->y + ((conv * e->cfg.B + b) * C + c) * G;
	memcpy(buf, yh, (size_t)(r + 1) * sizeof(*buf));
	memset(buf + r + 1, 0, (size_t)(n - r - 1) * sizeof(*buf));
	OC_FFTW(execute_dft_r2c)(e->fwd[k], buf, ys);
	int64_t nt = r + 2 < L ? r + 2 : L;
	memcpy(buf, e->rf + (conv * C + c) * L, (size_t)nt * sizeof(*buf));
	memset(buf + nt, 0, (size_t)(n - nt) * sizeof(*buf));
	OC_FFTW(execute_dft_r2c)(e->fwd[k], buf, rs);
	OC_S(oc_cmul)(ys, rs, n / 2 + 1, (OC_S(oc_real))1 / (OC_S(oc_real))n);
	OC_FFTW(execute_dft_c2r)(e->inv[k], ys, buf);
	e->acc[((conv * e->cfg.B + b) * C + c) * G + r + 1] += buf[r + 1];
}

/* Flash tile of step i = r+1: inputs r-U+1..r into outputs r+1..min(r+U, G-1). */
static void OC_S(oc_flash_item)(struct OC_S(oc_engine) * e, int64_t conv, int64_t b, int64_t c)
{
	const int64_t G = e->G, r = e->r, C = e->cfg.C, i = r + 1;
	const int64_t U = i & -i, cnt = (r + U < G - 1 ? r + U : G - 1) - r;
	const int64_t row = (conv * e->cfg.B + b) * C + c;
	const OC_S(oc_real) *yb = e->y + row * G + r - U + 1;
	OC_S(oc_real) *acc = e->acc + row * G + r + 1;
	if (U <= e->cfg.thr) {
		/* acc[s2] += sum_{s<U} yb[s] rho[U+s2-s], rho[m] = rr[Lr-1-m] */
		const int64_t Lr = e->Lr;
		for (int64_t s2 = 0; s2 < cnt; s2++) {
			const OC_S(oc_real) *w = e->rr + (conv * C + c) * Lr + (Lr - 1 - U - s2);
			OC_S(oc_real) s = 0;
#pragma omp simd reduction(+ : s)
			for (int64_t k = 0; k < U; k++)
				s += yb[k] * w[k];
			acc[s2] += s;
		}
		return;
	}
	int q = __builtin_ctzll((unsigned long long)U);
	int th = OC_S(oc_thread)();
	OC_S(oc_real) *buf = e->sbuf[th];
	OC_S(oc_cpx) *spec = e->sspec[th];
	memcpy(buf, yb, (size_t)U * sizeof(*buf));
	memset(buf + U, 0, (size_t)U * sizeof(*buf));
	OC_FFTW(execute_dft_r2c)(e->fwd[q + 1], buf, spec);
	OC_S(oc_cmul)(spec, e->ghat[q] + (conv * C + c) * (U + 1), U + 1, 1);
	OC_FFTW(execute_dft_c2r)(e->inv[q + 1], spec, buf);
	for (int64_t s2 = 0; s2 < cnt; s2++)
		acc[s2] += buf[U + s2];
}

void OC_S(oc_tiles)(struct OC_S(oc_engine) * e)
{
	const int64_t nc = e->cfg.nconv, B = e->cfg.B, C = e->cfg.C, G = e->G, r = e->r;
	for (int64_t i = 0; i < nc; i++) {
		CHECK(e->red_done[i],
		      "online_conv: tiles at position %lld before the red cell of "
		      "instance %lld",
		      (long long)(e->cfg.P + r), (long long)i);
		e->red_done[i] = 0;
	}
	if (r + 1 <= G - 1) {
		const int64_t items = nc * B * C;
		void (*item)(struct OC_S(oc_engine) *, int64_t, int64_t, int64_t);
		int64_t cost; /* rough flops per item, to decide whether threads pay off */
		int64_t U = (r + 1) & -(r + 1);
		switch (e->cfg.mode) {
		case OC_LAZY:
			item = OC_S(oc_lazy_item), cost = r + 1;
			break;
		case OC_EAGER:
			item = OC_S(oc_eager_item), cost = G - r;
			break;
		case OC_RECOMPUTE:
			item = OC_S(oc_recompute_item), cost = 30 * (r + 2);
			break;
		default:
			item = OC_S(oc_flash_item);
			cost =
			    U <= e->cfg.thr ? U * U : 10 * U * (1 + __builtin_ctzll((uint64_t)U));
			break;
		}
#pragma omp parallel for schedule(static) if (items * cost > 32768)
		for (int64_t it = 0; it < items; it++)
			item(e, it / (B * C), (it / C) % B, it % C);
	}
	e->r++;
}

void OC_S(oc_seek)(struct OC_S(oc_engine) * e, int64_t r)
{
	CHECK(r >= 0 && r <= e->G, "online_conv: seek to %lld outside 0..%lld", (long long)r,
	      (long long)e->G);
	/* Positions e->r..r-1 were never written, so their pages were never touched: a real run
	 * would have written them. Write them (with the zeros they hold) so the timed steps read
	 * committed memory, as after real steps, not the kernel's shared zero page. */
	if (r > e->r) {
		int64_t rows = e->cfg.nconv * e->cfg.B * e->cfg.C;
		size_t n = (size_t)(r - e->r) * sizeof(OC_S(oc_real));
		for (int64_t row = 0; row < rows; row++) {
			memset(e->y + row * e->G + e->r, 0, n);
			memset(e->acc + row * e->G + e->r, 0, n);
		}
	}
	e->r = r;
	memset(e->red_done, 0, (size_t)e->cfg.nconv);
	memset(e->prompt_done, 1, (size_t)e->cfg.nconv);
}

int64_t OC_S(oc_position)(const struct OC_S(oc_engine) * e)
{
	return e->cfg.P + e->r;
}

size_t OC_S(oc_bytes)(const struct OC_S(oc_engine) * e)
{
	return e->bytes;
}

#undef OC_MAX_LOG
