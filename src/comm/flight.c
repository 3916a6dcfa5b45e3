#include "comm/flight.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"

#define FR_GROUPS 64  /* communicators registered at once (as many as the watchdog takes) */
#define FR_KEYS   256 /* distinct (name, members) pairs whose instances are counted */
#define FR_PATH   1024

/* Ids handed to callers: bit 62 says what the low 40 bits hold (1: a collective's sequence
 * number, 0: an entry's record), then the group slot's generation (a slot reused by another
 * communicator never takes an old id) and the slot. */
#define ID_SEQ_BIT    ((int64_t)1 << 62)
#define ID_GEN_SHIFT  47
#define ID_SLOT_SHIFT 40
#define ID_VALUE_MASK (((int64_t)1 << ID_SLOT_SHIFT) - 1)

struct fr_group {
	bool used;
	int gen; /* 1 .. 0x7fff */
	void *comm;
	char name[32];
	int size, rank, instance;
	int *world;                         /* members' world ranks */
	int64_t seq;                        /* collectives issued (the last sequence number) */
	int64_t started_seq, completed_seq; /* the last started / completed one */
	int64_t *sent, *received;           /* per peer (group rank): transfers posted */
	int64_t records;                    /* entries ever written */
	struct fr_entry *ring;              /* fr_cap entries once the first is recorded */
};

static pthread_mutex_t fr_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fr_dump_mu = PTHREAD_MUTEX_INITIALIZER; /* one dump at a time */
static struct fr_group fr_groups[FR_GROUPS];
static int fr_gen_next = 1;
static int64_t fr_cap = FR_DEFAULT_ENTRIES;
static char fr_folder[FR_PATH];
static struct {
	uint64_t key;
	int n;
} fr_keys[FR_KEYS];
static int fr_n_keys;
static int64_t fr_step = -1; /* atomic */
static struct {
	int rank;
	char group[32];
	int64_t seq;
} fr_skip = {.rank = -1};
static int fr_asked; /* atomic: set by the signal handler */

static _Thread_local int64_t fr_adopted;
static _Thread_local int fr_node_now = -1;
static _Thread_local const char *fr_node_kind_now;
static _Thread_local char fr_p2p_label_now[FR_LABEL];

static const char *const fr_op_names[] = {
    "all-gather", "reduce-scatter", "all-reduce", "all-reduce-max", "barrier", "send", "recv",
    "all-to-all"};
_Static_assert(sizeof(fr_op_names) / sizeof(fr_op_names[0]) == FR_OP_COUNT, "one name per op");
static const char *const fr_dtype_names[] = {"u8", "f32", "f64", "i64", "none"};
_Static_assert(sizeof(fr_dtype_names) / sizeof(fr_dtype_names[0]) == FR_DTYPE_COUNT,
               "one name per dtype");
static const char *const fr_state_names[] = {"scheduled", "started", "completed"};
_Static_assert(sizeof(fr_state_names) / sizeof(fr_state_names[0]) == FR_STATE_COUNT,
               "one name per state");

const char *fr_op_name(enum fr_op op)
{
	return (unsigned)op < FR_OP_COUNT ? fr_op_names[op] : "?";
}
const char *fr_dtype_name(enum fr_dtype t)
{
	return (unsigned)t < FR_DTYPE_COUNT ? fr_dtype_names[t] : "?";
}
const char *fr_state_name(enum fr_state s)
{
	return (unsigned)s < FR_STATE_COUNT ? fr_state_names[s] : "?";
}

/* ---------------------------------------------------------------- settings */

void comm_flight_configure(int64_t entries, const char *dump_folder)
{
	CHECK(entries >= 0 && entries <= ((int64_t)1 << 30), "comm: %lld flight recorder entries",
	      (long long)entries);
	pthread_mutex_lock(&fr_mu);
	if (entries != fr_cap)
		for (int i = 0; i < FR_GROUPS; i++) { /* entries go, sequence numbers stay */
			free(fr_groups[i].ring);
			fr_groups[i].ring = NULL;
			fr_groups[i].records = 0;
		}
	fr_cap = entries;
	snprintf(fr_folder, sizeof(fr_folder), "%s", dump_folder ? dump_folder : "");
	pthread_mutex_unlock(&fr_mu);
}

