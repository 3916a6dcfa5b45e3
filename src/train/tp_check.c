/* Tensor-parallel configuration checks. */
#include "train/tp_check.h"

#include "base/log.h"
#include "comm/comm.h"
#include "parallel/cp.h"
#include "train/model_spec.h"

int tp_check_config(const struct ct_config *cfg)
{
	int64_t tp = cfg->parallelism.tensor_parallel_degree;
	if (tp <= 1)
		return CT_OK;
	const struct model_family *fam = model_family_named(cfg->model.name);
	if (fam && !fam->tp) {
		LOG_ERROR("parallelism.tensor_parallel_degree = %lld: not supported for "
		          "model.name = \"%s\" (%s)",
		          (long long)tp, cfg->model.name,
		          fam->no_tp_why ? fam->no_tp_why : "the family has no tensor-parallel form");
		return CT_ERR_USAGE;
	}
	const struct ct_config *c0 = cfg;
	int64_t rep = c0->parallelism.data_parallel_replicate_degree;
	int64_t shard = c0->parallelism.data_parallel_shard_degree;
	int64_t pp = c0->parallelism.pipeline_parallel_degree, world = comm_world_size();
	int64_t cp = c0->parallelism.context_parallel_degree;
	int64_t fixed = pp * rep * tp * cp;
	if ((shard == -1 && world % fixed) || (shard != -1 && fixed * shard != world)) {
		if (cp > 1)
			LOG_ERROR("parallelism: pipeline_parallel_degree %lld x "
			          "data_parallel_replicate_degree %lld x data_parallel_shard_degree %lld "
			          "x context_parallel_degree %lld x tensor_parallel_degree %lld does not "
			          "match the world of %lld ranks",
			          (long long)pp, (long long)rep, (long long)shard, (long long)cp,
			          (long long)tp, (long long)world);
		else
			LOG_ERROR("parallelism: pipeline_parallel_degree %lld x "
			          "data_parallel_replicate_degree %lld x data_parallel_shard_degree %lld "
			          "x tensor_parallel_degree %lld does not match the world of %lld ranks",
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

int cp_check_config(const struct ct_config *cfg)
{
	const int64_t cp = cfg->parallelism.context_parallel_degree;
	if (cp <= 1)
		return CT_OK;
	const struct model_family *fam = model_family_named(cfg->model.name);
	if (fam && !fam->cp) {
		LOG_ERROR("parallelism.context_parallel_degree = %lld: not supported for model.name "
		          "= \"%s\" (%s)",
		          (long long)cp, cfg->model.name,
		          fam->no_cp_why ? fam->no_cp_why : "the family has no context-parallel form");
		return CT_ERR_USAGE;
	}
	enum cp_balancer b;
	int rc = cp_balancer_parse(cfg->parallelism.context_parallel_load_balancer, &b);
	if (rc)
		return rc;
	const int64_t T = cfg->training.seq_len, div = cp_seq_divisor((int)cp, b);
	if (T % div) {
		LOG_ERROR("training.seq_len = %lld is not divisible by %s%lld (parallelism."
		          "context_parallel_degree = %lld, context_parallel_load_balancer = %s)",
		          (long long)T, b == CP_BALANCE_HEADTAIL ? "2 x cp = " : "cp = ",
		          (long long)div, (long long)cp, cfg->parallelism.context_parallel_load_balancer);
		return CT_ERR_USAGE;
	}
	const int64_t world = comm_world_size();
	if (world % cp) {
		LOG_ERROR("parallelism.context_parallel_degree = %lld does not divide the world of "
		          "%lld ranks",
		          (long long)cp, (long long)world);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

int ep_check_shard(int64_t ep, int64_t shard)
{
	if (shard % ep) {
		LOG_ERROR("parallelism.expert_parallel_degree = %lld does not divide "
		          "data_parallel_shard_degree = %lld (ep borrows from the FSDP shard group: "
		          "dp_shard = efsdp x ep)",
		          (long long)ep, (long long)shard);
		return CT_ERR_USAGE;
	}
	return CT_OK;
}

int ep_check_config(const struct ct_config *cfg)
{
	const struct ct_config *c = cfg;
	const int64_t ep = c->parallelism.expert_parallel_degree;
	if (ep <= 1)
		return CT_OK;
	const struct model_family *fam = model_family_named(c->model.name);
	if (fam && !fam->ep) {
		LOG_ERROR("parallelism.expert_parallel_degree = %lld is not supported with model.name "
		          "= \"%s\": the family has no routed experts to split",
		          (long long)ep, c->model.name);
		return CT_ERR_USAGE;
	}
	const struct {
		const char *key;
		int64_t v;
		const char *why;
	} no[] = {
	    {"context_parallel_degree", c->parallelism.context_parallel_degree,
	     "ep borrows from dp_shard only so far (TorchTitan's dp_shard x cp placement needs "
	     "the family's context-parallel attention, which deepseek_v3 does not have)"},
	    {"tensor_parallel_degree", c->parallelism.tensor_parallel_degree,
	     "the experts and attention heads are not split over TP ranks"},
	};
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		if (no[i].v > 1) {
			LOG_ERROR("parallelism.expert_parallel_degree = %lld is not supported with "
			          "parallelism.%s = %lld: %s",
			          (long long)ep, no[i].key, (long long)no[i].v, no[i].why);
			return CT_ERR_USAGE;
		}
	int64_t shard = c->parallelism.data_parallel_shard_degree;
	const int64_t rest = c->parallelism.data_parallel_replicate_degree;
	if (shard == -1)
		shard = comm_world_size() / rest;
	if (ep_check_shard(ep, shard))
		return CT_ERR_USAGE;
	return CT_OK;
}
