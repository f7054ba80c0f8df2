/* reply.c - see reply.h. */
#include "reply.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

json_t *reply_error(int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:s, s:s}", "ok", 0, "error", msg, "errno",
			 strerrorname_np(err) ? strerrorname_np(err) : "EIO");
}

json_t *reply_blob(struct store *s, struct blob *b)
{
	struct blob_info in;

	blob_info(s, b, &in);
	return json_pack("{s:s, s:s, s:s, s:I, s:I, s:b, s:s}", "key", in.key, "id", in.id,
			 "state", blob_state_name(in.state), "size", (json_int_t)in.size,
			 "bytes_done", (json_int_t)in.bytes_done, "pinned", in.pinned,
			 "reason", in.reason);
}
