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

/* The reply object for @req, or an error reply naming the path and the
 * reason; NULL only when out of memory.  @walk 0: never touch the NAS
 * (the control server found it down when the request came, and runs the
 * request as a quick one). */
json_t *status_reply(struct control *c, json_t *req, int walk);

#endif
