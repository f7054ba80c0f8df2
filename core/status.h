/* status.h - the reply to the control request "status" (wfsctl status):
 * read-only, open to every local user.  Walks the NAS tree named by the
 * request's "path" (or every repo) while the NAS answers; while it is down
 * (nasgate.h), counts what the local record and the store know instead,
 * without touching it.  Part of the control server.
 */
#ifndef WFS_STATUS_H
#define WFS_STATUS_H

#include "control.h"

#include <jansson.h>

/* A walk of the NAS goes on for at most this many times nas_timeout (30 s
 * by default); what it has not walked by then is answered as with the NAS
 * down, and the reply's "walk_cut_s" says so.  A NAS slow but within its
 * deadline (each call tens of ms) made a status of a few thousand entries
 * take minutes, past wfsctl's own timeout. */
#define STATUS_WALK_TIMEOUTS 30

/* The reply object for @req, or an error reply naming the path and the
 * reason; NULL only when out of memory.  @walk 0: never touch the NAS
 * (the control server found it down when the request came, and runs the
 * request as a quick one). */
json_t *status_reply(struct control *c, json_t *req, int walk);

#endif
