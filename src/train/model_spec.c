/* Model configs from the run configuration, for every family. */
#include "train/model_spec.h"

#include <string.h>

#include "base/log.h"

int model_spec_llama(const struct ct_config *cfg, struct llama_config *mc)
{
	if (strcmp(cfg->model.name, "hyena") == 0) {
		LOG_ERROR(
		    "model.name = \"hyena\": not yet supported by this command (llama3 only)");
		return CT_ERR_USAGE;
	}
	if (strcmp(cfg->model.name, "llama3") != 0) {
		LOG_ERROR("model.name: '%s' is not supported (llama3, hyena)", cfg->model.name);
		return CT_ERR_USAGE;
	}
	if (hyena_is_flavor(cfg->model.flavor)) {
		LOG_ERROR("model.flavor: '%s' is a hyena flavor; set model.name = \"hyena\"",
		          cfg->model.flavor);
		return CT_ERR_USAGE;
	}
	int rc = llama_config_preset(mc, cfg->model.flavor);
	if (rc)
		return rc;
	if (cfg->model.vocab_size > 0)
		mc->vocab_size = cfg->model.vocab_size;
	mc->rope_scaling = cfg->model.rope_scaling;
	return llama_config_finish(mc);
}

int model_spec_hyena(const struct ct_config *cfg, struct hyena_config *hc)
{
	if (!hyena_is_flavor(cfg->model.flavor)) {
		LOG_ERROR("model.flavor: '%s' is not a hyena flavor (%s)", cfg->model.flavor,
		          hyena_flavor_list());
		return CT_ERR_USAGE;
	}
	int rc = hyena_config_preset(hc, cfg->model.flavor);
	if (rc)
		return rc;
	const struct int_override {
		int64_t value, *field;
	} keys[] = {
	    {cfg->model.vocab_size, &hc->vocab_size},
	    {cfg->model.hyena_order, &hc->order},
	    {cfg->model.hyena_filter_order, &hc->filter_order},
	    {cfg->model.hyena_emb_dim, &hc->emb_dim},
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (keys[i].value > 0)
			*keys[i].field = keys[i].value;
	if (cfg->model.hyena_sin_freq > 0)
		hc->sin_freq = cfg->model.hyena_sin_freq;
	hc->l_max = cfg->model.hyena_l_max > 0 ? cfg->model.hyena_l_max : cfg->training.seq_len;
	if (hc->l_max < cfg->training.seq_len) {
		LOG_ERROR("model.hyena_l_max: %lld is shorter than training.seq_len %lld",
		          (long long)hc->l_max, (long long)cfg->training.seq_len);
		return CT_ERR_USAGE;
	}
	return hyena_config_finish(hc);
}

int model_spec_from_config(const struct ct_config *cfg, struct model_config *mc)
{
	memset(mc, 0, sizeof(*mc));
	if (strcmp(cfg->model.name, "hyena") == 0) {
		mc->kind = MODEL_HYENA;
		return model_spec_hyena(cfg, &mc->hyena);
	}
	mc->kind = MODEL_LLAMA;
	if (strcmp(cfg->model.name, "llama3") != 0) {
		LOG_ERROR("model.name: '%s' is not supported (llama3, hyena)", cfg->model.name);
		return CT_ERR_USAGE;
	}
	return model_spec_llama(cfg, &mc->llama);
}
