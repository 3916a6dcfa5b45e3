/* io/config: loading (files, command-line overrides), assignment, defaults and validation.
 * The schema table is io/config_schema.c, the table of every key (with the keys the layers
 * above add) io/config_keys.c, the TOML literals io/config_toml.c, printing and help
 * io/config_print.c.
 *
 * Everything about a key lives in one row of cfg_schema: where it is stored, its type (taken
 * from the struct field itself with _Generic, so the two cannot disagree), its default
 * (written as it would be on the command line and parsed by the same code, so every default
 * is checked against its own range at start-up), its range or choices, and its help.
 *
 * Values reach a field only through cfg_assign, which checks type, range and choices; the
 * file parser and config_apply_args differ only in how they find the value text. Loading is
 * atomic: a source is applied to a copy and committed only when every line of it is valid.
 */

#include "io/config_impl.h"

#include "base/log.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void *cfg_field(struct ct_config *cfg, const struct cfg_key *k)
{
	return (char *)cfg + k->offset;
}

const void *cfg_field_const(const struct ct_config *cfg, const struct cfg_key *k)
{
	return (const char *)cfg + k->offset;
}

int cfg_section_index(const char *s, size_t n)
{
	for (size_t i = 0; i < CFG_N_SECTIONS; i++)
		if (strlen(cfg_sections[i]) == n && memcmp(cfg_sections[i], s, n) == 0)
			return (int)i;
	return -1;
}

int cfg_key_index(const char *sec, const char *key, size_t n)
{
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strcmp(CFG_KEYS[i].section, sec) == 0 && strlen(CFG_KEYS[i].name) == n &&
		    memcmp(CFG_KEYS[i].name, key, n) == 0)
			return (int)i;
	return -1;
}


/* ------------------------------------------------------------------------------------------
 * Messages: where an error is, what a key expects, what was found, what was probably meant.
 */

