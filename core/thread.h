/* thread.h - the daemon's threads, started so that a stop signal reaches
 * the thread that waits for it.
 *
 * A signal sent to a process (kill, systemctl stop, Ctrl-C) is handled by
 * any one of its threads that does not block it, the kernel's pick.
 * libfuse 3.14's multi-threaded loop ends when its main thread, asleep in
 * sem_wait(), is woken by the handler running there (fuse_set_signal_
 * handlers: SIGTERM, SIGINT, SIGHUP).  Handled by another thread, the
 * signal sets the session's exit flag and wakes nobody: the daemon runs on
 * until some request happens to reach the mount -- with the NAS hung, or
 * an idle mount, that can be never.  libfuse starts its own workers with
 * these signals (and SIGQUIT) blocked; every thread of ours is started the
 * same way, so the main thread is the only one that takes them.
 */
#ifndef WFS_THREAD_H
#define WFS_THREAD_H

#include <pthread.h>

/* pthread_create(3), the new thread blocking SIGTERM, SIGINT, SIGHUP and
 * SIGQUIT from its first instruction (it inherits the mask; the caller's
 * own mask is as it was on return).  A caller that runs a request as
 * another user (peeras.h) starts it with the identity it left for that
 * user's, taken before @fn runs.  Returns 0, or -errno: -EAGAIN (no
 * resources for a thread, or the thread limit), -EINVAL (bad attr),
 * -ENOMEM. */
int thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
		 void *arg);

#endif
