#include "comm/stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"
#include "base/thread.h"
#include "base/timer.h"
#include "comm/flight.h"
#include "comm/p2p.h"
#include "comm/watchdog.h"

#define STREAM_CAP   256
#define STREAM_LABEL 96
/* The watchdog (comm/watchdog.h) ends a stuck collective after the timeout plus the seconds
 * it spends asking the peers; a wait on the stream gives up only after that, as a backstop
 * for the case where the comm thread itself is stuck outside a collective. */
#define STREAM_BACKSTOP_S 8.0

struct comm_stream {
	enum stream_mode mode;
	double timeout_s;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_done;
	struct comm_op q[STREAM_CAP];
	char what[STREAM_CAP][STREAM_LABEL]; /* copies of q[i].what: callers pass stack buffers */
	int64_t enqueued, done;              /* tickets: op k occupies q[(k-1) % CAP] */
	bool stop;
	double wait_s;
	double sim_bytes_per_s, sim_latency_s;       /* simulated link; 0: off */
	double op_t0[STREAM_CAP], op_t1[STREAM_CAP]; /* by ticket % CAP, once done */
	double op_cpu[STREAM_CAP];                   /* CPU seconds the op's thread spent in it */
	int64_t fr[STREAM_CAP]; /* q[i]'s flight recorder entry (scheduled at enqueue) */
};

static const char *const stream_mode_names[] = {"thread", "inline"};
_Static_assert(sizeof(stream_mode_names) / sizeof(stream_mode_names[0]) == STREAM_MODE_COUNT,
               "one name per mode");

int stream_mode_parse(const char *name, enum stream_mode *mode)
{
	for (int i = 0; i < STREAM_MODE_COUNT; i++)
		if (strcmp(name, stream_mode_names[i]) == 0) {
			*mode = (enum stream_mode)i;
			return CT_OK;
		}
	return CT_ERR_USAGE;
}

int64_t comm_op_wire_bytes(const struct comm_op *op)
{
	if (op->kind == COMM_SENDRECV) /* one hop */
		return op->count;
	if (op->kind == COMM_ALL_TO_ALL) { /* what goes to the other ranks, in one hop */
		int64_t w = 0;
		for (int q = 0; q < op->group->size; q++)
			w += q == op->group->rank ? 0 : op->send_bytes[q];
		return w;
	}
	int64_t per_rank = op->kind == COMM_REDUCE_SCATTER ? op->count * 4 : op->count;
	return (int64_t)(op->group->size - 1) * per_rank;
}

void comm_stream_simulate(struct comm_stream *s, double gbps, double latency_us)
{
	s->sim_bytes_per_s = gbps > 0 ? gbps * 1e9 / 8.0 : 0.0;
	s->sim_latency_s = gbps > 0 || latency_us > 0 ? latency_us * 1e-6 : 0.0;
}

