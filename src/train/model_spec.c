/* Model configs from the run configuration: the family `[model] name` names converts it. */
#include "train/model_spec.h"

#include <string.h>

#include "base/log.h"

int model_spec_from_config(const struct ct_config *cfg, struct model_config *mc)
{
	memset(mc, 0, sizeof(*mc));
	const struct model_family *f = model_family_named(cfg->model.name);
	if (!f || !f->from_config) {
		LOG_ERROR("model.name: '%s' is not supported (%s)", cfg->model.name,
		          model_family_list());
		return CT_ERR_USAGE;
	}
	return f->from_config(cfg, mc);
}