/* Up to max bytes of s[0..n) for a message, non-printable bytes as '?', "..." if cut. */
void cfg_snippet(const char *s, size_t n, size_t max, char *buf, size_t size)
{
	size_t j = 0;
	for (size_t i = 0; i < n && i < max && j + 4 < size; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[j++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	if (n > max && j + 4 < size) {
		memcpy(buf + j, "...", 3);
		j += 3;
	}
	buf[j] = '\0';
}

__attribute__((format(printf, 2, 3))) int cfg_fail(const struct cfg_where *w, const char *fmt, ...)
{
	char msg[2048], name[1100];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cfg_snippet(w->name, strlen(w->name), 1024, name, sizeof(name));
	if (w->line > 0)
		LOG_ERROR("%s:%d: %s", name, w->line, msg);
	else
		LOG_ERROR("%s: %s", name, msg);
	return CT_ERR_USAGE;
}

static void cfg_range_text(const struct config_range *r, char *buf, size_t n)
{
	if (r->lo_kind != CONFIG_BOUND_NONE && r->hi_kind != CONFIG_BOUND_NONE)
		snprintf(buf, n, "in %c%g, %g%c", r->lo_kind == CONFIG_BOUND_INCL ? '[' : '(',
		         r->lo, r->hi, r->hi_kind == CONFIG_BOUND_INCL ? ']' : ')');
	else if (r->lo_kind != CONFIG_BOUND_NONE)
		snprintf(buf, n, "%s %g", r->lo_kind == CONFIG_BOUND_INCL ? ">=" : ">", r->lo);
	else if (r->hi_kind != CONFIG_BOUND_NONE)
		snprintf(buf, n, "%s %g", r->hi_kind == CONFIG_BOUND_INCL ? "<=" : "<", r->hi);
	else
		buf[0] = '\0';
}

static void cfg_choices_text(const char *const *choices, char *buf, size_t n)
{
	size_t j = 0;
	buf[0] = '\0';
	for (const char *const *c = choices; *c && j < n; c++)
		j += (size_t)snprintf(buf + j, n - j, "%s%s", c == choices ? "" : " | ", *c);
}

/* The constraint alone, as shown in --help: ">= 1", "-1 or in [0, 1]", "linear | sqrt". */
void cfg_constraint_text(const struct cfg_key *k, char *buf, size_t n)
{
	char r[96];
	buf[0] = '\0';
	if (k->type == CONFIG_STRING && k->choices) {
		cfg_choices_text(k->choices, buf, n);
	} else if (k->type == CONFIG_INT || k->type == CONFIG_FLOAT) {
		cfg_range_text(&k->range, r, sizeof(r));
		snprintf(buf, n, "%s%s", k->range.minus_one_ok ? "-1 or " : "", r);
	}
}

/* What the key expects, completing "expected ...": "an integer >= 1", "one of a | b". */
static void cfg_expect_text(const struct cfg_key *k, char *buf, size_t n)
{
	char c[192];
	if (k->type == CONFIG_STRING && k->list) {
		if (k->choices)
			cfg_choices_text(k->choices, c, sizeof(c));
		snprintf(buf, n, "a list of strings%s%s", k->choices ? " from " : "",
		         k->choices ? c : "");
	} else if (k->type == CONFIG_STRING && k->choices) {
		cfg_choices_text(k->choices, c, sizeof(c));
		snprintf(buf, n, "one of %s", c);
	} else if (k->type == CONFIG_INT || k->type == CONFIG_FLOAT) {
		cfg_range_text(&k->range, c, sizeof(c));
		snprintf(buf, n, "%s%s%s%s", k->range.minus_one_ok ? "-1 or " : "",
		         cfg_type_nouns[k->type], c[0] ? " " : "", c);
	} else {
		snprintf(buf, n, "%s", cfg_type_nouns[k->type]);
	}
}

/* Edit distance, for "did you mean"; names longer than 63 bytes are compared cut. */
static size_t cfg_distance(const char *a, size_t na, const char *b, size_t nb)
{
	size_t row[64], prev_diag;
	if (na > 63)
		na = 63;
	if (nb > 63)
		nb = 63;
	for (size_t j = 0; j <= nb; j++)
		row[j] = j;
	for (size_t i = 1; i <= na; i++) {
		prev_diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= nb; j++) {
			size_t up = row[j];
			size_t best = prev_diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			prev_diag = up;
			row[j] = best;
		}
	}
	return row[nb];
}

static bool cfg_close_enough(size_t d, size_t len)
{
	return d <= 3 && 2 * d < len + 1;
}

/* The closest section name, or NULL. */
static const char *cfg_suggest_section(const char *s, size_t n)
{
	const char *best = NULL;
	size_t best_d = (size_t)-1;
	for (size_t i = 0; i < CFG_N_SECTIONS; i++) {
		size_t d = cfg_distance(s, n, cfg_sections[i], strlen(cfg_sections[i]));
		if (d < best_d && cfg_close_enough(d, strlen(cfg_sections[i]))) {
			best = cfg_sections[i];
			best_d = d;
		}
	}
	return best;
}

/* The closest key to sec.key: the same key name in another section, else the nearest
 * "section.key" by edit distance; NULL if nothing is close. */
static const struct cfg_key *cfg_suggest_key(const char *sec, size_t sn, const char *key, size_t kn)
{
	char want[160], have[160];
	const struct cfg_key *best = NULL;
	size_t best_d = (size_t)-1;
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strlen(CFG_KEYS[i].name) == kn && memcmp(CFG_KEYS[i].name, key, kn) == 0)
			return &CFG_KEYS[i];
	int nw = snprintf(want, sizeof(want), "%.*s.%.*s", (int)(sn < 64 ? sn : 64), sec,
	                  (int)(kn < 64 ? kn : 64), key);
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		int nh =
		    snprintf(have, sizeof(have), "%s.%s", CFG_KEYS[i].section, CFG_KEYS[i].name);
		size_t d = cfg_distance(want, (size_t)nw, have, (size_t)nh);
		if (d < best_d && cfg_close_enough(d, (size_t)nh)) {
			best = &CFG_KEYS[i];
			best_d = d;
		}
	}
	return best;
}

static int cfg_unknown_section(const struct cfg_where *w, const char *s, size_t n)
{
	char shown[80], all[256] = "";
	const char *hint = cfg_suggest_section(s, n);
	size_t j = 0;
	for (size_t i = 0; i < CFG_N_SECTIONS; i++)
		j += (size_t)snprintf(all + j, sizeof(all) - j, "%s%s", i ? ", " : "",
		                      cfg_sections[i]);
	cfg_snippet(s, n, 64, shown, sizeof(shown));
	if (hint)
		return cfg_fail(w, "unknown section '%s' (did you mean '%s'?)", shown, hint);
	return cfg_fail(w, "unknown section '%s'; the sections are %s", shown, all);
}

static int cfg_unknown_key(const struct cfg_where *w, const char *sec, const char *key, size_t kn)
{
	char shown[80], all[1024] = "";
	const struct cfg_key *hint = cfg_suggest_key(sec, strlen(sec), key, kn);
	size_t j = 0;
	cfg_snippet(key, kn, 64, shown, sizeof(shown));
	if (hint)
		return cfg_fail(w, "unknown key '%s.%s' (did you mean '%s.%s'?)", sec, shown,
		                hint->section, hint->name);
	for (size_t i = 0; i < CFG_N_KEYS && j < sizeof(all); i++)
		if (strcmp(CFG_KEYS[i].section, sec) == 0)
			j += (size_t)snprintf(all + j, sizeof(all) - j, "%s%s", j ? ", " : "",
			                      CFG_KEYS[i].name);
	return cfg_fail(w, "unknown key '%s.%s'; the keys of [%s] are %s", sec, shown, sec, all);
}


