/* reply.h - pieces of control replies shared by the control server's
 * files: the error object every failed request gets, and a blob's line.
 */
#ifndef WFS_REPLY_H
#define WFS_REPLY_H

#include "store.h"

#include <jansson.h>

/* `status` and `doctor` list at most this many flagged blobs, and give
 * their number as "flagged_total": a store with tens of thousands of
 * failed copies would otherwise make a reply wfsctl refuses to read. */
#define REPLY_FLAGGED_MAX 200

/* {"ok":false, "error": <message>, "errno": "<ENAME>"} */
json_t *reply_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* {"key","id","state","size","bytes_done","pinned","pinned_by","reason"} of
 * @b now; "pinned_by": ["hand"], ["ref"], both, or []. */
json_t *reply_blob(struct store *s, struct blob *b);

/* A JSON string for @s, a name or path from the NAS (or text that holds
 * one): any bytes, where json_string() returns NULL for invalid UTF-8 and
 * would make the whole reply fail (or drop the entry).  Valid UTF-8 is
 * returned as it is (JSON escapes control characters itself, losslessly);
 * otherwise as reply_escape(@s, controls 0) writes it.  NULL for @s (or no
 * memory) gives NULL: pack a field that may be absent with "o?". */
json_t *reply_path(const char *s);

/* Write @s to @out (@outsz > 0, always NUL-terminated, cut at a character
 * boundary if short): every byte that is not part of valid UTF-8 -- and,
 * with @controls, every byte of a control character (C0, DEL, C1) --
 * becomes the four characters \xNN, and in text that needed any of that a
 * backslash becomes \x5c too, so escaped text decodes to the exact bytes
 * (reply_unescape).  With @controls one event stays one log line
 * (fs/log.c).  Returns 1 when something was escaped, 0 when @out is @s (or
 * its start). */
int reply_escape(const char *s, char *out, size_t outsz, int controls);

/* The bytes reply_escape() escaped: every \xNN in @s decoded into @out.
 * For a request naming what a reply named (a blob's key, say): look the
 * text up as it is first, then decoded.  Returns 1 when something was
 * decoded, 0 when @out is @s, -ENAMETOOLONG when @outsz is too small,
 * -EINVAL for \x00. */
int reply_unescape(const char *s, char *out, size_t outsz);

#endif
