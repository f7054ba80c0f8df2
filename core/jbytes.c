/* jbytes.c - bytes in JSON; see jbytes.h. */
#include "jbytes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The @n bytes at @p as 2 * @n lower-case hex digits at @out. */
static void hex_of(const char *p, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = "0123456789abcdef"[(unsigned char)p[i] >> 4];
		out[2 * i + 1] = "0123456789abcdef"[(unsigned char)p[i] & 15];
	}
}

json_t *jbytes_hex(const char *p, size_t n)
{
	char *hex = malloc(2 * n + 1);
	json_t *v;

	if (!hex)
		return NULL;
	hex_of(p, n, hex);
	hex[2 * n] = '\0';
	v = json_string(hex);
	free(hex);
	return v;
}

int jbytes_set(json_t *o, const char *field, const char *p, size_t n)
{
	char hexfield[64];
	json_t *v;

	if (!p)
		return 0;
	v = memchr(p, '\0', n) ? NULL : json_stringn(p, n);
	if (v)
		return json_object_set_new(o, field, v) ? -ENOMEM : 0;
	snprintf(hexfield, sizeof(hexfield), "%s_hex", field);
	v = jbytes_hex(p, n);
	return !v || json_object_set_new(o, hexfield, v) ? -ENOMEM : 0;
}

void jbytes_put(struct jline *l, const char *field, const char *p, size_t n)
{
	char hexfield[64], small[512], *hex = small;

	if (!p || (!memchr(p, '\0', n) && jline_try_strn(l, field, p, n) != -EINVAL))
		return;
	if (2 * n > sizeof(small) && !(hex = malloc(2 * n))) {
		jline_fail(l, -ENOMEM);
		return;
	}
	hex_of(p, n, hex);
	snprintf(hexfield, sizeof(hexfield), "%s_hex", field);
	jline_strn(l, hexfield, hex, 2 * n);
	if (hex != small)
		free(hex);
}

int jbytes_hex_value(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int jbytes_unhex(const char *hex, char **out, size_t *len)
{
	size_t n = strlen(hex);

	if (n % 2)
		return -EINVAL;
	if (!(*out = malloc(n / 2 + 1)))
		return -ENOMEM;
	for (size_t i = 0; i < n / 2; i++) {
		int hi = jbytes_hex_value(hex[2 * i]), lo = jbytes_hex_value(hex[2 * i + 1]);

		/* two hex digits a byte, nothing else: sscanf's %2x would take
		 * " 1", "+1" or "-1" (as 0xff) for a byte too */
		if (hi < 0 || lo < 0) {
			free(*out);
			*out = NULL;
			return -EINVAL;
		}
		(*out)[i] = (char)(hi << 4 | lo);
	}
	(*out)[n / 2] = '\0';
	*len = n / 2;
	return 0;
}

int jbytes_get(const struct jflat *o, const char *field, char **out, size_t *len)
{
	const struct jflat_member *v = jflat_get(o, field);
	char hexfield[64];

	*out = NULL;
	if (v) {
		if (v->type != JFLAT_STR)
			return -EINVAL;
		*len = v->len;
		if (!(*out = malloc(*len + 1)))
			return -ENOMEM;
		memcpy(*out, v->s, *len + 1);
		return 0;
	}
	snprintf(hexfield, sizeof(hexfield), "%s_hex", field);
	v = jflat_get(o, hexfield);
	if (!v)
		return -ENOENT;
	if (v->type != JFLAT_STR)
		return -EINVAL;
	return jbytes_unhex(v->s, out, len);
}
