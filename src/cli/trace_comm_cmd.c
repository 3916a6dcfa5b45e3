/* ctitan trace-comm DIR
 *
 * Reads the flight recorder dumps every rank wrote (DIR/comm_traces/rank_N.json, or
 * DIR/rank_N.json; comm/flight.h) and, per group, matches collectives across its members by
 * sequence number. For each group it prints the first sequence number where something is
 * wrong: ranks that never entered it (their last sequence number on the group is lower) or
 * that wrote no dump (stopped, hung or dead: a stopped rank cannot write one), entries not
 * completed, or members that disagree on the op, the bytes or the element type (a
 * desynchronised rank). It then says what each rank it names was doing instead (its newest
 * entry and everything it had in flight), checks point-to-point transfers left open against
 * the peer's counts, and ends with one "diagnosis:" line per problem. Exit 0 with a
 * diagnosis or when everything matched; 1 when no dump can be read; 2 on bad usage.
 */
#include "cli/trace_comm_cmd.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"

#define TC_PATH 4096

struct tc_entry {
	int64_t seq, p2p_seq, bytes, step;
	char op[24], dtype[8], state[12], label[160], node_kind[16];
	int node, peer_world, tag;
	double t_scheduled, t_started, t_completed; /* 0: not reached */
};

struct tc_group {
	char name[64];
	int instance, size, rank;
	int *ranks; /* world ranks of the members */
	int64_t last_seq, last_started, last_completed;
	int64_t *sent, *received; /* per member: transfers posted to / from it */
	struct tc_entry *e;
	int n;
	const struct tc_entry **c; /* the collectives among e, by increasing seq */
	int nc;
};

struct tc_dump {
	bool have;
	int world;
	char host[256], reason[2048];
	double time;
	int64_t step;
	struct tc_group *g;
	int ng;
};

/* A group as the members know it (name, instance and members), and each member's record. */
struct tc_ugroup {
	const struct tc_group *key;
	const struct tc_group **member; /* [key->size]: NULL where that rank wrote no dump */
};

struct tc {
	char dir[TC_PATH];
	int world, n_dumps;
	struct tc_dump *d; /* [world] */
	struct tc_ugroup *u;
	int nu;
	bool *named; /* [world]: ranks a diagnosis names (their activity is printed) */
	char **diag;
	int ndiag;
};

/* ---------------------------------------------------------------- reading */