/* ------------------------------------------------------------------------------------------
 * Assignment: the one place a value reaches a field.
 */

static bool cfg_in_range(const struct config_range *r, double x)
{
	if (isnan(x))
		return false;
	if (r->minus_one_ok && x == -1)
		return true;
	if ((r->lo_kind == CONFIG_BOUND_INCL && !(x >= r->lo)) ||
	    (r->lo_kind == CONFIG_BOUND_EXCL && !(x > r->lo)))
		return false;
	if ((r->hi_kind == CONFIG_BOUND_INCL && !(x <= r->hi)) ||
	    (r->hi_kind == CONFIG_BOUND_EXCL && !(x < r->hi)))
		return false;
	return true;
}

static bool cfg_is_choice(const char *const *choices, const char *s)
{
	for (const char *const *c = choices; *c; c++)
		if (strcmp(*c, s) == 0)
			return true;
	return false;
}

/* Describes v for "got ...": '"exp"', '1.5', 'true'. */
static void cfg_value_text(const struct cfg_value *v, char *buf, size_t n)
{
	char s[80];
	switch (v->kind) {
	case VAL_STRING:
		cfg_snippet(v->s, v->len < sizeof(v->s) ? v->len : sizeof(v->s) - 1, 60, s,
		            sizeof(s));
		snprintf(buf, n, "\"%s\"", s);
		break;
	case VAL_BOOL:
		snprintf(buf, n, "%s", v->b ? "true" : "false");
		break;
	case VAL_ARRAY:
		snprintf(buf, n, "an array");
		break;
	default:
		snprintf(buf, n, "%s", v->text);
		break;
	}
}

static int cfg_type_error(const struct cfg_where *w, const struct cfg_key *k,
                          const struct cfg_value *v, const char *want)
{
	char got[96];
	cfg_value_text(v, got, sizeof(got));
	if (v->kind == VAL_INVALID) {
		const char *note = v->note;
		if (!note && k->type == CONFIG_STRING && w->line > 0)
			note = "strings need quotes in a TOML file";
		return cfg_fail(w, "%s.%s: expected %s, got '%s'%s%s%s", k->section, k->name, want,
		                got, note ? " (" : "", note ? note : "", note ? ")" : "");
	}
	if (v->kind == VAL_ARRAY)
		return cfg_fail(w, "%s.%s: expected %s, got an array", k->section, k->name, want);
	return cfg_fail(w, "%s.%s: expected %s, got %s (%s)", k->section, k->name, want,
	                cfg_vkind_nouns[v->kind], got);
}

/* A list key: v->s holds the elements joined by ','; each must be a choice (if any). */
static int cfg_assign_list(void *field, const struct cfg_key *k, const struct cfg_value *v,
                           const struct cfg_where *w, const char *want)
{
	if (v->len >= k->size)
		return cfg_fail(w, "%s.%s: list too long (%zu bytes; at most %zu)", k->section,
		                k->name, v->len, k->size - 1);
	const char *p = v->s;
	while (k->choices && *p) {
		const char *e = strchr(p, ',');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		char one[CONFIG_STR_MAX];
		snprintf(one, sizeof(one), "%.*s", (int)n, p);
		if (!cfg_is_choice(k->choices, one))
			return cfg_fail(w, "%s.%s: expected %s, got \"%s\"", k->section, k->name,
			                want, one);
		p += n + (e ? 1 : 0);
	}
	memset(field, 0, k->size);
	memcpy(field, v->s, v->len);
	return 0;
}

