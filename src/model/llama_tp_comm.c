/* Llama under tensor parallelism: its buffers and collectives — the sequence-parallel
 * all-gather and reduce-scatter on the compute path, and async TP's ring steps that hide
 * them behind the matmul beside them. The programs that call them are in llama_tp.c. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/timer.h"
#include "comm/comm.h"
#include "comm/p2p.h"
#include "comm/stream.h"
#include "model/llama_tp_impl.h"

double llama_tp_comm_seconds(const struct llama_model *m)
{
	return m->tpb ? m->tpb->comm_s : 0.0;
}

void llama_tp_build(struct llama_model *m, const struct llama_build_opts *opts)
{
	int64_t C = m->cfg.dim, Np = m->Np, Ns = m->Ns, S = m->tp->size;
	int64_t n = 2 * Np * C + 2 * Ns * C + Ns * C + S * C + 3 * m->ce_chunk;
	if (opts->tp_async)
		n += 3 * Ns * C;
	struct llama_tp_bufs *b = xcalloc(1, sizeof(*b));
	b->bytes = (size_t)n * sizeof(float);
	float *p = mem_alloc(MEM_ACTIVATIONS, b->bytes);
	memset(p, 0, b->bytes);
	b->xg = p;
	b->part = b->xg + Np * C;
	b->rs_scratch = b->part + Np * C;
	b->rs_out = b->rs_scratch + 2 * Ns * C;
	b->dnorm = b->rs_out + Ns * C;
	b->stat = b->dnorm + S * C;
	b->ring = opts->tp_async ? b->stat + 3 * m->ce_chunk : NULL;
	b->async = opts->tp_async;
	b->sim_bytes_per_s = opts->tp_sim_gbps > 0 ? opts->tp_sim_gbps * 1e9 / 8.0 : 0.0;
	b->sim_latency_s = b->sim_bytes_per_s > 0 ? opts->tp_sim_latency_us * 1e-6 : 0.0;
	b->timeout_s = opts->tp_timeout_s;
	m->tpb = b;
}

void llama_tp_free(struct llama_model *m)
{
	if (!m->tpb)
		return;
	mem_free(MEM_ACTIVATIONS, m->tpb->xg, m->tpb->bytes);
	free(m->tpb);
	m->tpb = NULL;
}

/* ---------------------------------------------------------------- collectives */