/* Stretch an op that ran faster than the simulated link would carry it. */
static void op_simulate(const struct comm_stream *s, const struct comm_op *op, double t0)
{
	if (s->sim_bytes_per_s <= 0 && s->sim_latency_s <= 0)
		return;
	if (op->group->size < 2)
		return;
	double want = s->sim_latency_s;
	if (s->sim_bytes_per_s > 0)
		want += (double)comm_op_wire_bytes(op) / s->sim_bytes_per_s;
	double left = t0 + want - timer_now();
	if (left <= 0)
		return;
	struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* A collective queued: its flight recorder entry, numbered now (comm/flight.h); the ring
 * steps' transfers are recorded as they are posted. */
static int64_t op_schedule(const struct comm_op *op)
{
	if (op->group->size < 2 || op->kind == COMM_SENDRECV)
		return 0;
	if (op->kind == COMM_ALL_TO_ALL) {
		int64_t sent = 0;
		for (int q = 0; q < op->group->size; q++)
			sent += op->send_bytes[q];
		return fr_schedule(op->group->handle, FR_ALL_TO_ALL, FR_U8, sent, op->what);
	}
	bool rs = op->kind == COMM_REDUCE_SCATTER;
	return fr_schedule(op->group->handle, rs ? FR_REDUCE_SCATTER : FR_ALL_GATHER,
	                   rs ? FR_F32 : FR_U8, rs ? op->count * 4 : op->count, op->what);
}

/* Run op (fr: its flight recorder entry); on the comm thread (arrive), first wait for the group's
 * other ranks without spinning (comm_arrive): MPI's blocking collectives busy-poll, and a comm
 * thread polling for a late peer takes the core compute shares with it. Returns the CPU seconds
 * this thread spent (the simulated link's sleep comes after and is not counted). */
static double op_run(const struct comm_op *op, bool arrive, int64_t fr)
{
	double cpu0 = timer_thread_cpu();
	fr_adopt(fr);
	if (arrive && op->kind != COMM_SENDRECV) {
		if (op->what)
			comm_label("%s", op->what);
		comm_arrive(op->group);
	}
	if (op->what) /* (the label is one-shot: the arrival took the first) */
		comm_label("%s", op->what);
	switch (op->kind) {
	case COMM_ALL_GATHER:
		comm_all_gather(op->group, op->send, op->recv, op->count);
		break;
	case COMM_REDUCE_SCATTER:
		/* the caller's send buffer is the collective's working memory (comm.h) */
		comm_reduce_scatter_f32(op->group, (float *)op->send, op->recv, op->count,
		                        op->scratch);
		break;
	case COMM_ALL_TO_ALL:
		comm_all_to_all_v(op->group, op->send, op->send_bytes, op->recv, op->recv_bytes);
		break;
	case COMM_SENDRECV: { /* watched by the watchdog (comm_p2p_wait) */
		struct comm_p2p sr = {0}, rr = {0};
		fr_p2p_label(op->what);
		comm_p2p_irecv(op->group, op->from, op->tag, op->recv, op->count, &rr);
		comm_p2p_isend(op->group, op->to, op->tag, op->send, op->count, &sr);
		fr_p2p_label(NULL);
		comm_p2p_wait(&rr, 0.0, op->what ? op->what : "sendrecv");
		comm_p2p_wait(&sr, 0.0, op->what ? op->what : "sendrecv");
		break;
	}
	default:
		CHECK(false, "comm stream: unsupported op kind %d", op->kind);
	}
	return timer_thread_cpu() - cpu0;
}

static void *stream_main(void *arg)
{
	struct comm_stream *s = arg;
#ifdef _OPENMP
	/* The compute thread's OpenMP team owns the cores: a team here would oversubscribe them
	 * (the reduce-scatter's sum loop runs on this thread). */
	omp_set_num_threads(1);
#endif
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->stop && s->done == s->enqueued)
			pthread_cond_wait(&s->cv_work, &s->mu);
		if (s->done == s->enqueued && s->stop)
			break;
		struct comm_op op = s->q[s->done % STREAM_CAP];
		int64_t fr = s->fr[s->done % STREAM_CAP];
		pthread_mutex_unlock(&s->mu);
		double t0 = timer_now();
		double cpu = op_run(&op, true, fr);
		op_simulate(s, &op, t0);
		double t1 = timer_now();
		pthread_mutex_lock(&s->mu);
		s->op_t0[(s->done + 1) % STREAM_CAP] = t0;
		s->op_t1[(s->done + 1) % STREAM_CAP] = t1;
		s->op_cpu[(s->done + 1) % STREAM_CAP] = cpu;
		s->done++;
		pthread_cond_broadcast(&s->cv_done);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

struct comm_stream *comm_stream_create(enum stream_mode mode, double timeout_s)
{
	struct comm_stream *s = xcalloc(1, sizeof(*s));
	s->mode = mode;
	s->timeout_s = timeout_s;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv_work, NULL);
	pthread_cond_init(&s->cv_done, NULL);
	if (mode == STREAM_THREAD)
		CHECK(thread_start(&s->thread, "ct-comm", stream_main, s) == 0,
		      "cannot start the communication thread");
	return s;
}

void comm_stream_destroy(struct comm_stream *s)
{
	if (!s)
		return;
	if (s->mode == STREAM_THREAD) {
		pthread_mutex_lock(&s->mu);
		s->stop = true;
		pthread_cond_signal(&s->cv_work);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->thread, NULL);
	}
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv_work);
	pthread_cond_destroy(&s->cv_done);
	free(s);
}

