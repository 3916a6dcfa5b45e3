/* io/config_impl.h: internals shared by io/config.c (lookup, messages, assignment, files,
 * command line, defaults and validation), io/config_schema.c (the schema table: one row per
 * key), io/config_toml.c (the TOML subset's literals) and io/config_print.c (printing, help).
 * Not part of the io/ interface. */
#ifndef CT_IO_CONFIG_IMPL_H
#define CT_IO_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/config.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the schema (config_schema.c) ---- */

struct cfg_key {
	const char *section;
	const char *name;
	enum config_type type;
	size_t offset;
	size_t size;                /* bytes of the field; a string holds size - 1 bytes */
	const char *def;            /* the default, written as on the command line */
	struct config_range range;  /* numbers only */
	const char *const *choices; /* strings only; NULL-terminated, or NULL for any string */
	bool list; /* strings only: a TOML array of strings (or a comma list), stored "a,b" */
	const char *help;
};

extern const char *const cfg_type_names[]; /* CONFIG_TYPE_COUNT of each */
extern const char *const cfg_type_nouns[]; /* "expected <noun>" */
extern const char *const cfg_sections[];   /* in printing order */
extern const size_t cfg_n_sections;
extern const struct cfg_key cfg_schema[]; /* the built-in rows, grouped by section */
extern const size_t cfg_n_keys;
#define CFG_N_SECTIONS cfg_n_sections
/* Every key: the schema's rows, then those added by the layers above (config_add_keys), in
 * the order they were added; built on first use (config.c). */
const struct cfg_key *cfg_key_table(void);
size_t cfg_key_count(void);
#define CFG_KEYS   cfg_key_table()
#define CFG_N_KEYS cfg_key_count()
/* Capacities for per-key arrays (the table's size is not a constant outside its file);
 * config_defaults checks the table fits. */
#define CFG_MAX_SECTIONS 32
#define CFG_MAX_KEYS     512

/* ---- messages (config.c) ---- */

struct cfg_where {
	const char *name; /* file name, or the command-line argument */
	int line;         /* 1-based; 0 for a command-line argument */
};

/* ---- the TOML subset's literals (config_toml.c) ---- */

enum cfg_vkind {
	VAL_STRING,
	VAL_INTEGER,
	VAL_FLOAT,
	VAL_BOOL,
	VAL_ARRAY,
	VAL_INVALID,
	VAL_KIND_COUNT
};

extern const char *const cfg_vkind_nouns[];

struct cfg_value {
	enum cfg_vkind kind;
	int64_t i;
	double f;
	bool b;
	char s[CONFIG_STR_MAX]; /* VAL_STRING: the first CONFIG_STR_MAX - 1 bytes */
	size_t len;             /* VAL_STRING, VAL_ARRAY of strings: the full length */
	bool strings;           /* VAL_ARRAY: every element is a string (s: them joined by ',') */
	char text[72];          /* the literal as written (numbers, invalid tokens) */
	const char *note;       /* VAL_INVALID: why, if more can be said than "got 'text'" */
};

/* Parse functions return 0, or -1 for a syntax error described in err but not yet reported
 * (the caller adds the place and the key), or CT_ERR_USAGE for an error already reported. */
struct cfg_parser {
	const char *p, *end;
	int line;      /* 0 when parsing a command-line value */
	char err[256]; /* the syntax error, when a parse function returns -1 */
	int err_line;
};

#define CFG_MAX_DEPTH 32

/* ---- shared functions ---- */

int cfg_section_index(const char *s, size_t n);                /* in cfg_sections, or -1 */
int cfg_key_index(const char *sec, const char *key, size_t n); /* in CFG_KEYS, or -1 */
/* Report an error at w (file:line or the argument); returns CT_ERR_USAGE. */
__attribute__((format(printf, 2, 3))) int cfg_fail(const struct cfg_where *w, const char *fmt, ...);
/* Assign a value written as on the command line (or as a schema default). */
int cfg_assign_text(struct ct_config *cfg, const struct cfg_key *k, const char *text,
                    const struct cfg_where *w);
/* The checks config_add_check added, in order (config_keys.c); 0 or the first error. */
int cfg_run_checks(const struct ct_config *cfg);

const void *cfg_field_const(const struct ct_config *cfg, const struct cfg_key *k);
void cfg_snippet(const char *s, size_t n, size_t max, char *buf, size_t size);
void cfg_constraint_text(const struct cfg_key *k, char *buf, size_t n);
__attribute__((format(printf, 2, 3))) int cfg_syntax(struct cfg_parser *ps, const char *fmt, ...);
bool cfg_is_bare(char c);
void cfg_skip_ws(struct cfg_parser *ps);
void cfg_here(const struct cfg_parser *ps, char *buf, size_t n);
void cfg_string_end(struct cfg_value *v);
int cfg_parse_value(struct cfg_parser *ps, struct cfg_value *v, int depth);

#endif
