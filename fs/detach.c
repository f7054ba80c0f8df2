/* detach.c - the fork behind "wfs returns once the mount serves" (detach.h). */
#include "detach.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORD_READY 'R'
#define WORD_FAILED 'F'

int std_fds_open(void)
{
	int fd;

	do
		fd = open("/dev/null", O_RDWR);
	while (fd >= 0 && fd <= STDERR_FILENO);
	if (fd < 0)
		return -errno;
	close(fd);
	return 0;
}

/* After a signal: wait for the daemon itself (the pipe's EOF comes as soon
 * as it says "ready", before its stop); a second signal kills it. */
static _Noreturn void wait_for_stop(pid_t child, struct pollfd *sig)
{
	int status = 0;

	for (;;) {
		pid_t r = waitpid(child, &status, WNOHANG);

		if (r == child || (r < 0 && errno != EINTR))
			break;
		if (poll(sig, 1, 100) == 1) {
			struct signalfd_siginfo si;

			if (read(sig->fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
				kill(child, SIGKILL);
		}
	}
	fprintf(stderr, "wfs: interrupted: the daemon was stopped before the mount was ready%s\n",
		WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? " (killed)" : "");
	_exit(1);
}

/* The caller's side: the daemon's word, then its exit status.  A failure's
 * reason follows its byte; the read goes on to EOF, which comes when the
 * daemon has exited (its cleanup, the unmount, done).  Ctrl-C or a SIGTERM
 * meanwhile (the daemon, in a session of its own, gets neither) stops the
 * daemon as systemctl stop would, and the command fails once it has exited:
 * no mount appears after the command said it failed. */
static _Noreturn void wait_for_word(int fd, pid_t child)
{
	char buf[1024], *end = buf, c;
	struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = -1, .events = POLLIN } };
	sigset_t stop;
	ssize_t r;

	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGHUP);
	if (pthread_sigmask(SIG_BLOCK, &stop, NULL) == 0 &&
	    (p[1].fd = signalfd(-1, &stop, SFD_CLOEXEC)) < 0)
		pthread_sigmask(SIG_UNBLOCK, &stop, NULL); /* the default: Ctrl-C ends it */
	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents & POLLIN) {
			struct signalfd_siginfo si;

			if (read(p[1].fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
				kill(child, SIGTERM);
				wait_for_stop(child, &p[1]);
			}
		}
		if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		r = read(fd, &c, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (end == buf && c == WORD_READY)
			_exit(0);
		if (end < buf + sizeof(buf) - 1)
			*end++ = c; /* (a longer reason is cut; the EOF is waited for all the same) */
	}
	*end = '\0';
	if (end - buf > 1 && buf[0] == WORD_FAILED)
		fprintf(stderr, "wfs: %s\n", buf + 1);
	else
		fprintf(stderr, "wfs: the daemon ended before the mount was ready (see its "
			"log: syslog, or -o log=stderr)\n");
	_exit(1);
}

int detach_fork(int keep_stderr, int *word_fd)
{
	int p[2], null;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		int e = errno;

		close(p[0]);
		close(p[1]);
		return -e;
	}
	if (pid > 0) {
		close(p[1]);
		wait_for_word(p[0], pid);
	}
	close(p[0]);
	*word_fd = p[1];
	(void)setsid();
	if (chdir("/") < 0)
		(void)0; /* "/" is there; the paths in use are absolute */
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		if (!keep_stderr)
			dup2(null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	return 0;
}

void detach_ready(int *word_fd)
{
	char w = WORD_READY;

	if (*word_fd < 0)
		return;
	while (write(*word_fd, &w, 1) < 0 && errno == EINTR)
		;
	close(*word_fd);
	*word_fd = -1;
}

void detach_failed(int word_fd, const char *why)
{
	char line[1024];
	int n;

	if (word_fd < 0)
		return;
	n = snprintf(line, sizeof(line), "%c%s", WORD_FAILED, why);
	if (n > (int)sizeof(line) - 1)
		n = (int)sizeof(line) - 1;
	while (write(word_fd, line, (size_t)n) < 0 && errno == EINTR)
		;
}
