/* thread.c - threads started with the stop signals blocked and the
 * daemon's file identity (thread.h). */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "peeras.h"
#include "thread.h"

/* A thread started by one that runs as a peer (peeras.h): the daemon's
 * identity first, then its function. */
struct start_as {
	void *(*fn)(void *);
	void *arg;
	struct peer_self self;
};

static void *started_as_daemon(void *p)
{
	struct start_as st = *(struct start_as *)p;

	free(p);
	peer_self_take(&st.self);
	return st.fn(st.arg);
}

int thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
		 void *arg)
{
	const struct peer_self *left = peer_as_left();
	struct start_as *st = NULL;
	sigset_t stop, old;
	int r;

	if (left) {
		if (!(st = malloc(sizeof(*st))))
			return -ENOMEM;
		*st = (struct start_as){ .fn = fn, .arg = arg, .self = *left };
		fn = started_as_daemon;
		arg = st;
	}
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGHUP);
	sigaddset(&stop, SIGQUIT);
	/* the new thread's mask is the creator's at pthread_create */
	if ((r = pthread_sigmask(SIG_BLOCK, &stop, &old)) == 0) {
		r = pthread_create(thread, attr, fn, arg);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (r)
		free(st);
	return -r;
}
