/* comm/flight: the flight recorder — what every communicator did last, for diagnosing hangs.
 *
 * Per registered group (communicator of size > 1) a ring of its last N collectives and
 * point-to-point transfers (N: comm_flight_configure; 0 turns the rings off). An entry holds
 * the collective's sequence number on that group (1, 2, ...: the k-th collective a rank
 * issues on a group is the k-th of every member, so entries match across ranks by it), or for
 * a transfer the peer, the tag and which message with that peer it is (the n-th send to it, the
 * n-th receive from it); the op, bytes per rank, element type, the label and the schedule node
 * that issued it (when known), the training step, and its state — scheduled (queued on the
 * comm stream), started (in MPI), completed — with when it reached each. comm.c, p2p.c and
 * stream.c record into it, so every path is covered: blocking collectives on any thread, the
 * comm stream in both progress modes, async TP's rings, pipeline transfers. A record is a
 * few stores under one mutex (never held across an MPI call).
 *
 * comm_flight_dump writes this rank's rings as JSON to <dump_folder>/comm_traces/rank_N.json
 * (written under a temporary name, then renamed, so a reader never sees half a file). The
 * watchdog (comm/watchdog.h) dumps on every rank that still runs before it ends a hung job,
 * and dumps this rank when asked by a signal (comm_flight_catch: the handler only sets a flag,
 * the watchdog thread polls it). `ctitan trace-comm DIR` reads the dumps and names the first
 * collective some rank never joined, and any op or size mismatch at one sequence number.
 */
#ifndef CT_COMM_FLIGHT_H
#define CT_COMM_FLIGHT_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"

#define FR_DEFAULT_ENTRIES 2000
#define FR_LABEL           96

enum fr_op {
	FR_ALL_GATHER,
	FR_REDUCE_SCATTER,
	FR_ALL_REDUCE,
	FR_ALL_REDUCE_MAX,
	FR_BARRIER,
	FR_SEND,
	FR_RECV,
	FR_ALL_TO_ALL,
	FR_OP_COUNT
};
enum fr_dtype { FR_U8, FR_F32, FR_F64, FR_I64, FR_NO_DTYPE, FR_DTYPE_COUNT };
enum fr_state { FR_SCHEDULED, FR_STARTED, FR_COMPLETED, FR_STATE_COUNT };

/* Names in dumps: "all-gather", ...; "u8", "f32", ...; "scheduled", "started", "completed". */
const char *fr_op_name(enum fr_op op);
const char *fr_dtype_name(enum fr_dtype t);
const char *fr_state_name(enum fr_state s);

struct fr_entry {
	int64_t record; /* position in the group's history (0, 1, ...: collectives and transfers) */
	int64_t seq;    /* collectives: per-group sequence number from 1; transfers: 0 */
	int64_t p2p_seq; /* transfers: the n-th send to / receive from this peer on the group */
	int64_t bytes;   /* per rank: all-gather's piece, reduce-scatter's output, the buffer */
	int64_t step;    /* training step when issued (-1: none) */
	double t_scheduled, t_started, t_completed; /* timer_now seconds; 0: not reached */
	int peer, tag; /* transfers: the peer's rank in the group, the MPI tag; else -1, 0 */
	int node;      /* schedule node index that issued it (-1: unknown) */
	const char *node_kind; /* the node's kind name (static string) or NULL */
	uint8_t op, dtype, state;
	char label[FR_LABEL]; /* "all-gather of bucket 3", comm_label's text, ... */
};

/* ---- for the trainer and the tools */

/* Ring size per group (0: off; changing it drops recorded entries but keeps the sequence
 * numbers) and the job's dump folder (dumps go to <dump_folder>/comm_traces/; NULL or "": no
 * dumps). Copied. */
void comm_flight_configure(int64_t entries, const char *dump_folder);
/* The schedule node the calling thread runs now (its collectives are recorded with it);
 * node < 0: none. kind must be a static string. */
void comm_flight_node(int node, const char *kind);
/* Debug fault injection (debug.skip_collective_*): world rank `rank` issues a barrier in place
 * of its seq-th collective on the group named `group`, so the job hangs on a desynchronised
 * collective the way a rank-divergent branch would make it. rank < 0: off. */
void comm_flight_skip_collective(int rank, const char *group, int64_t seq);
/* Install a handler for signo that asks for a dump (the watchdog thread writes it within
 * ~0.1 s). Returns 0 or -1 (sigaction failed). */
int comm_flight_catch(int signo);
/* Async-signal-safe: ask for a dump; comm_flight_take_request returns true once per ask. */
void comm_flight_request_dump(void);
bool comm_flight_take_request(void);
/* Write this rank's dump now, with a reason line. CT_OK (also when no dump folder is set) or
 * CT_ERR_RUNTIME with a message naming the file. */
int comm_flight_dump(const char *reason);
/* Where this rank's dump goes ("" when no dump folder is set). */
const char *comm_flight_dump_path(void);
/* Copy up to max entries of g's ring, oldest first, into out; returns how many. *last_seq
 * (may be NULL): the group's last collective sequence number issued on this rank. */
int comm_flight_snapshot(const struct comm_group *g, struct fr_entry *out, int max,
                         int64_t *last_seq);

/* ---- for the comm layer (comm.c, p2p.c, stream.c, watchdog.c) */

void fr_group_add(void *comm, const char *name, int size, int rank, const int *world_ranks);
void fr_group_remove(void *comm);
void fr_set_step(int64_t step);
/* A collective queued on the comm stream: a scheduled entry; returns its id (0: none). */
int64_t fr_schedule(void *comm, enum fr_op op, enum fr_dtype dt, int64_t bytes, const char *label);
/* The calling thread's next collective on the same communicator is the scheduled entry id
 * (the comm thread runs what the compute thread queued). */
void fr_adopt(int64_t id);
/* A collective enters MPI: starts the adopted entry or records a new one (label: comm_label's
 * one-shot text, may be NULL). *skip: the debug injection asks for a barrier in its place (the
 * entry then says barrier). Returns the id for fr_complete (0: none). */
int64_t fr_start(void *comm, enum fr_op op, enum fr_dtype dt, int64_t bytes, const char *label,
                 bool *skip);
void fr_complete(int64_t id);
/* A transfer is posted to / from group rank peer; started at once. The label: the calling
 * thread's fr_p2p_label, if set. */
int64_t fr_p2p(void *comm, bool send, int peer, int tag, int64_t bytes);
/* Label the calling thread's following transfers (NULL: clear); copied. */
void fr_p2p_label(const char *label);

#endif
