/* detach.h - wfs returns once the mount serves, and says so by its status.
 *
 * libfuse's fuse_daemonize() lets the caller go as soon as the daemon has
 * forked, with status 0: the threads that promote and answer wfsctl start
 * only after that, and when one cannot (a pids limit, no memory) the
 * daemon unmounted and exited 1 while the script that ran wfs had gone on
 * with 0 and no mount.  Here the caller waits for the daemon's word:
 *
 *   detach_fork()    the caller (parent) blocks reading a pipe; the
 *                    daemon (child) goes on with the pipe's write end.
 *   detach_ready()   the daemon serves: the parent exits 0.
 *   detach_failed()  the daemon cannot: the parent prints the reason and
 *                    exits 1 once the daemon has exited (the pipe's end
 *                    closes with it), so its mount is gone by then.
 * A daemon that dies without a word is a failure too (EOF, no byte).  A
 * Ctrl-C or SIGTERM to the caller meanwhile is passed to the daemon as a
 * SIGTERM (it is in a session of its own), and the caller fails once the
 * daemon is gone.
 *
 * Rules: the standard descriptors 0-2 are open before anything else is
 * (std_fds_open: else the store's lock or the control socket would get
 * number 0, 1 or 2, and the daemon's /dev/null over 0-2 would close it); the
 * fork happens before any thread is started (only the forking thread
 * goes on in the child).
 */
#ifndef WFS_DETACH_H
#define WFS_DETACH_H

/* Opens /dev/null on whichever of 0, 1, 2 is closed.  0 or -errno. */
int std_fds_open(void);

/* Fork; the parent never returns.  In the child: a new session, "/" as
 * working directory, /dev/null on 0-2 (stderr kept when @keep_stderr: -o
 * log=stderr in the background, 2>>FILE).  *@word_fd: the pipe's write end
 * for detach_ready/detach_failed.  Returns 0, or -errno (no fork made). */
int detach_fork(int keep_stderr, int *word_fd);

/* The daemon serves: the caller may go (exit 0).  *@word_fd is closed and
 * set to -1; nothing is done when it is -1 already (the foreground). */
void detach_ready(int *word_fd);

/* The daemon cannot serve, for @why (one line, no "wfs: "): the caller
 * prints it and exits 1 once *@word_fd is closed -- left open here, it
 * closes when the process exits. */
void detach_failed(int word_fd, const char *why);

#endif
