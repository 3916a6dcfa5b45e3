#include "parallel/tp_coll.h"

#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/timer.h"

#define RING_TAG 0x5470 /* the TP group's point-to-point tags: RING_TAG + step */

/* Sleep until timer_now() reaches `until` (a simulated transfer's arrival). */
static void wait_until(double until)
{
	double left = until - timer_now();
	if (left > 0) {
		struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
		nanosleep(&ts, NULL);
	}
	while (timer_now() < until)
		;
}

/* A collective that moved `wire` bytes in `hops` ring steps lasts at least hops x latency +
 * wire / bandwidth from t0 on a simulated link. */
static void sim_stretch(const struct tp_coll *c, double t0, int64_t wire, int64_t hops)
{
	if (c->sim_bytes_per_s <= 0)
		return;
	wait_until(t0 + (double)hops * c->sim_latency_s + (double)wire / c->sim_bytes_per_s);
}

static void op_all_gather(void *ctx, const void *send, void *recv, int64_t bytes, bool on_link)
{
	struct tp_coll *c = ctx;
	int64_t S = c->g->size;
	double t0 = timer_now();
	comm_all_gather(c->g, send, recv, bytes);
	if (on_link)
		sim_stretch(c, t0, (S - 1) * bytes, S - 1);
	c->comm_s += timer_now() - t0;
}

static void op_reduce_scatter(void *ctx, float *send, float *recv, int64_t count, float *scratch)
{
	struct tp_coll *c = ctx;
	int64_t S = c->g->size;
	double t0 = timer_now();
	comm_reduce_scatter_f32(c->g, send, recv, count, scratch);
	sim_stretch(c, t0, (S - 1) * count * (int64_t)sizeof(float), S - 1);
	c->comm_s += timer_now() - t0;
}

static void op_all_reduce_sum(void *ctx, float *buf, int64_t n)
{
	struct tp_coll *c = ctx;
	double t0 = timer_now();
	comm_all_reduce_f32(c->g, buf, n);
	c->comm_s += timer_now() - t0;
}

static void op_all_reduce_max(void *ctx, float *buf, int64_t n)
{
	struct tp_coll *c = ctx;
	double t0 = timer_now();
	comm_all_reduce_max_f32(c->g, buf, n);
	c->comm_s += timer_now() - t0;
}

static void op_ring_post(void *ctx, const void *send, void *recv, int64_t bytes, int step,
                         const char *what)
{
	struct tp_coll *c = ctx;
	int S = c->g->size, R = c->g->rank, right = (R + 1) % S, left = (R + S - 1) % S;
	CHECK(!c->open, "tensor parallelism: ring step %d posted while one is in flight", step);
	c->open = true;
	c->ticket = 0;
	c->arrive = 0.0;
	if (c->stream) {
		struct comm_op op = {.kind = COMM_SENDRECV,
		                     .group = c->g,
		                     .send = send,
		                     .recv = recv,
		                     .count = bytes,
		                     .what = what,
		                     .to = right,
		                     .from = left,
		                     .tag = RING_TAG + step};
		c->ticket = comm_stream_enqueue(c->stream, &op);
		return;
	}
	comm_p2p_irecv(c->g, left, RING_TAG + step, recv, bytes, &c->recv);
	comm_p2p_isend(c->g, right, RING_TAG + step, send, bytes, &c->send);
	if (c->sim_bytes_per_s > 0)
		c->arrive = timer_now() + c->sim_latency_s + (double)bytes / c->sim_bytes_per_s;
}

/* Block until the step's block has arrived and its own is sent. */
static void op_ring_wait(void *ctx, const char *what)
{
	struct tp_coll *c = ctx;
	if (!c->open)
		return;
	double t0 = timer_now();
	if (c->ticket) {
		comm_stream_wait(c->stream, c->ticket);
	} else {
		comm_p2p_wait(&c->recv, c->timeout_s, what);
		comm_p2p_wait(&c->send, c->timeout_s, what);
		if (c->arrive > 0)
			wait_until(c->arrive);
	}
	c->open = false;
	c->comm_s += timer_now() - t0;
}