static int cfg_assign(struct ct_config *cfg, const struct cfg_key *k, const struct cfg_value *v,
                      const struct cfg_where *w)
{
	char want[256], got[96];
	void *field = cfg_field(cfg, k);
	double x;
	cfg_expect_text(k, want, sizeof(want));
	cfg_value_text(v, got, sizeof(got));
	switch (k->type) {
	case CONFIG_STRING:
		if (k->list && v->kind == VAL_ARRAY && v->strings)
			return cfg_assign_list(field, k, v, w, want);
		if (v->kind != VAL_STRING)
			return cfg_type_error(w, k, v, want);
		if (k->list)
			return cfg_assign_list(field, k, v, w, want);
		if (v->len >= k->size)
			return cfg_fail(w, "%s.%s: string too long (%zu bytes; at most %zu)",
			                k->section, k->name, v->len, k->size - 1);
		if (k->choices && !cfg_is_choice(k->choices, v->s))
			return cfg_fail(w, "%s.%s: expected %s, got %s", k->section, k->name, want,
			                got);
		memset(field, 0, k->size);
		memcpy(field, v->s, v->len);
		return 0;
	case CONFIG_INT:
		if (v->kind != VAL_INTEGER)
			return cfg_type_error(w, k, v, want);
		if (!cfg_in_range(&k->range, (double)v->i))
			return cfg_fail(w, "%s.%s: expected %s, got %s", k->section, k->name, want,
			                got);
		memcpy(field, &v->i, sizeof(v->i));
		return 0;
	case CONFIG_FLOAT:
		if (v->kind != VAL_INTEGER && v->kind != VAL_FLOAT)
			return cfg_type_error(w, k, v, want);
		x = v->kind == VAL_INTEGER ? (double)v->i : v->f;
		if (!cfg_in_range(&k->range, x))
			return cfg_fail(w, "%s.%s: expected %s, got %s", k->section, k->name, want,
			                got);
		memcpy(field, &x, sizeof(x));
		return 0;
	case CONFIG_BOOL:
		if (v->kind != VAL_BOOL)
			return cfg_type_error(w, k, v, want);
		memcpy(field, &v->b, sizeof(v->b));
		return 0;
	case CONFIG_TYPE_COUNT:
		break;
	}
	CHECK(0, "bad type %d for %s.%s", (int)k->type, k->section, k->name);
}

/* A value as written on the command line (and in the schema's defaults): strings as they
 * are, everything else as a TOML literal. */
int cfg_assign_text(struct ct_config *cfg, const struct cfg_key *k, const char *text,
                    const struct cfg_where *w)
{
	struct cfg_value v = {.kind = VAL_INVALID};
	char want[256], here[64];
	struct cfg_parser ps = {.p = text, .end = text + strlen(text)};
	if (k->type == CONFIG_STRING && !(k->list && text[0] == '[')) {
		for (const char *c = text; *c; c++)
			if ((unsigned char)*c < 0x20 ? *c != '\t' : *c == 0x7f)
				return cfg_fail(w, "%s.%s: control character 0x%02x in a string",
				                k->section, k->name, (unsigned char)*c);
		v.kind = VAL_STRING;
		v.len = strlen(text);
		memcpy(v.s, text, v.len < sizeof(v.s) ? v.len : sizeof(v.s) - 1);
		cfg_string_end(&v);
		return cfg_assign(cfg, k, &v, w);
	}
	cfg_expect_text(k, want, sizeof(want));
	cfg_skip_ws(&ps);
	if (ps.p >= ps.end)
		return cfg_fail(w, "%s.%s: empty value; expected %s", k->section, k->name, want);
	if (cfg_parse_value(&ps, &v, 0))
		return cfg_fail(w, "%s.%s: %s; expected %s", k->section, k->name, ps.err, want);
	cfg_skip_ws(&ps);
	if (ps.p < ps.end) {
		cfg_here(&ps, here, sizeof(here));
		return cfg_fail(w, "%s.%s: unexpected %s after the value; expected %s", k->section,
		                k->name, here, want);
	}
	return cfg_assign(cfg, k, &v, w);
}

/* ------------------------------------------------------------------------------------------
 * Files
 */

struct cfg_file_state {
	int section;                      /* index in cfg_sections, -1 before the first header */
	int section_line[CFG_MAX_SECTIONS]; /* where each section was opened, 0 if not yet */
	int key_line[CFG_MAX_KEYS];         /* where each key was set, 0 if not yet */
	const char *name;
};

/* After a line's content: whitespace, an optional comment, then the end of the line. */
static int cfg_end_line(struct cfg_parser *ps, const char *after)
{
	char here[64];
	cfg_skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '#')
		while (ps->p < ps->end && *ps->p != '\n')
			ps->p++;
	if (ps->p >= ps->end)
		return 0;
	if (*ps->p == '\n') {
		ps->p++;
		ps->line++;
		return 0;
	}
	if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') {
		ps->p += 2;
		ps->line++;
		return 0;
	}
	cfg_here(ps, here, sizeof(here));
	return cfg_syntax(ps, "unexpected %s%s%s", here, after ? " after " : "",
	                  after ? after : "");
}