void comm_flight_node(int node, const char *kind)
{
	fr_node_now = node < 0 ? -1 : node;
	fr_node_kind_now = node < 0 ? NULL : kind;
}

void comm_flight_skip_collective(int rank, const char *group, int64_t seq)
{
	if (rank >= comm_world_size() && comm_world_rank() == 0)
		LOG_WARN(
		    "debug.skip_collective_rank = %d: the world has %d ranks; nothing is skipped",
		    rank, comm_world_size());
	pthread_mutex_lock(&fr_mu);
	fr_skip.rank = rank;
	snprintf(fr_skip.group, sizeof(fr_skip.group), "%s", group ? group : "");
	fr_skip.seq = seq;
	pthread_mutex_unlock(&fr_mu);
}

static void fr_on_signal(int signo)
{
	(void)signo;
	comm_flight_request_dump(); /* one lock-free atomic store: async-signal-safe */
}

int comm_flight_catch(int signo)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fr_on_signal;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	return sigaction(signo, &sa, NULL);
}

void comm_flight_request_dump(void)
{
	__atomic_store_n(&fr_asked, 1, __ATOMIC_RELAXED);
}

bool comm_flight_take_request(void)
{
	return __atomic_exchange_n(&fr_asked, 0, __ATOMIC_RELAXED) != 0;
}

void fr_set_step(int64_t step)
{
	__atomic_store_n(&fr_step, step, __ATOMIC_RELAXED);
}

void fr_p2p_label(const char *label)
{
	snprintf(fr_p2p_label_now, sizeof(fr_p2p_label_now), "%s", label ? label : "");
}

/* ---------------------------------------------------------------- groups */

static uint64_t fr_hash(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull; /* FNV-1a */
	return h;
}

static int fr_find(void *comm)
{
	for (int i = 0; i < FR_GROUPS; i++)
		if (fr_groups[i].used && fr_groups[i].comm == comm)
			return i;
	return -1;
}

/* How many groups of this name and membership this process registered before: members
 * create a communicator together, so the k-th one is the k-th on every member. */
static int fr_instance(uint64_t key)
{
	for (int i = 0; i < fr_n_keys; i++)
		if (fr_keys[i].key == key)
			return fr_keys[i].n++;
	if (fr_n_keys == FR_KEYS)
		return -1;
	fr_keys[fr_n_keys].key = key;
	fr_keys[fr_n_keys++].n = 1;
	return 0;
}

static void fr_group_clear(struct fr_group *g)
{
	free(g->world);
	free(g->sent);
	free(g->received);
	free(g->ring);
	memset(g, 0, sizeof(*g));
}

void fr_group_add(void *comm, const char *name, int size, int rank, const int *world_ranks)
{
	pthread_mutex_lock(&fr_mu);
	int i = fr_find(comm);
	if (i >= 0) {
		struct fr_group *g = &fr_groups[i];
		bool same = strcmp(g->name, name) == 0 && g->size == size &&
		            memcmp(g->world, world_ranks, (size_t)size * sizeof(int)) == 0;
		if (same) { /* the world, registered again by a later mesh: its history goes on */
			pthread_mutex_unlock(&fr_mu);
			return;
		}
		fr_group_clear(g);
	} else {
		for (i = 0; i < FR_GROUPS && fr_groups[i].used; i++)
			;
		CHECK(i < FR_GROUPS, "comm: more than %d communicators", FR_GROUPS);
	}
	struct fr_group *g = &fr_groups[i];
	g->used = true;
	g->gen = fr_gen_next;
	fr_gen_next = fr_gen_next == 0x7fff ? 1 : fr_gen_next + 1;
	g->comm = comm;
	snprintf(g->name, sizeof(g->name), "%s", name);
	g->size = size;
	g->rank = rank;
	g->world = xcalloc((size_t)size, sizeof(int));
	memcpy(g->world, world_ranks, (size_t)size * sizeof(int));
	g->sent = xcalloc((size_t)size, sizeof(int64_t));
	g->received = xcalloc((size_t)size, sizeof(int64_t));
	uint64_t h = fr_hash(0xcbf29ce484222325ull, g->name, strlen(g->name));
	g->instance = fr_instance(fr_hash(h, world_ranks, (size_t)size * sizeof(int)));
	pthread_mutex_unlock(&fr_mu);
}