static double jnum(const cJSON *o, const char *key, double def)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static void jstr(const cJSON *o, const char *key, char *buf, size_t n)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	snprintf(buf, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static int64_t *jints(const cJSON *o, const char *key, int n)
{
	int64_t *out = xcalloc((size_t)n + 1, sizeof(int64_t));
	const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *v;
	int i = 0;
	cJSON_ArrayForEach (v, a) {
		if (i < n && cJSON_IsNumber(v))
			out[i] = (int64_t)v->valuedouble;
		i++;
	}
	return out;
}

static void read_entry(const cJSON *o, struct tc_entry *e)
{
	e->seq = (int64_t)jnum(o, "seq", 0);
	e->p2p_seq = (int64_t)jnum(o, "p2p_seq", 0);
	e->bytes = (int64_t)jnum(o, "bytes", 0);
	e->step = (int64_t)jnum(o, "step", -1);
	jstr(o, "op", e->op, sizeof(e->op));
	jstr(o, "dtype", e->dtype, sizeof(e->dtype));
	jstr(o, "state", e->state, sizeof(e->state));
	jstr(o, "label", e->label, sizeof(e->label));
	jstr(o, "node_kind", e->node_kind, sizeof(e->node_kind));
	e->node = (int)jnum(o, "node", -1);
	e->peer_world = (int)jnum(o, "peer_world", -1);
	e->tag = (int)jnum(o, "tag", 0);
	e->t_scheduled = jnum(o, "t_scheduled", 0);
	e->t_started = jnum(o, "t_started", 0);
	e->t_completed = jnum(o, "t_completed", 0);
}

static bool is_p2p(const struct tc_entry *e)
{
	return strcmp(e->op, "send") == 0 || strcmp(e->op, "recv") == 0;
}

static bool completed(const struct tc_entry *e)
{
	return strcmp(e->state, "completed") == 0;
}

static void read_group(const cJSON *o, struct tc_group *g)
{
	jstr(o, "name", g->name, sizeof(g->name));
	g->instance = (int)jnum(o, "instance", 0);
	g->rank = (int)jnum(o, "rank", -1);
	g->size = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "ranks"));
	int64_t *r = jints(o, "ranks", g->size);
	g->ranks = xcalloc((size_t)g->size + 1, sizeof(int));
	for (int i = 0; i < g->size; i++)
		g->ranks[i] = (int)r[i];
	free(r);
	g->last_seq = (int64_t)jnum(o, "last_seq", 0);
	g->last_started = (int64_t)jnum(o, "last_started_seq", 0);
	g->last_completed = (int64_t)jnum(o, "last_completed_seq", 0);
	g->sent = jints(o, "sent", g->size);
	g->received = jints(o, "received", g->size);
	const cJSON *es = cJSON_GetObjectItemCaseSensitive(o, "entries"), *v;
	g->n = cJSON_GetArraySize(es);
	g->e = xcalloc((size_t)g->n + 1, sizeof(*g->e));
	g->c = xcalloc((size_t)g->n + 1, sizeof(*g->c));
	int i = 0;
	cJSON_ArrayForEach (v, es) {
		read_entry(v, &g->e[i]);
		if (g->e[i].seq > 0 && (g->nc == 0 || g->e[i].seq > g->c[g->nc - 1]->seq))
			g->c[g->nc++] = &g->e[i];
		i++;
	}
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
		n += got;
		if (n + 1 == cap) {
			char *b = realloc(buf, cap *= 2);
			if (!b) {
				free(buf);
				buf = NULL;
			}
			buf = b;
		}
	}
	bool bad = ferror(f) != 0;
	fclose(f);
	if (!buf || bad) {
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

/* One rank's dump; *rank: whose. */
static int load_dump(const char *path, struct tc_dump *d, int *rank)
{
	char *text = read_text(path);
	if (!text) {
		LOG_ERROR("trace-comm: cannot read %s: %s", path, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	cJSON *o = cJSON_Parse(text);
	free(text);
	const cJSON *gs = cJSON_GetObjectItemCaseSensitive(o, "groups");
	if (!cJSON_IsObject(o) || !cJSON_IsArray(gs) || jnum(o, "rank", -1) < 0) {
		LOG_ERROR("trace-comm: %s is not a flight recorder dump", path);
		cJSON_Delete(o);
		return CT_ERR_RUNTIME;
	}
	memset(d, 0, sizeof(*d));
	d->have = true;
	*rank = (int)jnum(o, "rank", -1);
	d->world = (int)jnum(o, "world_size", 0);
	jstr(o, "host", d->host, sizeof(d->host));
	jstr(o, "reason", d->reason, sizeof(d->reason));
	d->time = jnum(o, "time", 0);
	d->step = (int64_t)jnum(o, "step", -1);
	d->ng = cJSON_GetArraySize(gs);
	d->g = xcalloc((size_t)d->ng + 1, sizeof(*d->g));
	const cJSON *v;
	int i = 0;
	cJSON_ArrayForEach (v, gs)
		read_group(v, &d->g[i++]);
	cJSON_Delete(o);
	return CT_OK;
}

static void dump_free(struct tc_dump *d)
{
	for (int k = 0; k < d->ng; k++) {
		struct tc_group *g = &d->g[k];
		free(g->ranks);
		free(g->sent);
		free(g->received);
		free(g->e);
		free(g->c);
	}
	free(d->g);
	memset(d, 0, sizeof(*d));
}

static void tc_free(struct tc *t)
{
	for (int r = 0; t->d && r < t->world; r++)
		dump_free(&t->d[r]);
	for (int i = 0; i < t->nu; i++)
		free(t->u[i].member);
	for (int i = 0; i < t->ndiag; i++)
		free(t->diag[i]);
	free(t->d);
	free(t->named);
	free(t->u);
	free(t->diag);
}

static bool same_group(const struct tc_group *a, const struct tc_group *b)
{
	return strcmp(a->name, b->name) == 0 && a->instance == b->instance && a->size == b->size &&
	       memcmp(a->ranks, b->ranks, (size_t)a->size * sizeof(int)) == 0;
}

/* Every rank_N.json of the folder (DIR/comm_traces when it exists). */
static int tc_load(struct tc *t, const char *dir)
{
	char sub[TC_PATH];
	struct stat st;
	snprintf(sub, sizeof(sub), "%s/comm_traces", dir);
	snprintf(t->dir, sizeof(t->dir), "%s",
	         stat(sub, &st) == 0 && S_ISDIR(st.st_mode) ? sub : dir);
	DIR *dh = opendir(t->dir);
	if (!dh) {
		LOG_ERROR("trace-comm: cannot open %s: %s", t->dir, strerror(errno));
		return CT_ERR_RUNTIME;
	}
	int cap = 0, n = 0, rc = CT_OK;
	struct tc_dump *got = NULL;
	int *ranks = NULL;
	for (struct dirent *de; rc == CT_OK && (de = readdir(dh)) != NULL;) {
		int r = -1, end = 0;
		if (sscanf(de->d_name, "rank_%d.json%n", &r, &end) != 1 ||
		    de->d_name[end] != '\0' || r < 0)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			got = realloc(got, (size_t)cap * sizeof(*got));
			ranks = realloc(ranks, (size_t)cap * sizeof(int));
			CHECK(got && ranks, "out of memory");
		}
		char path[TC_PATH + 300];
		snprintf(path, sizeof(path), "%s/%s", t->dir, de->d_name);
		rc = load_dump(path, &got[n], &ranks[n]);
		if (rc == CT_OK && ranks[n] != r) {
			LOG_ERROR("trace-comm: %s holds rank %d's dump", path, ranks[n]);
			dump_free(&got[n]);
			rc = CT_ERR_RUNTIME;
		}
		n += rc == CT_OK;
	}
	closedir(dh);
	if (rc == CT_OK && n == 0) {
		LOG_ERROR("trace-comm: no rank_N.json dumps in %s", t->dir);
		rc = CT_ERR_RUNTIME;
	}
	if (rc == CT_OK) {
		for (int i = 0; i < n; i++) {
			t->world = got[i].world > t->world ? got[i].world : t->world;
			t->world = ranks[i] + 1 > t->world ? ranks[i] + 1 : t->world;
		}
		t->d = xcalloc((size_t)t->world, sizeof(*t->d));
		t->named = xcalloc((size_t)t->world, sizeof(bool));
		for (int i = 0; i < n; i++)
			t->d[ranks[i]] = got[i];
		t->n_dumps = n;
	} else {
		for (int i = 0; i < n; i++)
			dump_free(&got[i]);
	}
	free(got); /* (on success the dumps' arrays now belong to t->d) */
	free(ranks);
	if (rc)
		return rc;
	/* the groups as their members know them */
	t->u = xcalloc((size_t)64 * (size_t)t->world + 1, sizeof(*t->u));
	for (int r = 0; r < t->world; r++)
		for (int k = 0; k < t->d[r].ng; k++) {
			const struct tc_group *g = &t->d[r].g[k];
			if (g->size < 2)
				continue;
			int i = 0;
			while (i < t->nu && !same_group(t->u[i].key, g))
				i++;
			if (i == t->nu) {
				t->u[t->nu].key = g;
				t->u[t->nu++].member = xcalloc((size_t)g->size, sizeof(void *));
			}
			if (g->rank >= 0 && g->rank < g->size)
				t->u[i].member[g->rank] = g;
		}
	return CT_OK;
}

/* ---------------------------------------------------------------- describing */

static const struct tc_entry *coll_at(const struct tc_group *g, int64_t seq)
{
	int lo = 0, hi = g->nc - 1;
	while (lo <= hi) {
		int mid = lo + (hi - lo) / 2;
		if (g->c[mid]->seq == seq)
			return g->c[mid];
		if (g->c[mid]->seq < seq)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/* "all-gather of 4096 bytes (u8) "all-gather of bucket 3" [node 11 AG, step 7]" */
static void describe(char *buf, size_t n, const struct tc_entry *e)
{
	int k = snprintf(buf, n, "%s of %lld bytes", e->op, (long long)e->bytes);
	if (strcmp(e->dtype, "none") != 0 && e->dtype[0])
		k += snprintf(buf + k, n - (size_t)k, " (%s)", e->dtype);
	if (is_p2p(e) && (size_t)k < n)
		k += snprintf(buf + k, n - (size_t)k, " %s rank %d (message %lld, tag %d)",
		              strcmp(e->op, "send") == 0 ? "to" : "from", e->peer_world,
		              (long long)e->p2p_seq, e->tag);
	if (e->label[0] && (size_t)k < n)
		k += snprintf(buf + k, n - (size_t)k, " \"%s\"", e->label);
	if ((size_t)k < n) {
		if (e->node >= 0)
			snprintf(buf + k, n - (size_t)k, " [node %d %s, step %lld]", e->node,
			         e->node_kind, (long long)e->step);
		else
			snprintf(buf + k, n - (size_t)k, " [step %lld]", (long long)e->step);
	}
}

/* "started 4.1 s before its dump" */
static void state_age(char *buf, size_t n, const struct tc_entry *e, const struct tc_dump *d)
{
	double t = completed(e) ? e->t_completed : e->t_started > 0 ? e->t_started : e->t_scheduled;
	if (t > 0 && d->time > 0)
		snprintf(buf, n, "%s %.1f s before its dump", e->state, d->time - t);
	else
		snprintf(buf, n, "%s", e->state);
}

static void ranks_text(char *buf, size_t n, const int *ranks, int count)
{
	int k = 0;
	buf[0] = '\0';
	for (int i = 0; i < count && (size_t)k < n; i++)
		k += snprintf(buf + k, n - (size_t)k, "%s%d", i ? "," : "", ranks[i]);
}

static void add_diag(struct tc *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_diag(struct tc *t, const char *fmt, ...)
{
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	t->diag = realloc(t->diag, (size_t)(t->ndiag + 1) * sizeof(char *));
	CHECK(t->diag, "out of memory");
	t->diag[t->ndiag++] = xstrdup(buf);
}

/* ---------------------------------------------------------------- collectives */

enum tc_status { TC_NO_DUMP, TC_NOT_ENTERED, TC_DROPPED, TC_ENTRY };

static bool same_sig(const struct tc_entry *a, const struct tc_entry *b)
{
	return strcmp(a->op, b->op) == 0 && a->bytes == b->bytes && strcmp(a->dtype, b->dtype) == 0;
}

/* Members that disagree at one sequence number: one line per distinct (op, bytes, dtype). */
static void report_mismatch(struct tc *t, const struct tc_ugroup *u, int64_t seq,
                            const struct tc_entry **at)
{
	const struct tc_group *k = u->key;
	int n = k->size;
	bool *done = xcalloc((size_t)n, sizeof(bool));
	int *who = xcalloc((size_t)n, sizeof(int));
	const struct tc_entry *first = NULL;
	char line[4096] = "", desc[512], list[1024];
	int len = 0, groups = 0, odd = -1, fewest = n + 1;
	const char *what = "op";
	for (int i = 0; i < n; i++) {
		if (!at[i] || done[i])
			continue;
		int m = 0;
		for (int j = i; j < n; j++)
			if (at[j] && !done[j] && same_sig(at[i], at[j])) {
				done[j] = true;
				who[m++] = k->ranks[j];
			}
		if (!first)
			first = at[i];
		else if (strcmp(first->op, at[i]->op) == 0)
			what = first->bytes != at[i]->bytes ? "size" : "dtype";
		if (m < fewest) { /* the smallest party is the odd one out */
			fewest = m;
			odd = i;
		}
		describe(desc, sizeof(desc), at[i]);
		ranks_text(list, sizeof(list), who, m);
		printf("    rank%s %s: %s\n", m > 1 ? "s" : "", list, desc);
		len += snprintf(line + len, sizeof(line) - (size_t)len, "%s%s %s: %s %lld bytes",
		                groups++ ? " vs " : "", m > 1 ? "ranks" : "rank", list, at[i]->op,
		                (long long)at[i]->bytes);
		if ((size_t)len >= sizeof(line))
			break;
	}
	for (int j = 0; j < n; j++)
		if (at[j] && odd >= 0 && same_sig(at[j], at[odd]))
			t->named[k->ranks[j]] = true;
	add_diag(t, "group %s seq %lld: %s mismatch: %s", k->name, (long long)seq, what, line);
	free(done);
	free(who);
}

/* The first sequence number of group u where its members disagree or not all completed. */
static void analyse_group(struct tc *t, const struct tc_ugroup *u)
{
	const struct tc_group *k = u->key;
	int n = k->size;
	char list[1024], desc[512], age[128];
	ranks_text(list, sizeof(list), k->ranks, n);
	printf("group %s", k->name);
	if (k->instance > 0)
		printf(" #%d", k->instance);
	printf(" (ranks %s):\n", list);
	int64_t lo = 1, hi = 0;
	int present = 0;
	for (int i = 0; i < n; i++) {
		const struct tc_group *g = u->member[i];
		if (!g)
			continue;
		present++;
		int64_t low = g->nc ? g->c[0]->seq : g->last_seq + 1;
		lo = low > lo ? low : lo;
		hi = g->last_seq > hi ? g->last_seq : hi;
	}
	enum tc_status *st = xcalloc((size_t)n, sizeof(*st));
	const struct tc_entry **at = xcalloc((size_t)n, sizeof(*at));
	for (int64_t s = lo; s <= hi; s++) {
		bool mismatch = false, open = false;
		const struct tc_entry *ref = NULL;
		for (int i = 0; i < n; i++) {
			const struct tc_group *g = u->member[i];
			at[i] = NULL;
			if (!g)
				st[i] = TC_NO_DUMP;
			else if (g->last_seq < s)
				st[i] = TC_NOT_ENTERED, open = true;
			else if (!(at[i] = coll_at(g, s)))
				st[i] = TC_DROPPED;
			else {
				st[i] = TC_ENTRY;
				open |= !completed(at[i]);
				if (ref && !same_sig(ref, at[i]))
					mismatch = true;
				ref = ref ? ref : at[i];
			}
		}
		if (!mismatch && !open)
			continue;
		if (mismatch) {
			printf("  mismatch at seq %lld: the members issued different collectives\n",
			       (long long)s);
			report_mismatch(t, u, s, at);
			goto out;
		}
		describe(desc, sizeof(desc), ref ? ref : at[0]);
		printf("  seq %lld did not complete: %s\n", (long long)s, ref ? desc : "?");
		int missing[4096], nm = 0, nodump[4096], nn = 0, waiting[4096], nw = 0;
		double first_in = 0, last_in = 0;
		int last_rank = -1;
		bool one_host = present == n;
		for (int i = 0; i < n; i++) {
			int r = k->ranks[i];
			if (st[i] == TC_ENTRY) {
				state_age(age, sizeof(age), at[i], &t->d[r]);
				printf("    rank %d entered it: %s\n", r, age);
				waiting[nw++] = r;
				double ts =
				    at[i]->t_started > 0 ? at[i]->t_started : at[i]->t_scheduled;
				if (!first_in || ts < first_in)
					first_in = ts;
				if (ts > last_in)
					last_in = ts, last_rank = r;
				one_host &= strcmp(t->d[r].host, t->d[k->ranks[0]].host) == 0;
			} else if (st[i] == TC_NOT_ENTERED) {
				printf("    rank %d never entered it (its last on this group: seq "
				       "%lld)\n",
				       r, (long long)u->member[i]->last_seq);
				missing[nm++] = r;
				t->named[r] = true;
			} else if (st[i] == TC_NO_DUMP) {
				printf("    rank %d wrote no dump (stopped, hung or dead: it could "
				       "not "
				       "write its trace)\n",
				       r);
				nodump[nn++] = r;
				t->named[r] = true;
			} else {
				printf("    rank %d: seq %lld is no longer in its ring\n", r,
				       (long long)s);
			}
		}
		char a[1024], b[1024], c[1024];
		ranks_text(a, sizeof(a), missing, nm);
		ranks_text(b, sizeof(b), nodump, nn);
		ranks_text(c, sizeof(c), waiting, nw);
		if (nm)
			add_diag(
			    t,
			    "group %s seq %lld %s: rank%s %s never entered it%s%s%s; rank%s %s "
			    "wait in it",
			    k->name, (long long)s, desc, nm > 1 ? "s" : "", a,
			    nn ? "; no dump from rank" : "",
			    nn > 1 ? "s "
			    : nn   ? " "
			           : "",
			    b, nw > 1 ? "s" : "", c);
		else if (nn)
			add_diag(t,
			         "group %s seq %lld %s: rank%s %s wrote no dump (stopped, hung or "
			         "dead); rank%s %s wait in it",
			         k->name, (long long)s, desc, nn > 1 ? "s" : "", b,
			         nw > 1 ? "s" : "", c);
		else if (one_host && nw > 1) {
			printf(
			    "    every member entered it; the last was rank %d, %.2f s after the "
			    "first\n",
			    last_rank, last_in - first_in);
			add_diag(t,
			         "group %s seq %lld %s: every member entered it but it did not "
			         "complete (the last to enter: rank %d, %.2f s after the first)",
			         k->name, (long long)s, desc, last_rank, last_in - first_in);
			t->named[last_rank] = true;
		} else
			add_diag(t,
			         "group %s seq %lld %s: every member entered it but it did not "
			         "complete",
			         k->name, (long long)s, desc);
		goto out;
	}
	if (hi >= lo)
		printf("  %lld collectives matched (seq %lld..%lld), all completed%s\n",
		       (long long)(hi - lo + 1), (long long)lo, (long long)hi,
		       present < n ? " on the ranks that dumped" : "");
	else
		printf("  no collectives recorded\n");
out:
	free(st);
	free(at);
}

/* ---------------------------------------------------------------- transfers */

/* Transfers some rank still waits for: has the peer posted its side? */
static void analyse_p2p(struct tc *t, const struct tc_ugroup *u)
{
	const struct tc_group *k = u->key;
	char desc[512], age[128];
	for (int b = 0; b < k->size; b++) {
		const struct tc_group *g = u->member[b];
		if (!g)
			continue;
		int me = k->ranks[b];
		bool *told = xcalloc((size_t)k->size * 2, sizeof(bool));
		for (int i = 0; i < g->n; i++) {
			const struct tc_entry *e = &g->e[i];
			if (!is_p2p(e) || completed(e))
				continue;
			bool send = strcmp(e->op, "send") == 0;
			int a = 0;
			while (a < k->size && k->ranks[a] != e->peer_world)
				a++;
			if (a == k->size || told[2 * a + send])
				continue;
			told[2 * a + send] = true;
			describe(desc, sizeof(desc), e);
			state_age(age, sizeof(age), e, &t->d[me]);
			printf("  rank %d waits for a %s: %s, %s\n", me, send ? "send" : "receive",
			       desc, age);
			const struct tc_group *p = u->member[a];
			if (!p) {
				printf("    rank %d wrote no dump (stopped, hung or dead)\n",
				       e->peer_world);
				t->named[e->peer_world] = true;
				add_diag(t, "group %s: rank %d waits for %s; rank %d wrote no dump",
				         k->name, me, desc, e->peer_world);
				continue;
			}
			int64_t posted = send ? p->received[b] : p->sent[b];
			if (posted < e->p2p_seq) {
				printf("    rank %d has posted only %lld %s %s rank %d\n",
				       e->peer_world, (long long)posted,
				       send ? "receives" : "sends", send ? "from" : "to", me);
				t->named[e->peer_world] = true;
				add_diag(
				    t,
				    "group %s: rank %d waits for %s; rank %d has posted only %lld "
				    "%s %s it",
				    k->name, me, desc, e->peer_world, (long long)posted,
				    send ? "receives" : "sends", send ? "from" : "to");
			} else
				printf("    rank %d has posted its side (%lld %s %s rank %d)\n",
				       e->peer_world, (long long)posted,
				       send ? "receives" : "sends", send ? "from" : "to", me);
		}
		free(told);
	}
}

/* ---------------------------------------------------------------- what a rank was doing */

static void rank_activity(const struct tc *t, int r)
{
	const struct tc_dump *d = &t->d[r];
	if (!d->have) {
		printf("rank %d: no dump (stopped, hung or dead before it could write one)\n", r);
		return;
	}
	const struct tc_entry *last = NULL;
	const struct tc_group *lastg = NULL;
	int open = 0;
	char desc[512], age[128];
	printf("rank %d (host %s, step %lld):\n", r, d->host, (long long)d->step);
	for (int k = 0; k < d->ng; k++)
		for (int i = 0; i < d->g[k].n; i++) {
			const struct tc_entry *e = &d->g[k].e[i];
			double te = e->t_started > 0 ? e->t_started : e->t_scheduled;
			double tl = !last                 ? -1
			            : last->t_started > 0 ? last->t_started
			                                  : last->t_scheduled;
			if (te > tl)
				last = e, lastg = &d->g[k];
			if (!completed(e)) {
				describe(desc, sizeof(desc), e);
				state_age(age, sizeof(age), e, d);
				printf("  in flight on %s: %s%s%lld: %s, %s\n", d->g[k].name,
				       e->seq ? "seq " : "", e->seq ? "" : "transfer ",
				       (long long)(e->seq ? e->seq : e->p2p_seq), desc, age);
				open++;
			}
		}
	if (last) {
		describe(desc, sizeof(desc), last);
		state_age(age, sizeof(age), last, d);
		printf("  newest entry, on %s: %s (%s)\n", lastg->name, desc, age);
	}
	if (!open)
		printf("  nothing in flight: outside any collective (computing, or stuck outside "
		       "communication)\n");
	if (d->reason[0])
		printf("  dumped because: %s\n", d->reason);
}

/* ---------------------------------------------------------------- the command */

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: ctitan trace-comm DIR\n\n"
	    "Reads the flight recorder dumps of a job (DIR/comm_traces/rank_N.json, written by\n"
	    "every rank when the watchdog ends a hung job, or on SIGUSR1; DIR is the job's\n"
	    "job.dump_folder or the comm_traces folder itself) and, for every group, matches\n"
	    "the ranks' collectives by sequence number. It prints the first collective that\n"
	    "some rank never entered or never completed, which ranks are missing (no dump: a\n"
	    "stopped rank cannot write one), what each of them was doing instead, any op or\n"
	    "size mismatch between ranks at one sequence number, and point-to-point transfers\n"
	    "waiting for a peer that never posted its side; one \"diagnosis:\" line each.\n\n"
	    "exit codes: 0 a diagnosis or everything matched, 1 no readable dump, 2 bad usage\n");
}

int cmd_trace_comm(int argc, char **argv)
{
	for (int i = 0; i < argc; i++)
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		}
	if (argc != 1 || argv[0][0] == '-') {
		fprintf(stderr, "ctitan trace-comm: %s\n\n",
		        argc == 0  ? "missing DIR"
		        : argc > 1 ? "one DIR only"
		                   : "unknown option");
		usage(stderr);
		return 2;
	}
	struct tc t;
	memset(&t, 0, sizeof(t));
	if (tc_load(&t, argv[0]) != CT_OK) {
		tc_free(&t);
		return 1;
	}
	int nodump[4096], nn = 0;
	for (int r = 0; r < t.world && nn < 4096; r++)
		if (!t.d[r].have)
			nodump[nn++] = r;
	char list[8192];
	ranks_text(list, sizeof(list), nodump, nn);
	printf("%s: dumps from %d of %d ranks", t.dir, t.n_dumps, t.world);
	if (nn)
		printf(" (none from rank%s %s)", nn > 1 ? "s" : "", list);
	printf("\n");
	for (int i = 0; i < t.nu; i++)
		analyse_group(&t, &t.u[i]);
	for (int i = 0; i < t.nu; i++)
		analyse_p2p(&t, &t.u[i]);
	bool any = false;
	for (int r = 0; r < t.world; r++)
		if (t.named[r]) {
			if (!any)
				printf("what the ranks named were doing:\n");
			any = true;
			rank_activity(&t, r);
		}
	for (int i = 0; i < t.ndiag; i++)
		printf("diagnosis: %s\n", t.diag[i]);
	if (!t.ndiag)
		printf("diagnosis: none: every collective matched and completed on every group "
		       "(%d of %d ranks dumped)\n",
		       t.n_dumps, t.world);
	tc_free(&t);
	return 0;
}