static int cfg_parse_header(struct cfg_parser *ps, struct cfg_file_state *st)
{
	struct cfg_where w = {st->name, ps->line};
	char here[64], shown[80];
	ps->p++;
	if (ps->p < ps->end && *ps->p == '[')
		return cfg_syntax(ps, "arrays of tables ([[...]]) are not supported");
	cfg_skip_ws(ps);
	const char *name = ps->p;
	while (ps->p < ps->end && cfg_is_bare(*ps->p))
		ps->p++;
	size_t n = (size_t)(ps->p - name);
	if (n == 0) {
		if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\''))
			return cfg_syntax(ps, "quoted section names are not supported");
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "expected a section name after '[', got %s", here);
	}
	/* dotted names: only the sections that have them ([quantize.linear.float8]) */
	while (ps->p + 1 < ps->end && *ps->p == '.' && cfg_is_bare(ps->p[1])) {
		ps->p++;
		while (ps->p < ps->end && cfg_is_bare(*ps->p))
			ps->p++;
	}
	n = (size_t)(ps->p - name);
	cfg_snippet(name, n, 64, shown, sizeof(shown));
	cfg_skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '.')
		return cfg_syntax(ps, "nested sections ([%s.x]) are not supported", shown);
	if (ps->p >= ps->end || *ps->p != ']')
		return cfg_syntax(ps, "unterminated section header '[%s' (missing ']')", shown);
	ps->p++;
	int idx = cfg_section_index(name, n);
	if (idx < 0 && memchr(name, '.', n))
		return cfg_syntax(ps, "nested sections ([%s]) are not supported (the dotted one is "
		                      "[quantize.linear.float8])", shown);
	if (idx < 0)
		return cfg_unknown_section(&w, name, n);
	if (st->section_line[idx])
		return cfg_fail(&w, "section [%s] appears twice (first at line %d)", shown,
		                st->section_line[idx]);
	st->section_line[idx] = ps->line;
	st->section = idx;
	return 0;
}

/* The section holding a key of that name, if exactly one does. */
static const char *cfg_section_of(const char *key, size_t n)
{
	const char *found = NULL;
	for (size_t i = 0; i < CFG_N_KEYS; i++)
		if (strlen(CFG_KEYS[i].name) == n && memcmp(CFG_KEYS[i].name, key, n) == 0) {
			if (found && strcmp(found, CFG_KEYS[i].section) != 0)
				return NULL;
			found = CFG_KEYS[i].section;
		}
	return found;
}

static int cfg_parse_keyval(struct cfg_parser *ps, struct cfg_file_state *st, struct ct_config *cfg)
{
	struct cfg_where w = {st->name, ps->line};
	char here[64], shown[80], want[256];
	const char *key = ps->p;
	while (ps->p < ps->end && cfg_is_bare(*ps->p))
		ps->p++;
	size_t n = (size_t)(ps->p - key);
	if (n == 0) {
		if (*ps->p == '"' || *ps->p == '\'')
			return cfg_syntax(ps, "quoted keys are not supported");
		if (*ps->p == '=')
			return cfg_syntax(ps, "missing key before '='");
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "unexpected %s; expected 'key = value' or '[section]'", here);
	}
	cfg_snippet(key, n, 64, shown, sizeof(shown));
	cfg_skip_ws(ps);
	if (ps->p < ps->end && *ps->p == '.') {
		const char *rest = ps->p + 1;
		size_t rn = 0;
		while (rest + rn < ps->end && cfg_is_bare(rest[rn]))
			rn++;
		char rshown[80];
		cfg_snippet(rest, rn, 64, rshown, sizeof(rshown));
		return cfg_syntax(ps, "dotted keys are not supported; write '%s = ...' under [%s]",
		                  rshown, shown);
	}
	if (st->section < 0) {
		const char *sec = cfg_section_of(key, n);
		return cfg_syntax(ps, "key '%s' before any [section] header%s%s%s", shown,
		                  sec ? " (it belongs under [" : "", sec ? sec : "",
		                  sec ? "])" : "");
	}
	const char *sec = cfg_sections[st->section];
	if (ps->p >= ps->end || *ps->p != '=') {
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "missing '=' after key '%s' (got %s)", shown, here);
	}
	ps->p++;
	int idx = cfg_key_index(sec, key, n);
	if (idx < 0)
		return cfg_unknown_key(&w, sec, key, n);
	const struct cfg_key *k = &CFG_KEYS[idx];
	if (st->key_line[idx])
		return cfg_fail(&w, "duplicate key '%s.%s' (first set at line %d)", k->section,
		                k->name, st->key_line[idx]);
	st->key_line[idx] = ps->line;
	cfg_skip_ws(ps);
	cfg_expect_text(k, want, sizeof(want));
	if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '#')
		return cfg_fail(&w, "%s.%s: missing value after '='; expected %s", k->section,
		                k->name, want);
	struct cfg_value v;
	if (cfg_parse_value(ps, &v, 0)) {
		struct cfg_where we = {st->name, ps->err_line};
		return cfg_fail(&we, "%s.%s: %s", k->section, k->name, ps->err);
	}
	return cfg_assign(cfg, k, &v, &w);
}

