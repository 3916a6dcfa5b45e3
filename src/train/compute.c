#include "train/compute.h"

#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/bf16.h"
#include "base/cpu.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/mm_engine.h"
#include "model/model.h"

static float *compute_params16; /* bf16-valued copy of a single rank's parameters */
static int64_t compute_params16_n;

static int64_t compute_threads(void)
{
#ifdef _OPENMP
	return omp_get_max_threads();
#else
	return 1;
#endif
}

bool compute_bf16(const struct ct_config *cfg)
{
	const char *p = cfg->training.mixed_precision_param;
	if (strcmp(p, "auto") == 0) {
		const struct cpu_info *c = cpu_info();
		return c->avx512_bf16 || c->amx_bf16;
	}
	return strcmp(p, "bfloat16") == 0;
}

int compute_setup(const struct ct_config *cfg, bool log)
{
	enum mm_engine e;
	if (mm_engine_parse(cfg->compute.matmul_engine, &e)) {
		LOG_ERROR("compute.matmul_engine: unknown engine '%s' (auto, onednn, openblas)",
		          cfg->compute.matmul_engine);
		return CT_ERR_USAGE;
	}
	bool bf16 = compute_bf16(cfg);
	mm_engine_configure(e, bf16 ? MM_BF16 : MM_F32);
	const struct cpu_info *c = cpu_info();
	if (!log)
		return CT_OK;
	if (mm_engine_get() != e)
		LOG_INFO("CT_MATMUL_ENGINE=%s overrides compute.matmul_engine = %s",
		         mm_engine_name(mm_engine_get()), mm_engine_name(e));
	LOG_INFO("compute: %s; matmul engine %s, %s operands (fp32 accumulation); oneDNN ISA %s, "
	         "OpenBLAS kernel %s",
	         c->brand, mm_engine_name(mm_engine_get()), bf16 ? "bf16" : "fp32",
	         mm_onednn_isa(), mm_openblas_core());
	if (bf16 && !c->avx512_bf16 && !c->amx_bf16)
		LOG_WARN("training.mixed_precision_param = bfloat16 on a CPU without bf16 matmul "
		         "hardware (no AVX512-BF16 or AMX): the matmuls round their operands to "
		         "bf16 and run on fp32 units, the same numerics but slower than float32");
	return CT_OK;
}

double compute_peak_flops(const struct ct_config *cfg, char *why, int64_t len)
{
	if (cfg->metrics.peak_tflops > 0) {
		snprintf(why, (size_t)len, "metrics.peak_tflops");
		return cfg->metrics.peak_tflops * 1e12;
	}
	bool bf16 = compute_bf16(cfg);
	char d[200];
	cpu_peak_describe(bf16, compute_threads(), d, sizeof(d));
	snprintf(why, (size_t)len, "theoretical, %s", d);
	return cpu_peak_flops(bf16, compute_threads());
}

void compute_bind_bf16_params(struct model *m, bool on)
{
	int64_t n = m->table->numel;
	float *from = on ? m->params : compute_params16, *to = on ? compute_params16 : m->params;
	if (on) {
		if (n > compute_params16_n) {
			if (compute_params16)
				mem_free(MEM_FULL_PARAMS, compute_params16,
				         (size_t)compute_params16_n * sizeof(float));
			compute_params16 = mem_alloc(MEM_FULL_PARAMS, (size_t)n * sizeof(float));
			compute_params16_n = n;
		}
		to = compute_params16;
		const float *p = m->params;
#pragma omp parallel for schedule(static)
		for (int64_t i = 0; i < n; i++)
			to[i] = bf16_to_f32(bf16_from_f32(p[i]));
	}
	for (int u = 0; u < m->n_units; u++) {
		CHECK(m->unit_w[u] >= from && m->unit_w[u] < from + n, "unit %d not in the buffer", u);
		model_bind_unit(m, u, to + (m->unit_w[u] - from), m->unit_dw[u]);
	}
}