void fr_group_remove(void *comm)
{
	pthread_mutex_lock(&fr_mu);
	int i = fr_find(comm);
	if (i >= 0)
		fr_group_clear(&fr_groups[i]);
	pthread_mutex_unlock(&fr_mu);
}

/* ---------------------------------------------------------------- entries (under fr_mu) */

static int64_t fr_id(int slot, bool seq, int64_t value)
{
	return (seq ? ID_SEQ_BIT : 0) | ((int64_t)fr_groups[slot].gen << ID_GEN_SHIFT) |
	       ((int64_t)slot << ID_SLOT_SHIFT) | (value & ID_VALUE_MASK);
}

/* The group an id belongs to, if it still exists. */
static struct fr_group *fr_id_group(int64_t id)
{
	int slot = (int)((id >> ID_SLOT_SHIFT) & 0x7f);
	int gen = (int)((id >> ID_GEN_SHIFT) & 0x7fff);
	if (id <= 0 || slot >= FR_GROUPS || !fr_groups[slot].used || fr_groups[slot].gen != gen)
		return NULL;
	return &fr_groups[slot];
}

static struct fr_entry *fr_new(struct fr_group *g)
{
	if (fr_cap == 0)
		return NULL;
	if (!g->ring)
		g->ring = xcalloc((size_t)fr_cap, sizeof(struct fr_entry));
	int64_t r = g->records++;
	struct fr_entry *e = &g->ring[r % fr_cap];
	memset(e, 0, sizeof(*e));
	e->record = r;
	e->peer = -1;
	e->node = fr_node_now;
	e->node_kind = fr_node_kind_now;
	e->step = __atomic_load_n(&fr_step, __ATOMIC_RELAXED);
	return e;
}

static struct fr_entry *fr_by_record(struct fr_group *g, int64_t r)
{
	if (!g->ring || r < 0 || r >= g->records || g->records - r > fr_cap)
		return NULL;
	struct fr_entry *e = &g->ring[r % fr_cap];
	return e->record == r ? e : NULL;
}

/* A collective's entry by its sequence number: newest first (the one asked for is nearly
 * always among the last few), stopping at older collectives. */
static struct fr_entry *fr_by_seq(struct fr_group *g, int64_t seq)
{
	if (!g->ring)
		return NULL;
	int64_t oldest = g->records > fr_cap ? g->records - fr_cap : 0;
	for (int64_t r = g->records - 1; r >= oldest; r--) {
		struct fr_entry *e = &g->ring[r % fr_cap];
		if (e->seq == seq)
			return e;
		if (e->seq > 0 && e->seq < seq)
			break;
	}
	return NULL;
}

static void fr_fill(struct fr_entry *e, int64_t seq, enum fr_op op, enum fr_dtype dt, int64_t bytes,
                    const char *label)
{
	e->seq = seq;
	e->op = (uint8_t)op;
	e->dtype = (uint8_t)dt;
	e->bytes = bytes;
	snprintf(e->label, sizeof(e->label), "%s", label ? label : "");
}

/* ---------------------------------------------------------------- recording */

int64_t fr_schedule(void *comm, enum fr_op op, enum fr_dtype dt, int64_t bytes, const char *label)
{
	pthread_mutex_lock(&fr_mu);
	int i = fr_find(comm);
	int64_t id = 0;
	if (i >= 0) {
		struct fr_group *g = &fr_groups[i];
		int64_t seq = ++g->seq;
		struct fr_entry *e = fr_new(g);
		if (e) {
			fr_fill(e, seq, op, dt, bytes, label);
			e->state = FR_SCHEDULED;
			e->t_scheduled = timer_now();
		}
		id = fr_id(i, true, seq);
	}
	pthread_mutex_unlock(&fr_mu);
	return id;
}

void fr_adopt(int64_t id)
{
	fr_adopted = id;
}