/* Parses a whole document into *cfg, which the caller commits only on success. */
static int cfg_parse_document(struct ct_config *cfg, const char *text, size_t len, const char *name)
{
	struct cfg_parser ps = {.p = text, .end = text + len, .line = 1};
	struct cfg_file_state st = {.section = -1, .name = name};
	CHECK(CFG_N_KEYS <= CFG_MAX_KEYS && CFG_N_SECTIONS <= CFG_MAX_SECTIONS, "schema too large");
	if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
		ps.p += 3; /* UTF-8 byte order mark */
	while (ps.p < ps.end) {
		const char *after = NULL;
		int rc = 0;
		cfg_skip_ws(&ps);
		if (ps.p < ps.end && *ps.p != '#' && *ps.p != '\n' && *ps.p != '\r') {
			if (*ps.p == '[') {
				rc = cfg_parse_header(&ps, &st);
				after = "the section header";
			} else {
				rc = cfg_parse_keyval(&ps, &st, cfg);
				after = "the value";
			}
		}
		if (rc == 0)
			rc = cfg_end_line(&ps, after);
		if (rc == CT_ERR_USAGE)
			return rc; /* already reported */
		if (rc) {
			struct cfg_where w = {name, ps.err_line ? ps.err_line : ps.line};
			return cfg_fail(&w, "%s", ps.err);
		}
	}
	return 0;
}

int config_load_string(struct ct_config *cfg, const char *text, size_t len, const char *name)
{
	struct ct_config *tmp = xcalloc(1, sizeof(*tmp));
	memcpy(tmp, cfg, sizeof(*tmp));
	int rc = cfg_parse_document(tmp, text, len, name);
	if (rc == 0)
		memcpy(cfg, tmp, sizeof(*tmp));
	free(tmp);
	return rc;
}

#define CFG_FILE_MAX (16 << 20)

int config_load_file(struct ct_config *cfg, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		LOG_ERROR("%s: cannot open config file: %s", path, strerror(errno));
		return CT_ERR_USAGE;
	}
	size_t cap = 4096, len = 0;
	char *buf = xcalloc(cap, 1);
	int rc = 0;
	for (;;) {
		if (len == cap) {
			if (cap >= CFG_FILE_MAX) {
				LOG_ERROR("%s: config file larger than %d MiB", path,
				          CFG_FILE_MAX >> 20);
				rc = CT_ERR_USAGE;
				goto out_free;
			}
			cap *= 2;
			char *grown = realloc(buf, cap);
			CHECK(grown, "out of memory reading %s", path);
			buf = grown;
		}
		size_t got = fread(buf + len, 1, cap - len, f);
		len += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		LOG_ERROR("%s: cannot read config file: %s", path, strerror(errno));
		rc = CT_ERR_USAGE;
		goto out_free;
	}
	rc = config_load_string(cfg, buf, len, path);
out_free:
	free(buf);
	fclose(f);
	return rc;
}

/* ------------------------------------------------------------------------------------------
 * Command line
 */

/* The row of "section.key" as written after "--", or -1 after saying why there is none. */
static int cfg_arg_key(const char *name, size_t n, const struct cfg_where *w)
{
	char shown[80];
	const char *dot = NULL; /* the last '.': keys have none, sections may */
	for (size_t i = 0; i < n; i++)
		if (name[i] == '.')
			dot = name + i;
	int idx = -1;
	if (n == 0) {
		cfg_fail(w, "expected --section.key=value or --section.key value");
		return -1;
	}
	cfg_snippet(name, n, 64, shown, sizeof(shown));
	if (!dot) {
		const struct cfg_key *hint = cfg_suggest_key("", 0, name, n);
		if (hint)
			cfg_fail(w, "key '%s' has no section (did you mean '--%s.%s'?)", shown,
			         hint->section, hint->name);
		else
			cfg_fail(w, "key '%s' has no section; expected --section.key=value", shown);
		return -1;
	}
	size_t sn = (size_t)(dot - name);
	int sec = cfg_section_index(name, sn);
	if (sec < 0)
		cfg_unknown_section(w, name, sn);
	else if ((idx = cfg_key_index(cfg_sections[sec], dot + 1, n - sn - 1)) < 0)
		cfg_unknown_key(w, cfg_sections[sec], dot + 1, n - sn - 1);
	return idx;
}

static int cfg_apply_args(struct ct_config *cfg, int argc, char **argv)
{
	char joined[1024];
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		struct cfg_where w = {a, 0};
		if (strncmp(a, "--", 2) != 0)
			return cfg_fail(&w,
			                "unexpected argument; overrides are --section.key=value "
			                "or --section.key value");
		const char *name = a + 2, *eq = strchr(name, '='), *val;
		int idx = cfg_arg_key(name, eq ? (size_t)(eq - name) : strlen(name), &w);
		if (idx < 0)
			return CT_ERR_USAGE;
		if (eq) {
			val = eq + 1;
		} else {
			if (i + 1 >= argc)
				return cfg_fail(&w, "missing value (write %s=VALUE or %s VALUE)", a,
				                a);
			if (strncmp(argv[i + 1], "--", 2) == 0)
				return cfg_fail(&w,
				                "missing value: the next argument '%s' is an "
				                "option (write %s=VALUE)",
				                argv[i + 1], a);
			val = argv[++i];
			snprintf(joined, sizeof(joined), "%s %s", a, val);
			w.name = joined;
		}
		int rc = cfg_assign_text(cfg, &CFG_KEYS[idx], val, &w);
		if (rc)
			return rc;
	}
	return 0;
}

