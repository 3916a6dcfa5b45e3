/* Tensor-parallel configuration checks. */
#include "train/tp_check.h"

#include <string.h>

#include "base/log.h"
#include "comm/comm.h"
#include "train/model_spec.h"

int tp_check_config(const struct ct_config *cfg)
{
	int64_t tp = cfg->parallelism.tensor_parallel_degree;
	if (tp <= 1)
		return CT_OK;
	const struct model_family *fam = model_family_named(cfg->model.name);
	if (fam && !fam->tp) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %lld: not supported for "
		          "model.name = \"%s\" (the family has no tensor-parallel form: its "
		          "channels are not split)",
		          (long long)tp, cfg->model.name);
		return CT_ERR_USAGE;
	}
	const struct ct_config *c0 = cfg;
	int64_t rep = c0->parallelism.data_parallel_replicate_degree;
	int64_t shard = c0->parallelism.data_parallel_shard_degree;
	int64_t pp = c0->parallelism.pipeline_parallel_degree, world = comm_world_size();
	int64_t fixed = pp * rep * tp;
	if ((shard == -1 && world % fixed) || (shard != -1 && fixed * shard != world)) {
		LOG_ERROR("parallelism: pipeline_parallel_degree %lld x data_parallel_replicate_degree "
		          "%lld x data_parallel_shard_degree %lld x tensor_parallel_degree %lld "
		          "does not match the world of %lld ranks",
		          (long long)pp, (long long)rep, (long long)shard, (long long)tp,
		          (long long)world);
		return CT_ERR_USAGE;
	}
	struct model_config mc;
	int rc = model_spec_from_config(cfg, &mc);
	if (rc)
		return rc;
	const struct model_family *f = model_family_of(mc.kind);
	return f->tp_check ? f->tp_check(&mc, tp) : CT_OK;
}
