#include "comm/watchdog.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/thread.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "comm/flight.h"

#define WD_SLOTS      32 /* collectives in flight at once (one per thread in practice) */
#define WD_GROUPS     64
#define WD_LABEL      160
#define WD_DOING      384
#define WD_REPLIES    64 /* ring of reply buffers still being sent */
#define WD_TAG_ASK    0x57d1
#define WD_TAG_REPLY  0x57d2
#define WD_TAG_DUMP   0x57d3 /* "write your flight recorder dump": a watchdog about to abort */
#define WD_TAG_DUMPED 0x57d4 /* "written" */
/* How long a watchdog waits for the others' dumps (a running rank writes its own within
 * ~0.1 s); under the 2 s that `ctitan launch` gives an announced abort before it ends the job. */
#define WD_DUMP_SECONDS 1.5

struct wd_group {
	bool used;
	void *comm;
	char name[32];
	int size;
	int *world;      /* members' world ranks */
	uint64_t key;    /* the same on every member: name and members */
	int64_t entered; /* collectives entered on this communicator */
};

struct wd_slot {
	bool used;
	double t0;
	int group; /* index into wd_groups, -1: unregistered communicator */
	int peer;  /* a point-to-point wait: the peer's world rank; -1: a collective */
	int64_t seq;
	char what[WD_DOING];
};

struct wd_ask {
	uint64_t key;
	int64_t seq;
};

struct wd_reply {
	int64_t entered; /* -1: the group is unknown there */
	int64_t step;
	char doing[WD_DOING];
};

struct wd_dump_ask {
	char reason[1024]; /* the asking watchdog's message */
};

static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wd_group wd_groups[WD_GROUPS];
static struct wd_slot wd_slots[WD_SLOTS];
static int64_t wd_step = -1; /* atomic */
static _Thread_local char wd_label_next[WD_LABEL], wd_context_now[WD_LABEL];

static struct {
	bool running;
	int stop; /* atomic */
	double timeout_s;
	pthread_t thread;
	MPI_Comm comm;
	struct wd_ask ask_in;
	MPI_Request ask_req;
	struct wd_reply replies[WD_REPLIES];
	int next_reply;
	struct wd_dump_ask dump_in, dump_out;
	MPI_Request dump_req;
	int ack;     /* the answer to a dump request (its value does not matter) */
	bool dumped; /* this rank wrote its dump for a watchdog abort already */
} wd;

/* ---------------------------------------------------------------- labels */

void comm_label(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(wd_label_next, sizeof(wd_label_next), fmt, ap);
	va_end(ap);
}

void comm_context(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(wd_context_now, sizeof(wd_context_now), fmt, ap);
	va_end(ap);
}

void comm_context_clear(void)
{
	wd_context_now[0] = '\0';
}

void wd_label_text(char *buf, size_t n)
{
	snprintf(buf, n, "%s%s%s", wd_label_next,
	         wd_label_next[0] && wd_context_now[0] ? " during " : "", wd_context_now);
}

void comm_watchdog_set_step(int64_t step)
{
	__atomic_store_n(&wd_step, step, __ATOMIC_RELAXED);
	fr_set_step(step);
}

/* ---------------------------------------------------------------- groups and slots */

static uint64_t wd_hash(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull; /* FNV-1a */
	return h;
}

static int wd_find_group(void *comm)
{
	for (int i = 0; i < WD_GROUPS; i++)
		if (wd_groups[i].used && wd_groups[i].comm == comm)
			return i;
	return -1;
}

void wd_group_add(void *comm, const char *name, int size, const int *world_ranks)
{
	pthread_mutex_lock(&wd_mu);
	int i = wd_find_group(comm);
	if (i < 0)
		for (i = 0; i < WD_GROUPS && wd_groups[i].used; i++)
			;
	CHECK(i < WD_GROUPS, "comm: more than %d communicators", WD_GROUPS);
	struct wd_group *g = &wd_groups[i];
	free(g->world); /* re-registering a communicator (the world, per mesh) starts it afresh */
	memset(g, 0, sizeof(*g));
	g->used = true;
	g->comm = comm;
	snprintf(g->name, sizeof(g->name), "%s", name);
	g->size = size;
	g->world = xcalloc((size_t)size, sizeof(int));
	memcpy(g->world, world_ranks, (size_t)size * sizeof(int));
	uint64_t h = wd_hash(0xcbf29ce484222325ull, g->name, strlen(g->name));
	g->key = wd_hash(h, world_ranks, (size_t)size * sizeof(int));
	pthread_mutex_unlock(&wd_mu);
}

