/* comm/stream: the comm stream — a per-rank FIFO of collectives with completion tickets.
 *
 * The compute side enqueues a collective and later waits on its ticket. MPI does not advance
 * non-blocking collectives while a rank computes, so the stream is progressed either by a
 * dedicated thread that makes the blocking calls in FIFO order (STREAM_THREAD: communication
 * proceeds while the caller computes; the thread sleeps on a condition variable when the
 * queue is empty, so it costs no CPU while idle, and before each collective sleeps until the
 * group's other ranks have reached it — comm_arrive — rather than busy-polling in MPI for a
 * late peer on a core that compute needs), or runs each collective at enqueue time
 * (STREAM_INLINE: no thread, no overlap; the baseline). Every collective runs under the
 * watchdog (comm/watchdog.h), which ends a stuck one after the timeout and names the ranks
 * that did not arrive; a wait on the stream that outlasts it names the op and aborts too. The
 * thread ("ct-comm") blocks asynchronous signals and runs no OpenMP team of its own.
 *
 * Each op's start and end on the stream are kept for the last STREAM_HISTORY tickets (traces).
 * A simulated link (comm_stream_simulate) makes every op last at least latency + bytes /
 * bandwidth, so overlap can be studied on one machine whose shared memory is far faster than
 * a network; bytes are what this rank sends in a ring: (ranks - 1) x the per-rank payload.
 *
 * Rule: while collectives are in flight on the stream, the caller makes no collective calls of
 * its own on the same groups.
 */
#ifndef CT_COMM_STREAM_H
#define CT_COMM_STREAM_H

#include <stdint.h>

#include "comm/comm.h"

enum stream_mode { STREAM_THREAD, STREAM_INLINE, STREAM_MODE_COUNT };

struct comm_op {
	enum comm_kind kind; /* COMM_ALL_GATHER, COMM_REDUCE_SCATTER, COMM_SENDRECV or
	                        COMM_ALL_TO_ALL */
	const struct comm_group *group;
	const void *send; /* reduce-scatter: overwritten (the collective's working buffer) */
	void *recv;
	int64_t count;     /* all-gather, sendrecv: bytes (per rank); reduce-scatter: floats */
	float *scratch;    /* reduce-scatter: count floats */
	const char *what;  /* label for errors and traces, e.g. "all-gather unit 3" */
	int to, from, tag; /* sendrecv: send `count` bytes to rank `to` of the group, receive as
	                      many from `from`, point-to-point with this tag (async TP's rings) */
	/* all-to-all (comm_all_to_all_v; count unused): block q of send, send_bytes[q] long, to
	 * rank q; recv_bytes[q] from it. The two arrays, like the buffers, stay valid until the
	 * ticket completes (expert parallelism's dispatch, overlapped with the shared expert) */
	const int64_t *send_bytes, *recv_bytes;
};

struct comm_stream;

struct comm_stream *comm_stream_create(enum stream_mode mode, double timeout_s);
void comm_stream_destroy(struct comm_stream *s);
/* Returns the op's ticket (increasing from 1). The op struct and its label (`what`) are
 * copied, so the label may live on the caller's stack; buffers must stay valid until the
 * ticket completes. */
int64_t comm_stream_enqueue(struct comm_stream *s, const struct comm_op *op);
void comm_stream_wait(struct comm_stream *s, int64_t ticket);
/* Wait for everything enqueued so far. */
void comm_stream_sync(struct comm_stream *s);
/* The label of a recent ticket (a copy owned by the stream; NULL if too old or not issued). */
const char *comm_stream_op_label(struct comm_stream *s, int64_t ticket);
/* Seconds the caller spent blocked in waits since creation (exposed communication). */
double comm_stream_wait_seconds(const struct comm_stream *s);
/* When the op of a completed ticket ran (timer_now seconds), and the CPU seconds the thread
 * that ran it spent in it (*cpu, may be NULL: copies, reductions, polling; not the simulated
 * link's sleep nor the arrival wait's); 0s if too old. */
void comm_stream_op_times(struct comm_stream *s, int64_t ticket, double *t0, double *t1,
                          double *cpu);
/* Simulated link: gbps gigabits per second (0: off) and a per-op latency in microseconds. */
void comm_stream_simulate(struct comm_stream *s, double gbps, double latency_us);
/* Bytes this rank sends in a ring for op (what the simulated link charges). */
int64_t comm_op_wire_bytes(const struct comm_op *op);
int stream_mode_parse(const char *name, enum stream_mode *mode);

#endif