int config_apply_args(struct ct_config *cfg, int argc, char **argv)
{
	struct ct_config *tmp = xcalloc(1, sizeof(*tmp));
	memcpy(tmp, cfg, sizeof(*tmp));
	int rc = cfg_apply_args(tmp, argc, argv);
	if (rc == 0)
		memcpy(cfg, tmp, sizeof(*tmp));
	free(tmp);
	return rc;
}

/* ------------------------------------------------------------------------------------------
 * Defaults and validation
 */

/* The schema's own invariants; cheap, so checked every time defaults are built. */
static void cfg_schema_check(void)
{
	CHECK(CFG_N_KEYS <= CFG_MAX_KEYS && CFG_N_SECTIONS <= CFG_MAX_SECTIONS,
	      "schema: %zu keys in %zu sections: raise CFG_MAX_KEYS / CFG_MAX_SECTIONS", CFG_N_KEYS,
	      CFG_N_SECTIONS);
	int last_section = 0;
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		const struct cfg_key *k = &CFG_KEYS[i];
		int s = cfg_section_index(k->section, strlen(k->section));
		CHECK(s >= (i < cfg_n_keys ? last_section : 0),
		      "schema: %s.%s: unknown section or rows out of order", k->section, k->name);
		if (i < cfg_n_keys) /* the schema's rows are grouped by section; added ones not */
			last_section = s;
		CHECK(cfg_key_index(k->section, k->name, strlen(k->name)) == (int)i,
		      "schema: %s.%s appears twice", k->section, k->name);
		CHECK(k->type != CONFIG_STRING || (k->size >= 2 && k->size <= CONFIG_STR_MAX),
		      "schema: %s.%s: bad string size %zu", k->section, k->name, k->size);
		CHECK(!k->choices || k->type == CONFIG_STRING,
		      "schema: %s.%s: choices on a non-string", k->section, k->name);
		CHECK(k->def && k->help, "schema: %s.%s: no default or help", k->section, k->name);
	}
}

void config_defaults(struct ct_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg_schema_check();
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		const struct cfg_key *k = &CFG_KEYS[i];
		struct cfg_where w = {"schema default", 0};
		int rc = cfg_assign_text(cfg, k, k->def, &w);
		CHECK(rc == 0, "schema: default of %s.%s is invalid", k->section, k->name);
	}
}

/* One field of a struct that may have been filled by code rather than by this module. */
static int cfg_validate_field(const struct ct_config *cfg, const struct cfg_key *k)
{
	const struct cfg_where w = {"config", 0};
	const void *field = cfg_field_const(cfg, k);
	char want[256];
	cfg_expect_text(k, want, sizeof(want));
	if (k->type == CONFIG_STRING) {
		const char *s = field;
		size_t len = strnlen(s, k->size);
		if (len == k->size)
			return cfg_fail(&w, "%s.%s: string not terminated", k->section, k->name);
		for (size_t j = 0; j < len; j++) {
			unsigned char c = (unsigned char)s[j];
			if ((c < 0x20 && !strchr("\b\t\n\f\r", c)) || c == 0x7f)
				return cfg_fail(&w, "%s.%s: control character 0x%02x in a string",
				                k->section, k->name, c);
		}
		if (k->choices && !k->list && !cfg_is_choice(k->choices, s))
			return cfg_fail(&w, "%s.%s: expected %s, got \"%s\"", k->section, k->name,
			                want, s);
	} else if (k->type == CONFIG_INT) {
		int64_t v;
		memcpy(&v, field, sizeof(v));
		if (!cfg_in_range(&k->range, (double)v))
			return cfg_fail(&w, "%s.%s: expected %s, got %lld", k->section, k->name,
			                want, (long long)v);
	} else if (k->type == CONFIG_FLOAT) {
		double v;
		memcpy(&v, field, sizeof(v));
		if (!isfinite(v) || !cfg_in_range(&k->range, v))
			return cfg_fail(&w, "%s.%s: expected %s, got %g", k->section, k->name, want,
			                v);
	}
	return 0;
}

int config_ac_every(const struct ct_config *cfg)
{
	const char *s = cfg->activation_checkpoint.selective_ac_option;
	if (strcmp(s, "op") == 0)
		return 0;
	char *end = NULL;
	errno = 0;
	long n = strtol(s, &end, 10);
	if (errno || end == s || *end != '\0' || !isdigit((unsigned char)s[0]) || n < 1 ||
	    n > 1000000)
		return -1;
	return (int)n;
}