int64_t fr_start(void *comm, enum fr_op op, enum fr_dtype dt, int64_t bytes, const char *label,
                 bool *skip)
{
	int64_t adopted = fr_adopted, id = 0, seq = 0;
	fr_adopted = 0;
	*skip = false;
	pthread_mutex_lock(&fr_mu);
	int i = fr_find(comm);
	if (i < 0) {
		pthread_mutex_unlock(&fr_mu);
		return 0;
	}
	struct fr_group *g = &fr_groups[i];
	struct fr_entry *e = NULL;
	double now = timer_now();
	if ((adopted & ID_SEQ_BIT) && fr_id_group(adopted) == g) {
		seq = adopted & ID_VALUE_MASK; /* queued on the stream: numbered then */
		e = fr_by_seq(g, seq);
		if (!e && (e = fr_new(g)) != NULL) /* fell out of a small ring while queued */
			fr_fill(e, seq, op, dt, bytes, label);
	} else {
		seq = ++g->seq;
		if ((e = fr_new(g)) != NULL) {
			fr_fill(e, seq, op, dt, bytes, label);
			e->t_scheduled = now;
		}
	}
	if (e) {
		e->state = FR_STARTED;
		e->t_started = now;
		if (!e->label[0] && label)
			snprintf(e->label, sizeof(e->label), "%s", label);
	}
	if (seq > g->started_seq)
		g->started_seq = seq;
	if (fr_skip.rank >= 0 && fr_skip.rank == comm_world_rank() && seq == fr_skip.seq &&
	    strcmp(fr_skip.group, g->name) == 0) {
		*skip = true;
		if (e) {
			char was[FR_LABEL];
			snprintf(was, sizeof(was), "%s", e->label);
			snprintf(e->label, sizeof(e->label),
			         "debug.skip_collective: in place of %s (%.50s)", fr_op_name(op),
			         was);
			e->op = FR_BARRIER;
			e->dtype = FR_NO_DTYPE;
			e->bytes = 0;
		}
	}
	id = fr_id(i, true, seq);
	pthread_mutex_unlock(&fr_mu);
	return id;
}

void fr_complete(int64_t id)
{
	if (id <= 0)
		return;
	pthread_mutex_lock(&fr_mu);
	struct fr_group *g = fr_id_group(id);
	if (g) {
		int64_t v = id & ID_VALUE_MASK;
		struct fr_entry *e = id & ID_SEQ_BIT ? fr_by_seq(g, v) : fr_by_record(g, v);
		if (e) {
			e->state = FR_COMPLETED;
			e->t_completed = timer_now();
		}
		if ((id & ID_SEQ_BIT) && v > g->completed_seq)
			g->completed_seq = v;
	}
	pthread_mutex_unlock(&fr_mu);
}

int64_t fr_p2p(void *comm, bool send, int peer, int tag, int64_t bytes)
{
	pthread_mutex_lock(&fr_mu);
	int i = fr_find(comm);
	int64_t id = 0;
	if (i >= 0 && peer >= 0 && peer < fr_groups[i].size) {
		struct fr_group *g = &fr_groups[i];
		int64_t n = send ? ++g->sent[peer] : ++g->received[peer];
		struct fr_entry *e = fr_new(g);
		if (e) {
			fr_fill(e, 0, send ? FR_SEND : FR_RECV, FR_U8, bytes, fr_p2p_label_now);
			e->p2p_seq = n;
			e->peer = peer;
			e->tag = tag;
			e->state = FR_STARTED;
			e->t_scheduled = e->t_started = timer_now();
			id = fr_id(i, false, e->record);
		}
	}
	pthread_mutex_unlock(&fr_mu);
	return id;
}

int comm_flight_snapshot(const struct comm_group *cg, struct fr_entry *out, int max,
                         int64_t *last_seq)
{
	int n = 0;
	pthread_mutex_lock(&fr_mu);
	int i = fr_find(cg->handle);
	if (last_seq)
		*last_seq = i >= 0 ? fr_groups[i].seq : 0;
	if (i >= 0 && fr_groups[i].ring) {
		const struct fr_group *g = &fr_groups[i];
		int64_t oldest = g->records > fr_cap ? g->records - fr_cap : 0;
		for (int64_t r = oldest; r < g->records && n < max; r++)
			out[n++] = g->ring[r % fr_cap];
	}
	pthread_mutex_unlock(&fr_mu);
	return n;
}

