/* control_int.h - between the two halves of the control server: control.c
 * (what a request means, who may make it) and control_server.c (the socket,
 * its threads and limits).  Not for other files.
 */
#ifndef WFS_CONTROL_INT_H
#define WFS_CONTROL_INT_H

#include "control.h"
#include "peeras.h"

#include <jansson.h>

/* One op of the protocol (README.md "Control protocol"). */
struct control_op {
	const char *name;
	json_t *(*fn)(struct control *c, json_t *req, const char *op);
	int changes;  /* changes state: root or the mount's owner only */
	int slow;     /* walks a tree or hashes: at most CONTROL_WORKERS_SLOW at once,
		       * and refused while the NAS is down */
	int lingers;  /* may wait seconds without walking the NAS (sync waits for the
		       * record's rebuild): counted as slow, but runs while it is down */
};

/* Does @o count against CONTROL_WORKERS_SLOW? */
static inline int control_op_long(const struct control_op *o)
{
	return o->slow || o->lingers;
}

/* Root or the mount's owner: may change state, and is not held to the
 * limits set for other users. */
int control_privileged(const struct control *c, uid_t uid);

/* Parse and check a request line: the op to run (*@req the request), or
 * NULL with *@rep the reply it gets at once (malformed, unknown op, not
 * permitted; NULL when out of memory).  Quick: no walk, no store call. */
const struct control_op *control_check(struct control *c, const char *line, size_t len,
				       uid_t peer, json_t **req, json_t **rep);

/* The op a request checked as @o runs as now that a worker takes it: the
 * NAS may have gone down while it was queued (behind walks that a hung
 * NAS holds), and then a walk is refused and status is the quick one,
 * as control_check would have made them.  Lock-free: called under the
 * server's lock. */
const struct control_op *control_recheck(struct control *c, const struct control_op *o);

/* Run a checked request: its reply (NULL when out of memory).  @as: the
 * peer whose file identity its op takes (another user's; peeras.h), or
 * NULL for the daemon's own. */
json_t *control_run(struct control *c, const struct control_op *o, json_t *req,
		    const struct peer_id *as);

/* The line of @rep (consumed; NULL: out of memory), with a newline if @nl,
 * malloc'ed, its length in *@lenp (may be NULL); NULL only when out of
 * memory. */
char *control_reply_line(json_t *rep, int nl, size_t *lenp);

/* control_paths.c: the request's "paths" (or "path"; none: the mount
 * root), checked and normalised: a new array of strings, or NULL with
 * *@err the reply that says what is wrong. */
json_t *control_req_paths(struct control *c, json_t *req, json_t **err);

/* The reply to collect()'s error @r for the PATH @rel: what is not weight
 * data says so, not strerror(EMEDIUMTYPE). */
json_t *control_collect_error(const char *rel, int r);

/* A PATH that is itself a link the walks do not follow (dangling,
 * looping, leading out of NAS_HUB, or to a directory) finds no blob: the
 * reply that says why, where "0 blobs" would read as done.  NULL when
 * @rel is no such link. */
json_t *control_link_error(struct control *c, const char *rel);

/* "promote" with "ranges" or "part" (control_part.c): @paths, one file. */
json_t *control_promote_part(struct control *c, json_t *req, json_t *paths);

#endif