/* Keys that would silently do nothing in this config are refused (exit 2, naming the key):
 * a setting the user believes in but the run ignores is worse than an error. */
static int cfg_validate_inert(const struct ct_config *cfg)
{
	const struct cfg_where w = {"config", 0};
	const struct ct_config *c = cfg;
	int rc = cfg_run_checks(cfg); /* the layers above: e.g. a family's keys */
	if (rc)
		return rc;
	if (strcmp(c->activation_checkpoint.mode, "selective") != 0 &&
	    strcmp(c->activation_checkpoint.selective_ac_option, "op") != 0)
		return cfg_fail(&w,
		                "activation_checkpoint.selective_ac_option: only read when "
		                "activation_checkpoint.mode = \"selective\" (this is \"%s\")",
		                c->activation_checkpoint.mode);
	if (c->validation.enable && strcmp(c->training.dataset, "synthetic") == 0)
		return cfg_fail(&w, "validation.enable: synthetic data has no validation split "
		                    "(use a dataset, or validation.enable = false)");
	if (!c->debug.deterministic)
		return cfg_fail(&w, "debug.deterministic = false is not supported: ctitan's runs "
		                    "are always deterministic");
	return 0;
}

int config_validate(const struct ct_config *cfg)
{
	const struct cfg_where w = {"config", 0};
	for (size_t i = 0; i < CFG_N_KEYS; i++) {
		int rc = cfg_validate_field(cfg, &CFG_KEYS[i]);
		if (rc)
			return rc;
	}
	if (cfg->job.dump_folder[0] == '\0')
		return cfg_fail(&w, "job.dump_folder: must not be empty");
	if (cfg->training.dataset[0] == '\0')
		return cfg_fail(&w,
		                "training.dataset: must not be empty (\"synthetic\" or a path)");
	if (cfg->checkpoint.exclude_from_loading[0]) {
		char buf[CONFIG_STR_MAX], *save = NULL;
		snprintf(buf, sizeof(buf), "%s", cfg->checkpoint.exclude_from_loading);
		for (char *p = strtok_r(buf, ", ", &save); p; p = strtok_r(NULL, ", ", &save))
			if (strcmp(p, "optimizer") && strcmp(p, "lr_scheduler") &&
			    strcmp(p, "dataloader") && strcmp(p, "train_state"))
				return cfg_fail(
				    &w,
				    "checkpoint.exclude_from_loading: unknown part '%s' "
				    "(expected optimizer, lr_scheduler, dataloader or "
				    "train_state)",
				    p);
	}
	if (cfg->checkpoint.initial_load_in_hf && !cfg->checkpoint.initial_load_path[0])
		return cfg_fail(&w, "checkpoint.initial_load_in_hf needs "
		                    "checkpoint.initial_load_path");
	/* Divisibility by local * dp needs the world size and is the trainer's; dividing by
	 * local alone is necessary for it and known now. */
	if (cfg->training.global_batch_size != -1 &&
	    cfg->training.global_batch_size % cfg->training.local_batch_size != 0)
		return cfg_fail(&w,
		                "training.global_batch_size (%lld) must be -1 or a multiple of "
		                "training.local_batch_size (%lld)",
		                (long long)cfg->training.global_batch_size,
		                (long long)cfg->training.local_batch_size);
	if (strcmp(cfg->activation_checkpoint.mode, "selective") == 0 &&
	    config_ac_every(cfg) < 0)
		return cfg_fail(&w,
		                "activation_checkpoint.selective_ac_option: '%s' is neither \"op\" "
		                "(the per-op policy) nor a positive integer N (full checkpointing "
		                "on every N-th block)",
		                cfg->activation_checkpoint.selective_ac_option);
	int rc = cfg_validate_inert(cfg);
	if (rc)
		return rc;
	/* Ranks are an int in MPI: the fixed degrees must multiply to something that fits. */
	const struct ct_config *c = cfg;
	int64_t degrees[] = {c->parallelism.data_parallel_replicate_degree,
	                     c->parallelism.tensor_parallel_degree,
	                     c->parallelism.pipeline_parallel_degree,
	                     c->parallelism.context_parallel_degree,
	                     c->parallelism.data_parallel_shard_degree == -1
	                         ? 1
	                         : c->parallelism.data_parallel_shard_degree};
	int64_t ranks = 1;
	for (size_t i = 0; i < ARRAY_SIZE(degrees); i++) {
		if (degrees[i] > INT32_MAX / ranks)
			return cfg_fail(&w,
			                "parallelism: the degrees multiply to more than %d ranks",
			                INT32_MAX);
		ranks *= degrees[i];
	}
	return 0;
}
