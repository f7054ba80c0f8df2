/* reply.h - pieces of control replies shared by the control server's
 * files: the error object every failed request gets, and a blob's line.
 */
#ifndef WFS_REPLY_H
#define WFS_REPLY_H

#include "store.h"

#include <jansson.h>

/* {"ok":false, "error": <message>, "errno": "<ENAME>"} */
json_t *reply_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* {"key","id","state","size","bytes_done","pinned","reason"} of @b now. */
json_t *reply_blob(struct store *s, struct blob *b);

#endif
