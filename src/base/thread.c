#define _GNU_SOURCE /* pthread_setname_np */
#include "base/thread.h"

#include <signal.h>

int thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg)
{
	/* The new thread inherits the creator's mask: block, create, restore. */
	sigset_t all, old;
	sigfillset(&all);
	const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP};
	for (size_t i = 0; i < sizeof(sync_signals) / sizeof(sync_signals[0]); i++)
		sigdelset(&all, sync_signals[i]);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc == 0 && name)
		pthread_setname_np(*t, name);
	return rc;
}
