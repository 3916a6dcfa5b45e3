/* train/step_config: config → step_plan options. */
#include "train/step_config.h"

#include <string.h>

#include "base/log.h"
#include "train/compute.h"

int step_config_opts(const struct ct_config *cfg, struct step_plan_opts *o)
{
	memset(o, 0, sizeof(*o));
	int rc = sched_ac_parse(cfg->activation_checkpoint.mode, &o->ac);
	if (rc)
		return rc;
	/* TorchTitan: mode selective with an integer option is per-layer (every N-th block) */
	if (o->ac == MODEL_AC_SELECTIVE && config_ac_every(cfg) > 0) {
		o->ac = MODEL_AC_LAYER;
		o->ac_every = config_ac_every(cfg);
	}
	enum fsdp_reshard reshard;
	rc = fsdp_reshard_parse(cfg->parallelism.fsdp_reshard_after_forward, &reshard);
	if (rc)
		return rc;
	o->reshard = (enum sched_reshard)reshard;
	o->buckets = cfg->comm.buckets;
	o->bucket_cap_bytes = (int64_t)(cfg->comm.bucket_cap_mb * (double)(1 << 20));
	o->reorder.prefetch = (int)cfg->comm.prefetch;
	o->reorder.rs_defer = (int)cfg->comm.reduce_scatter_defer;
	o->reorder.memory_bytes = (int64_t)(cfg->comm.memory_budget_gb * (double)(1ll << 30));
	o->bf16 = compute_bf16(cfg);
	o->tp_async = cfg->parallelism.enable_async_tensor_parallel;
	o->profile = cfg->profiling.enable_profiling;
	o->overlap = strcmp(cfg->comm.progress, "thread") == 0;
	o->link_gbps = cfg->comm.bandwidth_gbps;
	o->link_latency_us = cfg->comm.latency_us;
	o->tp_sim_gbps = cfg->comm.simulate_bandwidth_gbps;
	o->tp_sim_latency_us = cfg->comm.simulate_latency_us;
	o->cp_ring = strcmp(cfg->parallelism.context_parallel_rotate_method, "alltoall") == 0;
	o->cp_headtail = strcmp(cfg->parallelism.context_parallel_load_balancer, "headtail") == 0;
	return CT_OK;
}
