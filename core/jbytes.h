/* jbytes.h - bytes in JSON: NAS names are bytes, JSON strings are UTF-8.
 *
 * A field whose bytes are UTF-8 without NUL is written as a string; any
 * other is written as "<field>_hex" instead (two lower-case hex digits a
 * byte) and read back exactly.  index.json and record.json both use it.
 */
#ifndef WFS_JBYTES_H
#define WFS_JBYTES_H

#include "jflat.h"
#include "jline.h"

#include <jansson.h>
#include <stddef.h>

/* @o.@field = the @n bytes at @p (NULL @p: nothing set).  0 or -ENOMEM. */
int jbytes_set(json_t *o, const char *field, const char *p, size_t n);

/* The same onto the line @l (a put: jline.h). */
void jbytes_put(struct jline *l, const char *field, const char *p, size_t n);

/* @o.@field as bytes: the string, or "<field>_hex" decoded, in *@out
 * (malloc'ed, NUL-terminated; the caller frees it), its length in *@len.
 * 0, -ENOENT when neither is there, -EINVAL when malformed, -ENOMEM. */
int jbytes_get(const struct jflat *o, const char *field, char **out, size_t *len);

/* The bytes @p, @n as lower-case hex, a JSON string (NULL: no memory). */
json_t *jbytes_hex(const char *p, size_t n);

/* The value of the hex digit @c (either case), or -1. */
int jbytes_hex_value(char c);

/* The bytes the hex text @hex stands for, in *@out (malloc'ed,
 * NUL-terminated; the caller frees it), its length in *@len.  0, -EINVAL
 * when not hex, -ENOMEM. */
int jbytes_unhex(const char *hex, char **out, size_t *len);

#endif
