/* cli/launch_cmd: `ctitan launch`, the job launcher and elastic supervisor (torchrun's role).
 *
 * It starts `mpiexec` with the OpenMPI settings this project needs (running as root, more
 * ranks than cores, no core binding; shared memory inside a host, TCP between hosts), watches
 * the job, and ends it as a whole: when a rank reports a watchdog abort, when every rank on
 * this host has ended but mpiexec still waits for a host it cannot reach, or when the
 * supervisor itself is told to stop. Every process of the job's session on this host (mpiexec,
 * its ranks, the agents that reach the other hosts) is ended before it returns: no orphans.
 * With --nnodes MIN:MAX it restarts a failed job up to --max-restarts times on the hosts of the
 * hostfile that answer at that moment (at least MIN, at most MAX; fewer after a loss, more
 * when one is back), exporting the attempt number as CT_RESTART_COUNT; the command resumes
 * from its newest verified checkpoint, resharded to the new rank count.
 */
#ifndef CT_CLI_LAUNCH_CMD_H
#define CT_CLI_LAUNCH_CMD_H

/* Returns an exit code (0, 1 runtime failure or the job's own code, 2 usage). */
int cmd_launch(int argc, char **argv);

#endif