void llama_tp_add_rows(float *out, const float *a, const float *b, int64_t n)
{
#pragma omp parallel for simd schedule(static)
	for (int64_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

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

/* A simulated link (comm.simulate_*): a TP collective that moved `wire` bytes in `hops`
 * ring steps lasts at least hops x latency + wire / bandwidth from t0 (spent waiting). */
static void sim_stretch(const struct llama_tp_bufs *b, double t0, int64_t wire, int64_t hops)
{
	if (b->sim_bytes_per_s <= 0)
		return;
	wait_until(t0 + (double)hops * b->sim_latency_s + (double)wire / b->sim_bytes_per_s);
}

/* full(Np, C) = the token shards of every rank, in rank order. */
void llama_tp_gather(struct llama_model *m, const float *shard, float *full)
{
	int64_t bytes = m->Ns * m->cfg.dim * (int64_t)sizeof(float), S = m->tp->size;
	double t0 = timer_now();
	comm_all_gather(m->tp, shard, full, bytes);
	sim_stretch(m->tpb, t0, (S - 1) * bytes, S - 1);
	m->tpb->comm_s += timer_now() - t0;
}

/* out(Ns, C) = this rank's token rows of the sum over ranks of part(Np, C). Rows N..Np of
 * part (padding) are zeroed first. */
void llama_tp_reduce_scatter(struct llama_model *m, float *part, float *out)
{
	int64_t C = m->cfg.dim;
	memset(part + m->N * C, 0, (size_t)((m->Np - m->N) * C) * sizeof(float));
	int64_t S = m->tp->size;
	double t0 = timer_now();
	comm_reduce_scatter_f32(m->tp, part, out, m->Ns * C, m->tpb->rs_scratch);
	sim_stretch(m->tpb, t0, (S - 1) * m->Ns * C * (int64_t)sizeof(float), S - 1);
	m->tpb->comm_s += timer_now() - t0;
}

/* ---------------------------------------------------------------- async TP: ring steps
 *
 * All-gather + matmul: S steps; in step k rank r holds token block (r - k) mod S of the
 * gathered buffer, sends it to rank r + 1 and receives block (r - k - 1) from rank r - 1
 * while it multiplies the block it has. Matmul + reduce-scatter: in step k rank r computes its
 * partial sum of block (r - k - 1) mod S while the running sum of that block travels from
 * rank r - 1; it adds the two and passes the sum on; after S steps it holds the sum of its
 * own block. Only the time spent waiting for a transfer is TP communication on the compute
 * path (exposed); with a simulated link a transfer arrives no earlier than latency +
 * bytes / bandwidth after it was posted. */

/* Rows [r0, r0 + n) of the micro-batch's N tokens that token block `blk` covers (n <= 0:
 * only padding). */
static int64_t block_rows(const struct llama_model *m, int64_t blk, int64_t *r0)
{
	*r0 = blk * m->Ns;
	int64_t n = m->N - *r0;
	return n < m->Ns ? n : m->Ns;
}

/* One ring step's transfer: on the comm stream when the model has one (its thread moves the
 * block while this thread multiplies), else non-blocking point-to-point transfers that MPI
 * advances inside the wait. The simulated link stretches either: the stream's own, or here
 * (a transfer arrives no earlier than latency + bytes / bandwidth after it was posted). */
struct ring_xfer {
	struct comm_p2p send, recv;
	int64_t ticket;
	double arrive;
	bool open;
};

#define RING_TAG 0x5470 /* the TP group's point-to-point tags: RING_TAG + step */

static void xfer_post(struct llama_model *m, struct ring_xfer *x, const void *send, void *recv,
                      int64_t bytes, int step, const char *what)
{
	struct llama_tp_bufs *b = m->tpb;
	int S = m->tp->size, R = m->tp->rank, right = (R + 1) % S, left = (R + S - 1) % S;
	memset(x, 0, sizeof(*x));
	x->open = true;
	if (b->stream) {
		struct comm_op op = {.kind = COMM_SENDRECV,
		                     .group = m->tp,
		                     .send = send,
		                     .recv = recv,
		                     .count = bytes,
		                     .what = what,
		                     .to = right,
		                     .from = left,
		                     .tag = RING_TAG + step};
		x->ticket = comm_stream_enqueue(b->stream, &op);
		return;
	}
	comm_p2p_irecv(m->tp, left, RING_TAG + step, recv, bytes, &x->recv);
	comm_p2p_isend(m->tp, right, RING_TAG + step, send, bytes, &x->send);
	if (b->sim_bytes_per_s > 0)
		x->arrive = timer_now() + b->sim_latency_s + (double)bytes / b->sim_bytes_per_s;
}

/* Block until the step's block has arrived and its own is sent; the wait is TP
 * communication on the compute path (exposed). */
static void xfer_wait(struct llama_model *m, struct ring_xfer *x, const char *what)
{
	if (!x->open)
		return;
	double t0 = timer_now();
	if (x->ticket) {
		comm_stream_wait(m->tpb->stream, x->ticket);
	} else {
		comm_p2p_wait(&x->recv, m->tpb->timeout_s, what);
		comm_p2p_wait(&x->send, m->tpb->timeout_s, what);
		if (x->arrive > 0)
			wait_until(x->arrive);
	}
	x->open = false;
	m->tpb->comm_s += timer_now() - t0;
}

/* full(Np, C) = every rank's shard (as sp_gather); fn(m, ctx, r0, n, NULL) runs on each
 * block of real rows as soon as it is here. */
void llama_tp_ring_gather(struct llama_model *m, const float *shard, float *full,
                          llama_tp_ring_fn fn, const void *ctx)
{
	int64_t C = m->cfg.dim, S = m->tp->size, R = m->tp->rank, blk = m->Ns * C;
	int64_t bytes = blk * (int64_t)sizeof(float);
	memcpy(full + R * blk, shard, (size_t)bytes);
	for (int64_t k = 0; k < S; k++) {
		int64_t have = (R - k + S) % S, next = (R - k - 1 + S) % S, r0;
		struct ring_xfer x = {0};
		if (k < S - 1)
			xfer_post(m, &x, full + have * blk, full + next * blk, bytes, (int)k,
			          "async TP all-gather ring step");
		int64_t n = block_rows(m, have, &r0);
		if (fn && n > 0)
			fn(m, ctx, r0, n, NULL);
		xfer_wait(m, &x, "async TP all-gather ring step");
	}
}

/* out(Ns, C) = this rank's block of the sum over ranks of the partial sums that
 * fn(m, ctx, r0, n, dst) writes for rows [r0, r0 + n) into dst (n x C, zeroed first). Two
 * sum buffers alternate: one travels while the next is computed. */
void llama_tp_ring_reduce_scatter(struct llama_model *m, float *out, llama_tp_ring_fn fn,
                                  const void *ctx)
{
	int64_t C = m->cfg.dim, S = m->tp->size, R = m->tp->rank, blk = m->Ns * C;
	int64_t bytes = blk * (int64_t)sizeof(float);
	float *buf[2] = {m->tpb->ring, m->tpb->ring + blk}, *rin = m->tpb->ring + 2 * blk;
	struct ring_xfer x = {0};
	for (int64_t k = 0; k < S; k++) {
		int64_t b = (R - k - 1 + S) % S, r0;
		float *acc = k == S - 1 ? out : buf[k & 1];
		memset(acc, 0, (size_t)bytes);
		int64_t n = block_rows(m, b, &r0);
		if (n > 0)
			fn(m, ctx, r0, n, acc);
		if (k > 0) {
			xfer_wait(m, &x, "async TP reduce-scatter ring step");
			llama_tp_add_rows(acc, acc, rin, blk);
		}
		if (k < S - 1)
			xfer_post(m, &x, acc, rin, bytes, (int)k,
			          "async TP reduce-scatter ring step");
	}
}

void llama_tp_use_stream(struct llama_model *m, struct comm_stream *stream)
{
	if (m->tpb && m->tpb->async)
		m->tpb->stream = stream;
}