void wd_group_remove(void *comm)
{
	pthread_mutex_lock(&wd_mu);
	int i = wd_find_group(comm);
	if (i >= 0) {
		free(wd_groups[i].world);
		memset(&wd_groups[i], 0, sizeof(wd_groups[i]));
	}
	pthread_mutex_unlock(&wd_mu);
}

int wd_enter(const char *kind, const char *unit, void *comm, int64_t count)
{
	pthread_mutex_lock(&wd_mu);
	int g = wd_find_group(comm), s = 0;
	while (s < WD_SLOTS && wd_slots[s].used)
		s++;
	CHECK(s < WD_SLOTS, "comm: more than %d collectives in flight", WD_SLOTS);
	struct wd_slot *sl = &wd_slots[s];
	sl->used = true;
	sl->t0 = timer_now();
	sl->group = g;
	sl->peer = -1;
	sl->seq = g >= 0 ? ++wd_groups[g].entered : 0;
	int n = snprintf(sl->what, sizeof(sl->what), "%s of %lld %s", kind, (long long)count, unit);
	if (wd_label_next[0] && n < (int)sizeof(sl->what))
		n += snprintf(sl->what + n, sizeof(sl->what) - (size_t)n, " (%s)", wd_label_next);
	if (wd_context_now[0] && n < (int)sizeof(sl->what))
		snprintf(sl->what + n, sizeof(sl->what) - (size_t)n, " during %s", wd_context_now);
	wd_label_next[0] = '\0';
	pthread_mutex_unlock(&wd_mu);
	return s;
}

int wd_enter_p2p(const char *what, int peer_world)
{
	pthread_mutex_lock(&wd_mu);
	int s = 0;
	while (s < WD_SLOTS && wd_slots[s].used)
		s++;
	CHECK(s < WD_SLOTS, "comm: more than %d collectives in flight", WD_SLOTS);
	struct wd_slot *sl = &wd_slots[s];
	sl->used = true;
	sl->t0 = timer_now();
	sl->group = -1;
	sl->peer = peer_world;
	sl->seq = 0; /* any answer from the peer counts as "not arrived" (entered -1 < 0) */
	int n = snprintf(sl->what, sizeof(sl->what), "%s", what);
	if (wd_context_now[0] && n < (int)sizeof(sl->what))
		snprintf(sl->what + n, sizeof(sl->what) - (size_t)n, " during %s", wd_context_now);
	pthread_mutex_unlock(&wd_mu);
	return s;
}

void wd_leave(int slot)
{
	pthread_mutex_lock(&wd_mu);
	wd_slots[slot].used = false;
	pthread_mutex_unlock(&wd_mu);
}

/* ---------------------------------------------------------------- the side channel */

static void wd_post_ask(void)
{
	MPI_Irecv(&wd.ask_in, sizeof(wd.ask_in), MPI_BYTE, MPI_ANY_SOURCE, WD_TAG_ASK, wd.comm,
	          &wd.ask_req);
}

static void wd_post_dump(void)
{
	MPI_Irecv(&wd.dump_in, sizeof(wd.dump_in), MPI_BYTE, MPI_ANY_SOURCE, WD_TAG_DUMP, wd.comm,
	          &wd.dump_req);
}

/* Another rank's watchdog is about to end the job: write this rank's flight recorder dump
 * (once per abort) and say so. */
static void wd_serve_dumps(void)
{
	for (;;) {
		int flag = 0;
		MPI_Status st;
		MPI_Test(&wd.dump_req, &flag, &st);
		if (!flag)
			return;
		if (!wd.dumped) {
			char reason[sizeof(wd.dump_in.reason) + 64];
			wd.dump_in.reason[sizeof(wd.dump_in.reason) - 1] = '\0';
			snprintf(reason, sizeof(reason), "asked by rank %d's watchdog: %s",
			         st.MPI_SOURCE, wd.dump_in.reason);
			comm_flight_dump(reason);
			wd.dumped = true;
		}
		MPI_Request req;
		MPI_Isend(&wd.ack, 1, MPI_INT, st.MPI_SOURCE, WD_TAG_DUMPED, wd.comm, &req);
		MPI_Request_free(&req);
		wd_post_dump();
	}
}

