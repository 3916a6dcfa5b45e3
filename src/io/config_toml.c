/* io/config_toml: the TOML subset's literals (strings, numbers, booleans, arrays), parsed
 * before anyone looks at what the key wants. Generic: no schema here. */
#include "io/config_impl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Values: the TOML subset's literals, parsed before we look at what the key wants.
 */

const char *const cfg_vkind_nouns[] = {"a string",  "an integer", "a float",
                                              "a boolean", "an array",   "an invalid value"};
_Static_assert(ARRAY_SIZE(cfg_vkind_nouns) == VAL_KIND_COUNT, "one noun per value kind");

__attribute__((format(printf, 2, 3))) int cfg_syntax(struct cfg_parser *ps, const char *fmt,
                                                            ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ps->err, sizeof(ps->err), fmt, ap);
	va_end(ap);
	if (!ps->err_line)
		ps->err_line = ps->line;
	return -1;
}

bool cfg_is_bare(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

/* Characters of an unquoted literal: numbers, booleans, and the words we reject. */
static bool cfg_is_token(char c)
{
	return cfg_is_bare(c) || c == '+' || c == '.';
}

void cfg_skip_ws(struct cfg_parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
		ps->p++;
}

/* Inside arrays: whitespace, newlines and comments. */
static int cfg_skip_ws_lines(struct cfg_parser *ps)
{
	for (;;) {
		cfg_skip_ws(ps);
		if (ps->p >= ps->end)
			return 0;
		if (*ps->p == '#') {
			while (ps->p < ps->end && *ps->p != '\n')
				ps->p++;
		} else if (*ps->p == '\n') {
			ps->p++;
			ps->line++;
		} else if (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n') {
			ps->p += 2;
			ps->line++;
		} else {
			return 0;
		}
	}
}

/* "'x'" for a message about the text at p (up to the end of the line). */
void cfg_here(const struct cfg_parser *ps, char *buf, size_t n)
{
	if (ps->p >= ps->end) {
		snprintf(buf, n, "end of input");
		return;
	}
	size_t len = 0;
	while (ps->p + len < ps->end && ps->p[len] != '\n' && ps->p[len] != '\r')
		len++;
	if (len == 0) {
		snprintf(buf, n, "%s", *ps->p == '\n' ? "end of line" : "carriage return");
		return;
	}
	if ((unsigned char)*ps->p < 0x20 || *ps->p == 0x7f) {
		snprintf(buf, n, "control character 0x%02x", (unsigned char)*ps->p);
		return;
	}
	char s[48];
	cfg_snippet(ps->p, len, 24, s, sizeof(s));
	snprintf(buf, n, "'%s'", s);
}

static void cfg_string_push(struct cfg_value *v, char c)
{
	if (v->len < sizeof(v->s) - 1)
		v->s[v->len] = c;
	v->len++;
}

void cfg_string_end(struct cfg_value *v)
{
	v->s[v->len < sizeof(v->s) - 1 ? v->len : sizeof(v->s) - 1] = '\0';
}

/* At the opening quote of "..." or '...'. TOML forbids raw control characters in both. */
static int cfg_parse_string(struct cfg_parser *ps, struct cfg_value *v)
{
	char quote = *ps->p;
	bool basic = quote == '"';
	ps->p++;
	v->kind = VAL_STRING;
	v->len = 0;
	if (ps->end - ps->p >= 2 && ps->p[0] == quote && ps->p[1] == quote)
		return cfg_syntax(ps, "multi-line strings (%c%c%c) are not supported", quote, quote,
		                  quote);
	for (;;) {
		if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r')
			return cfg_syntax(ps, "unterminated string (missing closing %c)", quote);
		unsigned char c = (unsigned char)*ps->p++;
		if (c == (unsigned char)quote)
			break;
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return cfg_syntax(ps, "control character 0x%02x in a string", c);
		if (!basic || c != '\\') {
			cfg_string_push(v, (char)c);
			continue;
		}
		if (ps->p >= ps->end)
			return cfg_syntax(ps, "unterminated string (missing closing %c)", quote);
		char e = *ps->p++;
		switch (e) {
		case 'b':
			cfg_string_push(v, '\b');
			break;
		case 't':
			cfg_string_push(v, '\t');
			break;
		case 'n':
			cfg_string_push(v, '\n');
			break;
		case 'f':
			cfg_string_push(v, '\f');
			break;
		case 'r':
			cfg_string_push(v, '\r');
			break;
		case '"':
			cfg_string_push(v, '"');
			break;
		case '\\':
			cfg_string_push(v, '\\');
			break;
		case 'u':
		case 'U':
			return cfg_syntax(ps,
			                  "\\%c escapes are not supported; write the character "
			                  "itself (UTF-8)",
			                  e);
		default: {
			char s[8];
			cfg_snippet(&e, 1, 1, s, sizeof(s));
			return cfg_syntax(ps,
			                  "invalid escape '\\%s' in a string (valid: \\b \\t \\n "
			                  "\\f \\r \\\" \\\\)",
			                  s);
		}
		}
	}
	cfg_string_end(v);
	return 0;
}

/* Digits with single underscores between them; at least one digit. */
static const char *cfg_scan_digits(const char *s)
{
	if (!(*s >= '0' && *s <= '9'))
		return NULL;
	while ((*s >= '0' && *s <= '9') || (*s == '_' && s[1] >= '0' && s[1] <= '9'))
		s++;
	return s;
}

/* Classifies an unquoted token (NUL-terminated, underscores and all) into v. */
static void cfg_classify(const char *t, struct cfg_value *v)
{
	v->kind = VAL_INVALID;
	v->note = NULL;
	if (strcmp(t, "true") == 0 || strcmp(t, "false") == 0) {
		v->kind = VAL_BOOL;
		v->b = t[0] == 't';
		return;
	}
	const char *s = t + (t[0] == '+' || t[0] == '-');
	if (strcmp(s, "inf") == 0 || strcmp(s, "nan") == 0) {
		v->note = "inf and nan are not allowed";
		return;
	}
	const char *q = cfg_scan_digits(s);
	if (!q)
		return;
	if (s[0] == '0' && q - s > 1) {
		v->note = "leading zeros are not allowed";
		return;
	}
	bool is_float = false;
	if (*q == '.') {
		q = cfg_scan_digits(q + 1);
		if (!q)
			return;
		is_float = true;
	}
	if (*q == 'e' || *q == 'E') {
		q++;
		q += *q == '+' || *q == '-';
		q = cfg_scan_digits(q);
		if (!q)
			return;
		is_float = true;
	}
	if (*q)
		return;

	char clean[72];
	size_t n = 0;
	for (const char *c = t; *c; c++)
		if (*c != '_')
			clean[n++] = *c;
	clean[n] = '\0';
	errno = 0;
	if (is_float) {
		v->f = strtod(clean, NULL);
		if (isinf(v->f)) {
			v->note = "too large for a double";
			return;
		}
		v->kind = VAL_FLOAT;
	} else {
		v->i = strtoll(clean, NULL, 10);
		if (errno == ERANGE) {
			v->note = "does not fit in 64 bits";
			return;
		}
		v->kind = VAL_INTEGER;
	}
}


/* At '['. String elements are kept joined by ',' in v->s (list keys take them); other
 * elements are parsed for TOML's sake and dropped (v->strings false). */
static int cfg_parse_array(struct cfg_parser *ps, struct cfg_value *v, int depth)
{
	int start_line = ps->line;
	struct cfg_value elem;
	char here[64];
	if (depth >= CFG_MAX_DEPTH)
		return cfg_syntax(ps, "arrays nested deeper than %d", CFG_MAX_DEPTH);
	ps->p++;
	v->kind = VAL_ARRAY;
	v->strings = true;
	v->len = 0;
	v->s[0] = '\0';
	for (;;) {
		if (cfg_skip_ws_lines(ps))
			return -1;
		if (ps->p >= ps->end)
			goto unterminated;
		if (*ps->p == ']') {
			ps->p++;
			return 0;
		}
		if (cfg_parse_value(ps, &elem, depth + 1))
			return -1;
		if (elem.kind == VAL_INVALID)
			return cfg_syntax(ps, "invalid value '%s' in an array%s%s", elem.text,
			                  elem.note ? ": " : "", elem.note ? elem.note : "");
		if (elem.kind != VAL_STRING || strchr(elem.s, ',')) {
			v->strings = false;
		} else if (v->strings) {
			size_t add = elem.len + (v->len ? 1 : 0);
			if (v->len + add < sizeof(v->s))
				snprintf(v->s + v->len, sizeof(v->s) - v->len, "%s%s",
				         v->len ? "," : "", elem.s);
			v->len += add;
		}
		cfg_skip_ws_lines(ps);
		if (ps->p >= ps->end)
			goto unterminated;
		if (*ps->p == ',') {
			ps->p++;
		} else if (*ps->p == ']') {
			ps->p++;
			return 0;
		} else {
			cfg_here(ps, here, sizeof(here));
			if (ps->line > start_line)
				return cfg_syntax(ps,
				                  "expected ',' or ']' in the array opened at "
				                  "line %d, got %s",
				                  start_line, here);
			return cfg_syntax(ps, "expected ',' or ']' in an array, got %s", here);
		}
	}
unterminated:
	ps->err_line = start_line;
	return cfg_syntax(ps, "unterminated array (missing ']')");
}

int cfg_parse_value(struct cfg_parser *ps, struct cfg_value *v, int depth)
{
	char here[64];
	v->note = NULL;
	v->text[0] = '\0';
	if (ps->p >= ps->end || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '#')
		return cfg_syntax(ps, "missing value");
	if (*ps->p == '"' || *ps->p == '\'')
		return cfg_parse_string(ps, v);
	if (*ps->p == '[')
		return cfg_parse_array(ps, v, depth);
	if (!cfg_is_token(*ps->p)) {
		cfg_here(ps, here, sizeof(here));
		return cfg_syntax(ps, "unexpected %s where a value should be", here);
	}
	const char *start = ps->p;
	while (ps->p < ps->end && cfg_is_token(*ps->p))
		ps->p++;
	size_t n = (size_t)(ps->p - start);
	cfg_snippet(start, n, 60, v->text, sizeof(v->text));
	if (n > 60) {
		v->kind = VAL_INVALID;
		v->note = "too long for a number";
		return 0;
	}
	cfg_classify(v->text, v);
	return 0;
}
