/* reply.c - see reply.h. */
#include "reply.h"
#include "jbytes.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the valid UTF-8 character at @p, or 0; with @controls a
 * control character (C0, DEL, C1) counts as invalid too. */
static size_t char_len(const unsigned char *p, int controls)
{
	unsigned char c = p[0];

	if (c < 0x80)
		return controls && (c < 0x20 || c == 0x7f) ? 0 : 1;
	if (c >= 0xc2 && c <= 0xdf)
		return (p[1] & 0xc0) == 0x80 && !(controls && c == 0xc2 && p[1] < 0xa0) ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		unsigned char lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;

		return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 ? 3 : 0;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		unsigned char lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;

		return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 &&
		       (p[3] & 0xc0) == 0x80 ? 4 : 0;
	}
	return 0; /* a stray continuation byte, an overlong or too large lead */
}

static int needs_escape(const char *s, int controls)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n;

	for (; *p; p += n)
		if (!(n = char_len(p, controls)))
			return 1;
	return 0;
}

int reply_escape(const char *s, char *out, size_t outsz, int controls)
{
	const unsigned char *p = (const unsigned char *)s;
	int esc = needs_escape(s, controls);
	size_t used = 0, n;

	for (; *p; p += n) {
		n = char_len(p, controls);
		if (n && !(esc && *p == '\\')) {
			if (used + n >= outsz)
				break;
			memcpy(out + used, p, n);
			used += n;
		} else {
			if (used + 4 >= outsz)
				break;
			snprintf(out + used, 5, "\\x%02x", *p);
			used += 4;
			n = 1;
		}
	}
	out[used] = '\0';
	return esc;
}

int reply_unescape(const char *s, char *out, size_t outsz)
{
	size_t used = 0;
	int any = 0;

	while (*s) {
		int hi = s[0] == '\\' && s[1] == 'x' ? jbytes_hex_value(s[2]) : -1;
		int lo = hi >= 0 ? jbytes_hex_value(s[3]) : -1;
		char c;

		if (lo >= 0) {
			c = (char)(hi << 4 | lo);
			s += 4;
			any = 1;
			if (!c)
				return -EINVAL;
		} else {
			c = *s++;
		}
		if (used + 1 >= outsz)
			return -ENAMETOOLONG;
		out[used++] = c;
	}
	out[used] = '\0';
	return any;
}

json_t *reply_path(const char *s)
{
	json_t *j;
	char *buf;
	size_t sz;

	if (!s)
		return NULL;
	if (!needs_escape(s, 0))
		return json_string(s); /* JSON escapes control characters itself */
	sz = strlen(s) * 4 + 1;
	buf = malloc(sz);
	if (!buf)
		return NULL;
	reply_escape(s, buf, sz, 0);
	j = json_string(buf);
	free(buf);
	return j;
}

json_t *reply_error(int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* the message often names a path from the NAS or the request */
	return json_pack("{s:b, s:o, s:s}", "ok", 0, "error", reply_path(msg), "errno",
			 strerrorname_np(err) ? strerrorname_np(err) : "EIO");
}

/* A blob's local ranges (a partial copy), for reply_blob. */
static json_t *part_json(struct store *s, struct blob *b, const struct blob_info *in)
{
	json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:b, s:b, s:o, s:[]}",
		"local_bytes", (json_int_t)in->part_bytes, "nranges", (json_int_t)in->part_n,
		"want_bytes", (json_int_t)in->part_want, "done_bytes", (json_int_t)in->part_done,
		"copying", in->part_copying, "unproven", in->part_unproven,
		"reason", reply_path(in->part_reason), "ranges");
	json_t *list = json_object_get(o, "ranges");
	struct brange *v;
	size_t n;

	if (o && store_part_ranges(s, b, &v, &n) == 0) {
		for (size_t i = 0; i < n; i++)
			json_array_append_new(list, json_pack("[I, I]", (json_int_t)v[i].off,
							      (json_int_t)v[i].len));
		free(v);
	}
	return o;
}

/* Why a blob is pinned, as a list: "hand" (wfsctl pin PATH, promote
 * --pin), "ref" (a ref pin's revision holds it); [] when not pinned. */
static json_t *pin_why_json(int why)
{
	json_t *v = json_array();

	if (v && (why & PIN_HAND))
		json_array_append_new(v, json_string("hand"));
	if (v && (why & PIN_REF))
		json_array_append_new(v, json_string("ref"));
	return v;
}

json_t *reply_blob(struct store *s, struct blob *b)
{
	struct blob_info in;
	json_t *o;

	blob_info(s, b, &in);
	o = json_pack("{s:o, s:o, s:s, s:I, s:I, s:b, s:o, s:o}", "key", reply_path(in.key),
		      "id", reply_path(in.id), "state", blob_info_state_name(&in),
		      "size", (json_int_t)in.size, "bytes_done", (json_int_t)in.bytes_done,
		      "pinned", in.pinned, "pinned_by", pin_why_json(in.pin_why),
		      "reason", reply_path(in.reason));
	if (o && (in.part_bytes || in.part_want || in.part_reason[0] || in.part_unproven))
		json_object_set_new(o, "part", part_json(s, b, &in));
	return o;
}
