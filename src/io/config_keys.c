/* io/config_keys: the table of every key (the schema's rows, then the keys the layers above
 * add with config_add_keys), reading values by name, and the checks of the layers above. */
#include "io/config_impl.h"

#include "base/log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * The key table: the schema's rows, then the keys the layers above add.
 */

static struct cfg_key cfg_all[CFG_MAX_KEYS];
static size_t cfg_n_all;    /* 0: not built yet */
static size_t cfg_ext_used; /* bytes of ct_config.ext given to added keys */
static int (*cfg_checks[8])(const struct ct_config *cfg);
static int cfg_n_checks;

const struct cfg_key *cfg_key_table(void)
{
	if (cfg_n_all == 0) {
		CHECK(cfg_n_keys <= CFG_MAX_KEYS, "schema: %zu keys: raise CFG_MAX_KEYS",
		      cfg_n_keys);
		memcpy(cfg_all, cfg_schema, cfg_n_keys * sizeof(cfg_all[0]));
		cfg_n_all = cfg_n_keys;
	}
	return cfg_all;
}

size_t cfg_key_count(void)
{
	cfg_key_table();
	return cfg_n_all;
}

/* The row of "section.name" (the section is what comes before the last '.'), or NULL. */
static struct cfg_key *cfg_find(const char *key)
{
	const char *dot = strrchr(key, '.');
	char sec[64];
	if (!dot || (size_t)(dot - key) >= sizeof(sec))
		return NULL;
	snprintf(sec, sizeof(sec), "%.*s", (int)(dot - key), key);
	cfg_key_table();
	int i = cfg_key_index(sec, dot + 1, strlen(dot + 1));
	return i < 0 ? NULL : &cfg_all[i];
}

void config_add_keys(const char *section, const struct config_key_def *defs, size_t n)
{
	int s = cfg_section_index(section, strlen(section));
	CHECK(s >= 0, "config_add_keys: no section [%s]", section);
	cfg_key_table();
	for (size_t i = 0; i < n; i++) {
		const struct config_key_def *d = &defs[i];
		size_t size = d->type == CONFIG_STRING ? CONFIG_STR_MAX
		              : d->type == CONFIG_BOOL ? sizeof(bool)
		                                       : 8;
		CHECK(cfg_key_index(cfg_sections[s], d->name, strlen(d->name)) < 0,
		      "config_add_keys: %s.%s exists", section, d->name);
		CHECK(cfg_n_all < CFG_MAX_KEYS && cfg_ext_used + size <= CONFIG_EXT_BYTES,
		      "config_add_keys: no room for %s.%s (CFG_MAX_KEYS, CONFIG_EXT_BYTES)",
		      section, d->name);
		cfg_all[cfg_n_all++] = (struct cfg_key){
		    .section = cfg_sections[s],
		    .name = d->name,
		    .type = d->type,
		    .offset = offsetof(struct ct_config, ext) + cfg_ext_used,
		    .size = size,
		    .def = d->def,
		    .range = d->range,
		    .choices = d->choices,
		    .list = d->list,
		    .help = d->help,
		};
		cfg_ext_used += (size + 7) / 8 * 8;
	}
}

void config_set_choices(const char *key, const char *const *choices, const char *help)
{
	struct cfg_key *k = cfg_find(key);
	CHECK(k && k->type == CONFIG_STRING, "config_set_choices: no string key %s", key);
	k->choices = choices;
	if (help)
		k->help = help;
}

void config_add_check(int (*check)(const struct ct_config *cfg))
{
	CHECK(cfg_n_checks < (int)ARRAY_SIZE(cfg_checks), "config_add_check: too many checks");
	cfg_checks[cfg_n_checks++] = check;
}

int cfg_run_checks(const struct ct_config *cfg)
{
	for (int i = 0; i < cfg_n_checks; i++) {
		int rc = cfg_checks[i](cfg);
		if (rc)
			return rc;
	}
	return 0;
}

/* The field of key, which must be of type t. */
static const void *cfg_get(const struct ct_config *cfg, const char *key, enum config_type t)
{
	const struct cfg_key *k = cfg_find(key);
	CHECK(k, "config: no key %s (are the keys of the layers above added?)", key);
	CHECK(k->type == t, "config: %s is a %s, read as a %s", key, cfg_type_names[k->type],
	      cfg_type_names[t]);
	return (const char *)cfg + k->offset;
}

int64_t config_get_int(const struct ct_config *cfg, const char *key)
{
	int64_t v;
	memcpy(&v, cfg_get(cfg, key, CONFIG_INT), sizeof(v));
	return v;
}

double config_get_float(const struct ct_config *cfg, const char *key)
{
	double v;
	memcpy(&v, cfg_get(cfg, key, CONFIG_FLOAT), sizeof(v));
	return v;
}

bool config_get_bool(const struct ct_config *cfg, const char *key)
{
	bool v;
	memcpy(&v, cfg_get(cfg, key, CONFIG_BOOL), sizeof(v));
	return v;
}

const char *config_get_string(const struct ct_config *cfg, const char *key)
{
	return cfg_get(cfg, key, CONFIG_STRING);
}

bool config_is_default(const struct ct_config *cfg, const char *key)
{
	const struct cfg_key *k = cfg_find(key);
	CHECK(k, "config: no key %s", key);
	struct ct_config *d = xcalloc(1, sizeof(*d));
	const struct cfg_where w = {"schema default", 0};
	CHECK(cfg_assign_text(d, k, k->def, &w) == 0, "schema: default of %s is invalid", key);
	bool same = memcmp(cfg_field_const(cfg, k), cfg_field_const(d, k), k->size) == 0;
	free(d);
	return same;
}

int config_error(const char *fmt, ...)
{
	const struct cfg_where w = {"config", 0};
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return cfg_fail(&w, "%s", msg);
}