int64_t comm_stream_enqueue(struct comm_stream *s, const struct comm_op *op)
{
	if (s->mode == STREAM_INLINE) {
		int64_t at = s->enqueued % STREAM_CAP;
		s->q[at] = *op;
		snprintf(s->what[at], STREAM_LABEL, "%s", op->what ? op->what : "a collective");
		s->q[at].what = s->what[at];
		double t0 = timer_now();
		double cpu = op_run(op, false, op_schedule(op));
		op_simulate(s, op, t0);
		double t1 = timer_now();
		s->wait_s += t1 - t0; /* all of it is exposed */
		s->done = ++s->enqueued;
		s->op_t0[s->enqueued % STREAM_CAP] = t0;
		s->op_t1[s->enqueued % STREAM_CAP] = t1;
		s->op_cpu[s->enqueued % STREAM_CAP] = cpu;
		return s->enqueued;
	}
	pthread_mutex_lock(&s->mu);
	CHECK(s->enqueued - s->done < STREAM_CAP, "comm stream: more than %d ops in flight",
	      STREAM_CAP);
	int64_t at = s->enqueued % STREAM_CAP;
	s->q[at] = *op;
	snprintf(s->what[at], STREAM_LABEL, "%s", op->what ? op->what : "a collective");
	s->q[at].what = s->what[at];
	s->fr[at] = op_schedule(op);
	int64_t ticket = ++s->enqueued;
	pthread_cond_signal(&s->cv_work);
	pthread_mutex_unlock(&s->mu);
	return ticket;
}

void comm_stream_wait(struct comm_stream *s, int64_t ticket)
{
	if (s->mode == STREAM_INLINE)
		return;
	double t0 = timer_now();
	pthread_mutex_lock(&s->mu);
	while (s->done < ticket) {
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 1;
		pthread_cond_timedwait(&s->cv_done, &s->mu, &dl);
		if (s->done < ticket && timer_now() - t0 > s->timeout_s + STREAM_BACKSTOP_S) {
			char what[STREAM_LABEL], msg[STREAM_LABEL + 160];
			snprintf(what, sizeof(what), "%s", s->q[s->done % STREAM_CAP].what);
			pthread_mutex_unlock(&s->mu);
			snprintf(
			    msg, sizeof(msg),
			    "%s did not complete within %.0f s (comm.timeout_seconds + %.0f s): a "
			    "peer rank has died or hangs",
			    what, s->timeout_s + STREAM_BACKSTOP_S, STREAM_BACKSTOP_S);
			LOG_ERROR("%s; aborting the job", msg);
			comm_flight_dump(msg);
			comm_abort(1);
		}
	}
	pthread_mutex_unlock(&s->mu);
	s->wait_s += timer_now() - t0;
}

void comm_stream_sync(struct comm_stream *s)
{
	comm_stream_wait(s, s->enqueued);
}

void comm_stream_op_times(struct comm_stream *s, int64_t ticket, double *t0, double *t1,
                          double *cpu)
{
	*t0 = *t1 = 0.0;
	if (cpu)
		*cpu = 0.0;
	pthread_mutex_lock(&s->mu);
	if (ticket > 0 && ticket <= s->done && s->done - ticket < STREAM_CAP) {
		*t0 = s->op_t0[ticket % STREAM_CAP];
		*t1 = s->op_t1[ticket % STREAM_CAP];
		if (cpu)
			*cpu = s->op_cpu[ticket % STREAM_CAP];
	}
	pthread_mutex_unlock(&s->mu);
}

const char *comm_stream_op_label(struct comm_stream *s, int64_t ticket)
{
	const char *w = NULL;
	pthread_mutex_lock(&s->mu);
	if (ticket > 0 && ticket <= s->enqueued && s->enqueued - ticket < STREAM_CAP)
		w = s->q[(ticket - 1) % STREAM_CAP].what;
	pthread_mutex_unlock(&s->mu);
	return w;
}

double comm_stream_wait_seconds(const struct comm_stream *s)
{
	return s->wait_s;
}
