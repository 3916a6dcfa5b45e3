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
#include "kernels/fp8_linear.h"
#include "kernels/mm_engine.h"
#include "model/model.h"
#include "model/param_table.h"

static float *compute_params16; /* bf16-valued copy of a single rank's parameters */
static int64_t compute_params16_n;
static bool compute_fp8_ag; /* quantize.linear.float8.enable_fsdp_float8_all_gather in force */

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

bool compute_float8(const struct ct_config *cfg)
{
	const char *c = cfg->model.converters;
	size_t n = strlen("float8");
	for (const char *p = c; (p = strstr(p, "float8")) != NULL; p += n)
		if ((p == c || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
			return true;
	return false;
}

void compute_set_fp8_all_gather(bool on)
{
	compute_fp8_ag = on;
}

bool compute_fp8_all_gather(const struct ct_config *cfg)
{
	return compute_float8(cfg) && cfg->float8.enable_fsdp_float8_all_gather;
}

/* The float8 converter's set-up and what it does not support (exit 2 naming the key). */
static int compute_setup_float8(const struct ct_config *cfg, bool log)
{
	const struct ct_config_float8 *q = &cfg->float8;
	enum fp8_recipe r;
	bool on = compute_float8(cfg);
	compute_fp8_ag = false;
	if (fp8_recipe_parse(q->recipe_name, &r)) {
		LOG_ERROR("quantize.linear.float8.recipe_name: unknown recipe '%s' (tensorwise, "
		          "rowwise, rowwise_with_gw_hp)", q->recipe_name);
		return CT_ERR_USAGE;
	}
	if (!on) {
		fp8_linear_configure(false, r, "");
		if (q->enable_fsdp_float8_all_gather) {
			LOG_ERROR("quantize.linear.float8.enable_fsdp_float8_all_gather = true needs "
			          "model.converters = [\"float8\"] (it gathers float8 linears' "
			          "weights)");
			return CT_ERR_USAGE;
		}
		return CT_OK;
	}
	const struct model_family *fam = model_family_named(cfg->model.name);
	if (fam && !fam->float8) {
		LOG_ERROR("model.converters = [\"float8\"]: not supported for model.name = %s "
		          "(the family has no float8 linears)", cfg->model.name);
		return CT_ERR_USAGE;
	}
	if (!q->emulate) {
		LOG_ERROR("quantize.linear.float8.emulate = false: no fp8 matmul hardware on the CPUs "
		          "ctitan runs on; float8 compute is emulated (set it to true)");
		return CT_ERR_USAGE;
	}
	if (q->enable_fsdp_float8_all_gather && r != FP8_TENSORWISE) {
		LOG_ERROR("quantize.linear.float8.enable_fsdp_float8_all_gather = true with "
		          "recipe_name = %s: the fp8 all-gather needs the tensorwise recipe (as "
		          "torchao)", q->recipe_name);
		return CT_ERR_USAGE;
	}
	fp8_linear_configure(true, r, q->filter_fqns);
	compute_fp8_ag = q->enable_fsdp_float8_all_gather;
	if (log)
		LOG_INFO("float8 linears: recipe %s, filter_fqns [%s], fp8 all-gather %s; fp8 "
		         "matmuls EMULATED on this CPU (fp8-valued operands through the %s engine, "
		         "fp32 accumulation, scales applied after; casts with %s): the numerics "
		         "of float8 training, not its speed",
		         q->recipe_name, q->filter_fqns, compute_fp8_ag ? "on" : "off",
		         mm_engine_dtype() == MM_BF16 ? "bf16" : "fp32", fp8_isa());
	return CT_OK;
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
	int rc = compute_setup_float8(cfg, log);
	if (rc || !log)
		return rc;
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

/* The bf16 twin of compute_params16 (kernels/mm_engine.h: the matmuls read it instead of
 * rounding the weights on every call) */
static uint16_t *compute_params16h;

void compute_bind_bf16_params(struct model *m, bool on)
{
	int64_t n = m->table->numel;
	float *from = on ? m->params : compute_params16, *to = on ? compute_params16 : m->params;
	if (on) {
		if (n > compute_params16_n) {
			if (compute_params16) {
				mem_free(MEM_FULL_PARAMS, compute_params16,
				         (size_t)compute_params16_n * sizeof(float));
				mem_free(MEM_FULL_PARAMS, compute_params16h,
				         (size_t)compute_params16_n * sizeof(uint16_t));
			}
			compute_params16 = mem_alloc(MEM_FULL_PARAMS, (size_t)n * sizeof(float));
			compute_params16h = mem_alloc(MEM_FULL_PARAMS, (size_t)n * sizeof(uint16_t));
			compute_params16_n = n;
		}
		to = compute_params16;
		const float *p = m->params;
#pragma omp parallel for schedule(static)
		for (int64_t i = 0; i < n; i++)
			to[i] = bf16_to_f32(bf16_from_f32(p[i]));
		/* fp8 all-gather: the float8 weights go to fp8 from the fp32 masters (as FSDP's
		 * gather casts the fp32 shards), not from bf16 */
		const struct param_table *t = m->table;
		for (int i = 0; compute_fp8_ag && i < t->count; i++)
			if (model_fp8_linear(&t->p[i]))
				memcpy(to + t->p[i].offset, p + t->p[i].offset,
				       (size_t)t->p[i].numel * sizeof(float));
		uint16_t *h = compute_params16h;
#pragma omp parallel for simd schedule(static)
		for (int64_t i = 0; i < n; i++)
			h[i] = bf16_from_f32(to[i]);
		mm_bf16_twin_add(to, h, n);
	} else {
		mm_bf16_twin_remove(compute_params16);
	}
	for (int u = 0; u < m->n_units; u++) {
		CHECK(m->unit_w[u] >= from && m->unit_w[u] < from + n, "unit %d not in the buffer", u);
		model_bind_unit(m, u, to + (m->unit_w[u] - from), m->unit_dw[u]);
	}
}
