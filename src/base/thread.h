/* base/thread: helper threads that never take the process's signals.
 *
 * Signal handlers (the trainer's SIGTERM/SIGINT flag) must run on the main thread, and a
 * blocking system call inside a helper thread (MPI's poll on a socket, a checkpoint write)
 * must not see EINTR because a signal picked that thread. thread_start blocks every
 * asynchronous signal in the new thread (the synchronous ones - SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP - stay deliverable, so crashes and sanitizer reports still work) and names
 * it, so `top -H`, gdb and the tests can find it by name.
 */
#ifndef CT_BASE_THREAD_H
#define CT_BASE_THREAD_H

#include <pthread.h>

/* pthread_create with every asynchronous signal blocked in the new thread and the name set
 * (at most 15 characters). Returns 0 or the pthread_create error. */
int thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg);

#endif