static void wd_serve_asks(void);

/* Answer every question and dump request that has arrived. */
static void wd_serve(void)
{
	wd_serve_asks();
	wd_serve_dumps();
}

/* Answer every question that has arrived: how far this rank is on the asked group. */
static void wd_serve_asks(void)
{
	for (;;) {
		int flag = 0;
		MPI_Status st;
		MPI_Test(&wd.ask_req, &flag, &st);
		if (!flag)
			return;
		struct wd_reply *r = &wd.replies[wd.next_reply++ % WD_REPLIES];
		memset(r, 0, sizeof(*r));
		r->entered = -1;
		r->step = __atomic_load_n(&wd_step, __ATOMIC_RELAXED);
		pthread_mutex_lock(&wd_mu);
		for (int i = 0; i < WD_GROUPS; i++)
			if (wd_groups[i].used && wd_groups[i].key == wd.ask_in.key)
				r->entered = wd_groups[i].entered;
		int n = 0;
		for (int s = 0; s < WD_SLOTS && n < (int)sizeof(r->doing) - 1; s++)
			if (wd_slots[s].used)
				n += snprintf(r->doing + n, sizeof(r->doing) - (size_t)n, "%s%s",
				              n ? "; " : "", wd_slots[s].what);
		pthread_mutex_unlock(&wd_mu);
		if (!n)
			snprintf(r->doing, sizeof(r->doing), "in no collective (computing?)");
		MPI_Request req;
		MPI_Isend(r, sizeof(*r), MPI_BYTE, st.MPI_SOURCE, WD_TAG_REPLY, wd.comm, &req);
		MPI_Request_free(&req);
		wd_post_ask();
	}
}

