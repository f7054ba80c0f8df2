/* status.h - the reply to the control request "status" (wfsctl status):
 * read-only, open to every local user.  Walks the NAS tree named by the
 * request's "path" (or every repo).  Part of the control server.
 */
#ifndef WFS_STATUS_H
#define WFS_STATUS_H

#include "control.h"

#include <jansson.h>

/* The reply object for @req, or an error reply naming the path and the
 * reason; NULL only when out of memory. */
json_t *status_reply(struct control *c, json_t *req);

#endif