/* What an all-to-all sends to the other ranks, in one hop */
static int64_t a2a_wire(const struct tp_coll *c, const int64_t *send_bytes)
{
	int64_t wire = 0;
	for (int q = 0; q < c->g->size; q++)
		wire += q == c->g->rank ? 0 : send_bytes[q];
	return wire;
}

static void op_all_to_all_v(void *ctx, const void *send, const int64_t *send_bytes, void *recv,
                            const int64_t *recv_bytes)
{
	struct tp_coll *c = ctx;
	double t0 = timer_now();
	comm_all_to_all_v(c->g, send, send_bytes, recv, recv_bytes);
	if (c->sim_bytes_per_s > 0)
		sim_stretch(c, t0, a2a_wire(c, send_bytes), 1);
	c->comm_s += timer_now() - t0;
}

/* Expert parallelism's overlapped all-to-all: on the comm stream when there is one (its
 * thread moves the rows while the caller computes the shared expert), else run here, at once,
 * with the simulated link's arrival kept for the wait. */
static void op_all_to_all_v_post(void *ctx, const void *send, const int64_t *send_bytes,
                                 void *recv, const int64_t *recv_bytes, const char *what)
{
	struct tp_coll *c = ctx;
	CHECK(!c->open, "expert parallelism: %s posted while an all-to-all is in flight", what);
	c->open = true; /* the group's one operation in flight (a ring step's slot) */
	c->ticket = 0;
	c->arrive = 0.0;
	double t0 = timer_now();
	if (c->stream) {
		struct comm_op op = {.kind = COMM_ALL_TO_ALL,
		                     .group = c->g,
		                     .send = send,
		                     .recv = recv,
		                     .what = what,
		                     .send_bytes = send_bytes,
		                     .recv_bytes = recv_bytes};
		c->ticket = comm_stream_enqueue(c->stream, &op);
		c->comm_s += timer_now() - t0;
		return;
	}
	comm_all_to_all_v(c->g, send, send_bytes, recv, recv_bytes);
	if (c->sim_bytes_per_s > 0)
		c->arrive =
		    t0 + c->sim_latency_s + (double)a2a_wire(c, send_bytes) / c->sim_bytes_per_s;
	c->comm_s += timer_now() - t0;
}

static void op_all_to_all_v_wait(void *ctx, const char *what)
{
	struct tp_coll *c = ctx;
	CHECK(c->open, "expert parallelism: a wait on %s with nothing in flight", what);
	double t0 = timer_now();
	if (c->ticket)
		comm_stream_wait(c->stream, c->ticket);
	else if (c->arrive > 0)
		wait_until(c->arrive);
	c->open = false;
	c->comm_s += timer_now() - t0;
}

void tp_coll_init(struct tp_coll *c, const struct comm_group *g, double sim_gbps,
                  double sim_latency_us, double timeout_s)
{
	memset(c, 0, sizeof(*c));
	c->g = g;
	c->sim_bytes_per_s = sim_gbps > 0 ? sim_gbps * 1e9 / 8.0 : 0.0;
	c->sim_latency_s = c->sim_bytes_per_s > 0 ? sim_latency_us * 1e-6 : 0.0;
	c->timeout_s = timeout_s;
	c->ops = (struct model_group){.size = g->size,
	                             .rank = g->rank,
	                             .ctx = c,
	                             .all_gather = op_all_gather,
	                             .reduce_scatter_f32 = op_reduce_scatter,
	                             .all_reduce_sum_f32 = op_all_reduce_sum,
	                             .all_reduce_max_f32 = op_all_reduce_max,
	                             .ring_post = op_ring_post,
	                             .ring_wait = op_ring_wait,
	                             .all_to_all_v = op_all_to_all_v,
	                             .all_to_all_v_post = op_all_to_all_v_post,
	                             .all_to_all_v_wait = op_all_to_all_v_wait};
}

void tp_coll_use_stream(struct tp_coll *c, struct comm_stream *stream)
{
	c->stream = stream;
}

double tp_coll_seconds(const struct tp_coll *c)
{
	return c ? c->comm_s : 0.0;
}
