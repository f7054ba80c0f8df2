/* thread.c - threads started with the stop signals blocked (thread.h). */
#include <errno.h>
#include <signal.h>

#include "thread.h"

int thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
		 void *arg)
{
	sigset_t stop, old;
	int r;

	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGHUP);
	sigaddset(&stop, SIGQUIT);
	/* the new thread's mask is the creator's at pthread_create */
	if ((r = pthread_sigmask(SIG_BLOCK, &stop, &old)))
		return -r;
	r = pthread_create(thread, attr, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -r;
}
