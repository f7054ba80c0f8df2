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

/* The daemon rejects longer requests, so we refuse to send them. */
#define CTL_REQUEST_MAX (64u << 10)
/* A status reply of a large hub is big, but not this big: beyond this the
 * peer is not a wfs daemon, or something is badly wrong. */
#define CTL_REPLY_MAX (16u << 20)

struct ctl_reply {
	json_t *obj; /* the reply object */
	char *raw;   /* the reply line as received, without the newline */
};

/* Send @req to the daemon at @sock and read its reply.  Prints nothing.
 * -ECONNREFUSED/-ENOENT/...: could not connect; -E2BIG: request too large;
 * -EMSGSIZE: reply too large; -EBADMSG: reply is not a JSON object with a
 * boolean "ok"; -ECONNRESET: closed without a reply. */
int ctl_exchange(const char *sock, const json_t *req, struct ctl_reply *rep);

/* ctl_exchange plus the messages a user needs: connection problems as
 * "cannot reach the wfs daemon at SOCK: REASON", and {"ok":false} replies as
 * "wfsctl: CMD: ERROR [ERRNO]" on stderr.  With @json_out an ok:false reply
 * is also printed on stdout as it came, so scripts see it.  Returns 0 only
 * for an ok:true reply (then @rep must be released with ctl_reply_free);
 * for ok:false, -errno named by the reply (or -EREMOTEIO). */
int ctl_call(const char *sock, const char *cmd, const json_t *req,
	     bool json_out, struct ctl_reply *rep);

/* ctl_call, printing @err_prefix on stderr before any message (a newline to
 * end a progress line that is being redrawn in place). */
int ctl_call_ex(const char *sock, const char *cmd, const json_t *req,
		bool json_out, const char *err_prefix, struct ctl_reply *rep);

void ctl_reply_free(struct ctl_reply *rep);

/* Print the reply line as received (the --json output). */
void ctl_print_raw(const struct ctl_reply *rep);

#endif
