/* cli/trace_comm_cmd: `ctitan trace-comm DIR` — read every rank's flight recorder dump
 * (comm/flight.h) and name what hung: the first collective some rank never entered or never
 * completed, and any op or size mismatch between ranks at one sequence number. */
#ifndef CT_CLI_TRACE_COMM_CMD_H
#define CT_CLI_TRACE_COMM_CMD_H

/* Returns an exit code: 0 (a diagnosis, or everything matched), 1 (unreadable input),
 * 2 (bad usage). */
int cmd_trace_comm(int argc, char **argv);

#endif