/* ---------------------------------------------------------------- the dump */

const char *comm_flight_dump_path(void)
{
	static _Thread_local char path[FR_PATH + 64]; /* dumps may be written from any thread */
	pthread_mutex_lock(&fr_mu);
	if (fr_folder[0])
		snprintf(path, sizeof(path), "%s/comm_traces/rank_%d.json", fr_folder,
		         comm_world_rank());
	else
		path[0] = '\0';
	pthread_mutex_unlock(&fr_mu);
	return path;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static void json_time(FILE *f, const char *key, double t)
{
	if (t > 0)
		fprintf(f, ",\"%s\":%.6f", key, t);
	else
		fprintf(f, ",\"%s\":null", key);
}

static void dump_entry(FILE *f, const struct fr_group *g, const struct fr_entry *e)
{
	fprintf(f,
	        "{\"record\":%lld,\"seq\":%lld,\"op\":\"%s\",\"bytes\":%lld,\"dtype\":\"%s\","
	        "\"state\":\"%s\",\"step\":%lld,\"label\":",
	        (long long)e->record, (long long)e->seq, fr_op_name(e->op), (long long)e->bytes,
	        fr_dtype_name(e->dtype), fr_state_name(e->state), (long long)e->step);
	json_str(f, e->label);
	fprintf(f, ",\"node\":%d,\"node_kind\":", e->node);
	if (e->node_kind)
		json_str(f, e->node_kind);
	else
		fputs("null", f);
	if (e->op == FR_SEND || e->op == FR_RECV)
		fprintf(f, ",\"peer\":%d,\"peer_world\":%d,\"tag\":%d,\"p2p_seq\":%lld", e->peer,
		        e->peer >= 0 && e->peer < g->size ? g->world[e->peer] : -1, e->tag,
		        (long long)e->p2p_seq);
	json_time(f, "t_scheduled", e->t_scheduled);
	json_time(f, "t_started", e->t_started);
	json_time(f, "t_completed", e->t_completed);
	fputc('}', f);
}

static void dump_ints(FILE *f, const char *key, const void *v, int n, bool wide)
{
	fprintf(f, ",\"%s\":[", key);
	for (int i = 0; i < n; i++)
		fprintf(f, "%s%lld", i ? "," : "",
		        wide ? (long long)((const int64_t *)v)[i] : (long long)((const int *)v)[i]);
	fputc(']', f);
}

/* A copy of every group, taken under the lock, so the file is written without it. */
struct fr_snap {
	int n;
	struct fr_group g[FR_GROUPS];
	int64_t cap;
};

static void snap_take(struct fr_snap *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_lock(&fr_mu);
	s->cap = fr_cap;
	for (int i = 0; i < FR_GROUPS; i++) {
		const struct fr_group *g = &fr_groups[i];
		if (!g->used || g->size < 2) /* a group of one never waits */
			continue;
		struct fr_group *c = &s->g[s->n++];
		*c = *g;
		size_t n = (size_t)g->size;
		c->world = xcalloc(n, sizeof(int));
		memcpy(c->world, g->world, n * sizeof(int));
		c->sent = xcalloc(n, sizeof(int64_t));
		memcpy(c->sent, g->sent, n * sizeof(int64_t));
		c->received = xcalloc(n, sizeof(int64_t));
		memcpy(c->received, g->received, n * sizeof(int64_t));
		int64_t oldest = g->records > fr_cap ? g->records - fr_cap : 0, k = 0;
		c->ring =
		    g->ring ? xcalloc((size_t)(g->records - oldest) + 1, sizeof(*c->ring)) : NULL;
		for (int64_t r = oldest; g->ring && r < g->records; r++)
			c->ring[k++] = g->ring[r % fr_cap]; /* oldest first */
		c->records = k;                             /* in the copy: entries held */
	}
	pthread_mutex_unlock(&fr_mu);
}

static void snap_free(struct fr_snap *s)
{
	for (int i = 0; i < s->n; i++)
		fr_group_clear(&s->g[i]);
}

static int mkdirs(const char *path)
{
	char buf[FR_PATH + 64];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1;; p++) {
		bool end = *p == '\0';
		if (*p == '/' || end) {
			*p = '\0';
			if (mkdir(buf, 0755) != 0 && errno != EEXIST)
				return -1;
			if (end)
				return 0;
			*p = '/';
		}
	}
}

