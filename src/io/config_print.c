/* io/config_print: the effective config as TOML (reads back identically) and --help. */
#include "io/config_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Printing
 */

/* The shortest of %.15g, %.16g, %.17g that reads back exactly, always with a '.' or an
 * exponent so that it reads back as a float. */
static void cfg_format_float(double x, char *buf, size_t n)
{
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(buf, n, "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	if (!strpbrk(buf, ".eEn")) /* n: inf, nan, which never pass validation */
		strncat(buf, ".0", n - strlen(buf) - 1);
}

static void cfg_print_string(const char *s, FILE *f)
{
	fputc('"', f);
	for (; *s; s++) {
		switch (*s) {
		case '"':
			fputs("\\\"", f);
			break;
		case '\\':
			fputs("\\\\", f);
			break;
		case '\b':
			fputs("\\b", f);
			break;
		case '\t':
			fputs("\\t", f);
			break;
		case '\n':
			fputs("\\n", f);
			break;
		case '\f':
			fputs("\\f", f);
			break;
		case '\r':
			fputs("\\r", f);
			break;
		default:
			fputc(*s, f);
			break;
		}
	}
	fputc('"', f);
}

/* "a,b" as the TOML array ["a", "b"] */
static void cfg_print_list(const char *s, FILE *f)
{
	char one[CONFIG_STR_MAX];
	fputc('[', f);
	for (const char *p = s; *p;) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		snprintf(one, sizeof(one), "%.*s", (int)n, p);
		if (p != s)
			fputs(", ", f);
		cfg_print_string(one, f);
		p += n + (e ? 1 : 0);
	}
	fputc(']', f);
}

static void cfg_print_value(const struct ct_config *cfg, const struct cfg_key *k, FILE *f)
{
	const void *field = cfg_field_const(cfg, k);
	char buf[64];
	int64_t i;
	double x;
	bool b;
	switch (k->type) {
	case CONFIG_STRING:
		if (k->list)
			cfg_print_list(field, f);
		else
			cfg_print_string(field, f);
		break;
	case CONFIG_INT:
		memcpy(&i, field, sizeof(i));
		fprintf(f, "%lld", (long long)i);
		break;
	case CONFIG_FLOAT:
		memcpy(&x, field, sizeof(x));
		cfg_format_float(x, buf, sizeof(buf));
		fputs(buf, f);
		break;
	case CONFIG_BOOL:
		memcpy(&b, field, sizeof(b));
		fputs(b ? "true" : "false", f);
		break;
	case CONFIG_TYPE_COUNT:
		break;
	}
}

static size_t cfg_section_width(const char *sec)
{
	size_t w = 0;
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strcmp(CFG_KEYS[i].section, sec) == 0 && strlen(CFG_KEYS[i].name) > w)
			w = strlen(CFG_KEYS[i].name);
	return w;
}

void config_print(const struct ct_config *cfg, FILE *f)
{
	fprintf(f, "# ctitan effective configuration\n");
	for (size_t s = 0; s < CFG_N_SECTIONS; s++) {
		int width = (int)cfg_section_width(cfg_sections[s]);
		fprintf(f, "\n[%s]\n", cfg_sections[s]);
		for (size_t i = 0; i < CFG_N_KEYS; i++) {
			const struct cfg_key *k = &CFG_KEYS[i];
			if (strcmp(k->section, cfg_sections[s]) != 0)
				continue;
			fprintf(f, "%-*s = ", width, k->name);
			cfg_print_value(cfg, k, f);
			fputc('\n', f);
		}
	}
}

/* fputs of a line without its trailing blanks. */
static void cfg_put_line(char *line, FILE *f)
{
	size_t n = strlen(line);
	while (n > 0 && line[n - 1] == ' ')
		line[--n] = '\0';
	fprintf(f, "%s\n", line);
}

void config_print_help(FILE *f)
{
	int wname = 0, wdef = 0;
	char def[CONFIG_STR_MAX + 8], cons[256], line[1024];
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		const struct cfg_key *k = &CFG_KEYS[i];
		int dn = (int)strlen(k->def) + (k->type == CONFIG_STRING ? 2 : 0);
		if ((int)strlen(k->name) > wname)
			wname = (int)strlen(k->name);
		if (dn > wdef)
			wdef = dn;
	}
	fprintf(f, "Configuration keys: set them in the TOML file under [section], or override "
	           "them with --section.key=value or --section.key value.\n\n");
	snprintf(line, sizeof(line), "  %-*s  %-6s  %-*s  %s", wname, "key", "type", wdef,
	         "default", "allowed");
	cfg_put_line(line, f);
	for (size_t s = 0; s < CFG_N_SECTIONS; s++) {
		fprintf(f, "\n[%s]\n", cfg_sections[s]);
		for (size_t i = 0; i < CFG_N_KEYS; i++) {
			const struct cfg_key *k = &CFG_KEYS[i];
			if (strcmp(k->section, cfg_sections[s]) != 0)
				continue;
			snprintf(def, sizeof(def), k->type == CONFIG_STRING ? "\"%s\"" : "%s",
			         k->def);
			cfg_constraint_text(k, cons, sizeof(cons));
			snprintf(line, sizeof(line), "  %-*s  %-6s  %-*s  %s", wname, k->name,
			         cfg_type_names[k->type], wdef, def, cons);
			cfg_put_line(line, f);
			fprintf(f, "  %*s  %s\n", wname, "", k->help);
		}
	}
}
