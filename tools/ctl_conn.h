/* ctl_conn.h - one request/reply exchange with the wfs control socket.
 *
 * Protocol (notes/SPEC.md, "Control protocol"): connect, write one JSON object
 * and a newline, read one reply line, close.  Functions that fail return
 * -errno.
 */
#ifndef WFS_CTL_CONN_H
#define WFS_CTL_CONN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The daemon rejects longer requests, so we refuse to send them. */
#define CTL_REQUEST_MAX (64u << 10)
/* A reply lists every blob a request named: a promote of a dataset of
 * 40,000 files with long names took 17 MiB (the old cap: the copies were
 * queued, and wfsctl said the peer was no wfs daemon).  This bounds what
 * a peer that is not a wfs daemon can make wfsctl hold; ~600,000 blobs. */
#define CTL_REPLY_MAX (256u << 20)

/* How long one exchange (connect, request, reply) may take by default: a
 * daemon that is stopped (SIGSTOP) or hung must not hang wfsctl, and its
 * scripts, forever; the longest requests (walks of a large hub over a
 * slow NAS) take far less.  --timeout changes it (0: none). */
#define CTL_TIMEOUT_DEFAULT_S 120
/* The exit status when the daemon did not answer in time. */
#define CTL_EXIT_TIMEOUT 3

struct ctl_reply {
	json_t *obj; /* the reply object */
	char *raw;   /* the reply line as received, without the newline */
};

struct ctl_watchdog; /* ctl_conn.c */

/* wfsctl's link to the daemon: what main set, and what the exchanges
 * learned.  main owns it and hands it to whatever talks to the daemon. */
struct ctl_conn {
	unsigned timeout_s; /* each exchange's limit, seconds (0: none) */
	bool timed_out;     /* one did not answer in time: main exits CTL_EXIT_TIMEOUT */
	pid_t peer_pid;     /* the daemon's, as the last connection saw it (0: unknown) */
	struct ctl_watchdog *dog; /* from ctl_watchdog_arm() to ctl_watchdog_disarm() */
};

/* Look at a mount within @c's timeout: from ctl_watchdog_arm() to
 * ctl_watchdog_disarm(), a call that waits for the FUSE daemon longer than
 * the timeout ends wfsctl (CTL_EXIT_TIMEOUT), the message naming the mount
 * at @path: such a call cannot be timed out any other way.  Arming fails
 * only for want of memory or a thread (-errno), then nothing watches. */
int ctl_watchdog_arm(struct ctl_conn *c, const char *path);
void ctl_watchdog_disarm(struct ctl_conn *c);

/* Send @req to the daemon at @sock and read its reply, within @c's
 * timeout; @c->peer_pid notes who answered.  Prints nothing.
 * -ECONNREFUSED/-ENOENT/...: could not connect; -E2BIG: request too large;
 * -EMSGSIZE: reply too large; -EBADMSG: reply is not a JSON object with a
 * boolean "ok"; -ECONNRESET: closed without a reply; -ETIMEDOUT: no reply
 * in time. */
int ctl_exchange(struct ctl_conn *c, const char *sock, const json_t *req, struct ctl_reply *rep);

/* The messages ctl_call prints for ctl_exchange's result @r and @rep:
 * returns what ctl_call returns (and frees @rep unless it returns 0).  A
 * timeout sets @c->timed_out. */
int ctl_report(struct ctl_conn *c, const char *sock, const char *cmd, bool json_out,
	       const char *err_prefix, int r, struct ctl_reply *rep);

/* ctl_exchange plus the messages a user needs: connection problems as
 * "cannot reach the wfs daemon at SOCK: REASON", and {"ok":false} replies as
 * "wfsctl: CMD: ERROR [ERRNO]" on stderr.  With @json_out an ok:false reply
 * is also printed on stdout as it came, so scripts see it.  Returns 0 only
 * for an ok:true reply (then @rep must be released with ctl_reply_free);
 * for ok:false, -errno named by the reply (or -EREMOTEIO). */
int ctl_call(struct ctl_conn *c, const char *sock, const char *cmd, const json_t *req,
	     bool json_out, struct ctl_reply *rep);

/* ctl_call, printing @err_prefix on stderr before any message (a newline to
 * end a progress line that is being redrawn in place). */
int ctl_call_ex(struct ctl_conn *c, const char *sock, const char *cmd, const json_t *req,
		bool json_out, const char *err_prefix, struct ctl_reply *rep);

void ctl_reply_free(struct ctl_reply *rep);

/* Print the reply line as received (the --json output). */
void ctl_print_raw(const struct ctl_reply *rep);

#endif