static void snap_write(FILE *f, const struct fr_snap *s, const char *reason)
{
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);
	struct timespec wall;
	clock_gettime(CLOCK_REALTIME, &wall);
	fprintf(f,
	        "{\"format\":\"ctitan flight recorder\",\"version\":1,\"rank\":%d,"
	        "\"world_size\":%d,\"pid\":%d,\"host\":",
	        comm_world_rank(), comm_world_size(), (int)getpid());
	json_str(f, host);
	fputs(",\"reason\":", f);
	json_str(f, reason ? reason : "");
	fprintf(f,
	        ",\"step\":%lld,\"time\":%.6f,\"unix_time\":%.3f,\"entries_per_group\":%lld,"
	        "\"groups\":[",
	        (long long)__atomic_load_n(&fr_step, __ATOMIC_RELAXED), timer_now(),
	        (double)wall.tv_sec + 1e-9 * (double)wall.tv_nsec, (long long)s->cap);
	for (int i = 0; i < s->n; i++) {
		const struct fr_group *g = &s->g[i];
		fputs(i ? ",\n{\"name\":" : "\n{\"name\":", f);
		json_str(f, g->name);
		fprintf(f, ",\"instance\":%d,\"rank\":%d", g->instance, g->rank);
		dump_ints(f, "ranks", g->world, g->size, false);
		fprintf(f,
		        ",\"last_seq\":%lld,\"last_started_seq\":%lld,\"last_completed_seq\":%lld",
		        (long long)g->seq, (long long)g->started_seq, (long long)g->completed_seq);
		dump_ints(f, "sent", g->sent, g->size, true);
		dump_ints(f, "received", g->received, g->size, true);
		fputs(",\"entries\":[", f);
		for (int64_t k = 0; k < g->records; k++) {
			fputs(k ? ",\n " : "\n ", f);
			dump_entry(f, g, &g->ring[k]);
		}
		fputs("]}", f);
	}
	fputs("]}\n", f);
}

int comm_flight_dump(const char *reason)
{
	char path[FR_PATH + 64], tmp[FR_PATH + 80], dir[FR_PATH + 32];
	snprintf(path, sizeof(path), "%s", comm_flight_dump_path());
	if (!path[0])
		return CT_OK;
	pthread_mutex_lock(&fr_mu);
	snprintf(dir, sizeof(dir), "%s/comm_traces", fr_folder);
	pthread_mutex_unlock(&fr_mu);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	pthread_mutex_lock(&fr_dump_mu);
	if (mkdirs(dir) != 0) {
		LOG_ERROR("flight recorder: cannot create %s: %s", dir, strerror(errno));
		pthread_mutex_unlock(&fr_dump_mu);
		return CT_ERR_RUNTIME;
	}
	FILE *f = fopen(tmp, "w");
	if (!f) {
		LOG_ERROR("flight recorder: cannot write %s: %s", tmp, strerror(errno));
		pthread_mutex_unlock(&fr_dump_mu);
		return CT_ERR_RUNTIME;
	}
	struct fr_snap *s = xcalloc(1, sizeof(*s));
	snap_take(s);
	snap_write(f, s, reason);
	snap_free(s);
	free(s);
	bool bad = ferror(f) != 0;
	if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
		LOG_ERROR("flight recorder: cannot write %s: %s", path, strerror(errno));
		unlink(tmp);
		pthread_mutex_unlock(&fr_dump_mu);
		return CT_ERR_RUNTIME;
	}
	pthread_mutex_unlock(&fr_dump_mu);
	LOG_WARN("flight recorder: wrote %s (%s)", path, reason ? reason : "");
	return CT_OK;
}