static void wd_sleep(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void *wd_reaper(void *arg)
{
	(void)arg;
	wd_sleep(WD_DUMP_SECONDS + 5.0);
	fprintf(stderr, "[rank %d] watchdog: MPI_Abort did not end the job; exiting\n",
	        comm_world_rank());
	_exit(1);
}

/* Before the job ends: ask every other rank to write its flight recorder dump, write this
 * rank's, and wait (serving the others' questions) until every rank not known dead (dead[],
 * by world rank) has written its own, or WD_DUMP_SECONDS have passed. */
static void wd_dump_everywhere(const char *reason, const bool *dead)
{
	int n = 0, me = comm_world_rank(), left = 0;
	MPI_Comm_size(wd.comm, &n);
	snprintf(wd.dump_out.reason, sizeof(wd.dump_out.reason), "%.*s",
	         (int)sizeof(wd.dump_out.reason) - 1, reason);
	/* the receive buffers stay allocated: the job ends before some of them complete */
	int *acks = xcalloc((size_t)n, sizeof(int));
	MPI_Request *req = xcalloc((size_t)n, sizeof(*req));
	for (int r = 0; r < n; r++) {
		req[r] = MPI_REQUEST_NULL;
		if (r == me)
			continue;
		MPI_Request sreq;
		MPI_Isend(&wd.dump_out, sizeof(wd.dump_out), MPI_BYTE, r, WD_TAG_DUMP, wd.comm,
		          &sreq);
		MPI_Request_free(&sreq);
		if (dead[r])
			continue;
		MPI_Irecv(&acks[r], 1, MPI_INT, r, WD_TAG_DUMPED, wd.comm, &req[r]);
		left++;
	}
	if (!wd.dumped) {
		comm_flight_dump(reason);
		wd.dumped = true;
	}
	for (double t0 = timer_now(); left > 0 && timer_now() - t0 < WD_DUMP_SECONDS;) {
		wd_serve();
		for (int r = 0; r < n; r++) {
			int flag = 0;
			if (req[r] == MPI_REQUEST_NULL)
				continue;
			MPI_Test(&req[r], &flag, MPI_STATUS_IGNORE);
			left -= flag != 0;
		}
		wd_sleep(0.01);
	}
}

/* Ask the other members of the stuck collective's group, name the missing ones, have every
 * rank write its flight recorder dump, abort. */
static _Noreturn void wd_fire(const struct wd_slot *sl, const struct wd_group *g, double waited)
{
	int me = comm_world_rank(), n = g ? g->size : 0;
	struct wd_reply *got = xcalloc((size_t)n + 1, sizeof(*got));
	MPI_Request *req = xcalloc((size_t)n + 1, sizeof(*req));
	struct wd_ask ask = {g ? g->key : 0, sl->seq};
	for (int i = 0; i < n; i++) {
		req[i] = MPI_REQUEST_NULL;
		if (g->world[i] == me)
			continue;
		MPI_Request sreq;
		MPI_Isend(&ask, sizeof(ask), MPI_BYTE, g->world[i], WD_TAG_ASK, wd.comm, &sreq);
		MPI_Request_free(&sreq);
		MPI_Irecv(&got[i], sizeof(got[i]), MPI_BYTE, g->world[i], WD_TAG_REPLY, wd.comm,
		          &req[i]);
	}
	bool *answered = xcalloc((size_t)n + 1, sizeof(bool));
	double t0 = timer_now();
	for (int left = n - (g ? 1 : 0); left > 0 && timer_now() - t0 < WD_ASK_SECONDS;) {
		wd_serve(); /* the others may be asking us at the same time */
		for (int i = 0; i < n; i++) {
			int flag = 0;
			if (req[i] == MPI_REQUEST_NULL || answered[i])
				continue;
			MPI_Test(&req[i], &flag, MPI_STATUS_IGNORE);
			if (flag)
				answered[i] = true, left--;
		}
		wd_sleep(0.02);
	}
	char missing[2048];
	int len = 0, count = 0;
	for (int i = 0; i < n && len < (int)sizeof(missing) - 1; i++) {
		if (g->world[i] == me)
			continue;
		if (!answered[i])
			len += snprintf(
			    missing + len, sizeof(missing) - (size_t)len,
			    "%srank %d (no answer within %.0f s: stopped, hung or cut off)",
			    count++ ? ", " : "", g->world[i], WD_ASK_SECONDS);
		else if (got[i].entered < sl->seq)
			len += snprintf(missing + len, sizeof(missing) - (size_t)len,
			                "%srank %d (at step %lld, %s)", count++ ? ", " : "",
			                g->world[i], (long long)got[i].step, got[i].doing);
	}
	if (!g)
		snprintf(missing, sizeof(missing), "unknown (unregistered communicator)");
	else if (!count)
		snprintf(missing, sizeof(missing),
		         "none: every rank arrived; the transport itself is stuck (a cut link?) or "
		         "the ranks issued different collectives (ctitan trace-comm shows which)");
	char msg[sizeof(missing) + 1024];
	snprintf(msg, sizeof(msg),
	         "watchdog: %s on group %s (%d ranks) has not completed after %.1f s "
	         "(comm.timeout_seconds = %g) at step %lld; ranks that did not arrive: %s",
	         sl->what, g ? g->name : "?", n, waited, wd.timeout_s,
	         (long long)__atomic_load_n(&wd_step, __ATOMIC_RELAXED), missing);
	LOG_ERROR("%s; aborting the job", msg);
	int world = 0;
	MPI_Comm_size(wd.comm, &world);
	bool *dead = xcalloc((size_t)world, sizeof(bool));
	for (int i = 0; i < n; i++)
		if (g->world[i] != me && !answered[i] && g->world[i] < world)
			dead[g->world[i]] = true;
	/* the reaper first: a dump stuck on a hung filesystem must not keep the job alive */
	pthread_t reaper;
	thread_start(&reaper, "ct-reaper", wd_reaper, NULL);
	wd_dump_everywhere(msg, dead);
	comm_abort(1);
}

static void *wd_main(void *arg)
{
	(void)arg;
	wd_post_ask();
	wd_post_dump();
	while (!__atomic_load_n(&wd.stop, __ATOMIC_ACQUIRE)) {
		wd_serve();
		if (comm_flight_take_request()) /* a signal asked (comm_flight_catch) */
			comm_flight_dump("on request (signal)");
		struct wd_slot late = {0};
		struct wd_group lg = {0};
		bool have_group = false;
		double now = timer_now(), waited = 0;
		pthread_mutex_lock(&wd_mu);
		for (int s = 0; s < WD_SLOTS; s++) {
			const struct wd_slot *sl = &wd_slots[s];
			if (sl->used && now - sl->t0 > wd.timeout_s) {
				late = *sl;
				waited = now - sl->t0;
				if (sl->group < 0 && sl->peer >= 0) { /* ask the one peer */
					lg.size = 2;
					snprintf(lg.name, sizeof(lg.name), "point-to-point");
					lg.world = xcalloc(2, sizeof(int));
					lg.world[0] = comm_world_rank();
					lg.world[1] = sl->peer;
					have_group = true;
				} else if (sl->group >= 0) {
					lg = wd_groups[sl->group];
					lg.world = xcalloc((size_t)lg.size, sizeof(int));
					memcpy(lg.world, wd_groups[sl->group].world,
					       (size_t)lg.size * sizeof(int));
					have_group = true;
				}
				break;
			}
		}
		pthread_mutex_unlock(&wd_mu);
		if (late.used)
			wd_fire(&late, have_group ? &lg : NULL, waited);
		wd_sleep(0.1);
	}
	MPI_Cancel(&wd.ask_req);
	MPI_Wait(&wd.ask_req, MPI_STATUS_IGNORE);
	MPI_Cancel(&wd.dump_req);
	MPI_Wait(&wd.dump_req, MPI_STATUS_IGNORE);
	return NULL;
}

void comm_watchdog_start(double timeout_s)
{
	CHECK(timeout_s > 0, "comm: watchdog timeout must be > 0");
	wd.timeout_s = timeout_s;
	if (wd.running)
		return;
	wd.stop = 0;
	MPI_Comm_dup(MPI_COMM_WORLD, &wd.comm);
	CHECK(thread_start(&wd.thread, "ct-watchdog", wd_main, NULL) == 0,
	      "cannot start the watchdog thread");
	wd.running = true;
}

static void *wd_finalize_guard(void *arg)
{
	(void)arg;
	wd_sleep(wd.timeout_s + WD_ASK_SECONDS);
	fprintf(stderr,
	        "[rank %d] watchdog: MPI_Finalize has not returned after %.0f s (a peer stopped "
	        "or cut off after the last collective?); exiting\n",
	        comm_world_rank(), wd.timeout_s + WD_ASK_SECONDS);
	_exit(1);
}

void comm_watchdog_stop(void)
{
	if (!wd.running)
		return;
	/* Every rank arrives here before any leaves, under the watchdog: a rank stopped or hung
	 * after the last collective is named instead of hanging MPI_Finalize's own fence. */
	int n = 0;
	MPI_Comm_size(wd.comm, &n);
	int *all = xcalloc((size_t)n, sizeof(int));
	for (int i = 0; i < n; i++)
		all[i] = i;
	wd_group_add(wd.comm, "world (finalize)", n, all);
	fr_group_add(wd.comm, "world (finalize)", n, comm_world_rank(), all);
	free(all);
	bool skip; /* (debug.skip_collective names the trainer's groups, never this one) */
	int64_t fr = fr_start(wd.comm, FR_BARRIER, FR_NO_DTYPE, 0, "before MPI_Finalize", &skip);
	comm_label("before MPI_Finalize");
	int slot = wd_enter("barrier", "ranks", wd.comm, n);
	MPI_Barrier(wd.comm);
	wd_leave(slot);
	fr_complete(fr);
	wd_group_remove(wd.comm);
	fr_group_remove(wd.comm);
	__atomic_store_n(&wd.stop, 1, __ATOMIC_RELEASE);
	pthread_join(wd.thread, NULL);
	MPI_Comm_free(&wd.comm);
	wd.running = false;
	/* MPI_Finalize waits for every peer too; past the timeout the process ends by itself */
	pthread_t guard;
	if (thread_start(&guard, "ct-finalize", wd_finalize_guard, NULL) == 0)
		pthread_detach(guard);
}
