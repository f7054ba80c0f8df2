/* ctl_fmt.c - output helpers for wfsctl; see ctl_fmt.h. */
#include "ctl_fmt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *fmt_duration(double seconds, char *buf, size_t sz)
{
	unsigned long long s;

	if (!(seconds >= 0) || seconds > 99.0 * 86400) {
		snprintf(buf, sz, "--:--");
		return buf;
	}
	s = (unsigned long long)(seconds + 0.5);
	if (s >= 3600)
		snprintf(buf, sz, "%llu:%02llu:%02llu", s / 3600, s / 60 % 60, s % 60);
	else
		snprintf(buf, sz, "%llu:%02llu", s / 60, s % 60);
	return buf;
}

void table_init(struct table *t, size_t ncols, const char *const *hdr,
		const char *align)
{
	memset(t, 0, sizeof(*t));
	t->ncols = ncols;
	t->hdr = hdr;
	t->align = align;
}

int table_add(struct table *t, const char *const *row)
{
	size_t i;

	if (t->nrows == t->cap) {
		size_t ncap = t->cap ? t->cap * 2 : 16;
		char **nc = realloc(t->cells, ncap * t->ncols * sizeof(*nc));

		if (!nc)
			return -ENOMEM;
		t->cells = nc;
		t->cap = ncap;
	}
	for (i = 0; i < t->ncols; i++) {
		char *c = strdup(row[i] ? row[i] : "");

		if (!c) {
			while (i--)
				free(t->cells[t->nrows * t->ncols + i]);
			return -ENOMEM;
		}
		/* a NAS name with a newline or an escape sequence must not
		 * break the table or drive the terminal */
		for (char *p = c; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = '?';
		t->cells[t->nrows * t->ncols + i] = c;
	}
	t->nrows++;
	return 0;
}

static void print_row(const struct table *t, FILE *f, const char *indent,
		      const char *const *row, const size_t *w)
{
	size_t i, blanks = 0;

	fputs(indent, f);
	/* Padding is held back until something follows it, so a line never
	 * ends in blanks (empty trailing cells, left-aligned last column). */
	for (i = 0; i < t->ncols; i++) {
		size_t n = strlen(row[i]), pad = w[i] > n ? w[i] - n : 0;

		if (i)
			blanks += 2;
		if (t->align[i] == 'r')
			blanks += pad;
		if (n) {
			fprintf(f, "%*s%s", (int)blanks, "", row[i]);
			blanks = 0;
		}
		if (t->align[i] != 'r')
			blanks += pad;
	}
	fputc('\n', f);
}

void table_print(const struct table *t, FILE *f, const char *indent)
{
	size_t w[16] = { 0 };
	size_t i, r;

	if (t->ncols > sizeof(w) / sizeof(w[0]))
		return;
	for (i = 0; i < t->ncols; i++)
		w[i] = strlen(t->hdr[i]);
	for (r = 0; r < t->nrows; r++)
		for (i = 0; i < t->ncols; i++) {
			size_t n = strlen(t->cells[r * t->ncols + i]);

			if (n > w[i])
				w[i] = n;
		}
	print_row(t, f, indent, t->hdr, w);
	for (r = 0; r < t->nrows; r++)
		print_row(t, f, indent, (const char *const *)&t->cells[r * t->ncols], w);
}

void table_free(struct table *t)
{
	size_t i;

	for (i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	t->cells = NULL;
	t->nrows = t->cap = 0;
}

uint64_t jget_u64(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	if (json_is_integer(v))
		return json_integer_value(v) < 0 ? 0 : (uint64_t)json_integer_value(v);
	if (json_is_real(v))
		return json_real_value(v) < 0 ? 0 : (uint64_t)json_real_value(v);
	return 0;
}

const char *jget_str(const json_t *obj, const char *key)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s ? s : "";
}

bool jget_bool(const json_t *obj, const char *key)
{
	return json_is_true(json_object_get(obj, key));
}

const char *fmt_blob(const json_t *blob, char *buf, size_t sz)
{
	const char *key = jget_str(blob, "key"), *id = jget_str(blob, "id");
	const char *base = strrchr(key, '/');

	base = base ? base + 1 : key;
	if (!*id || !strcmp(base, id))
		snprintf(buf, sz, "%s", key);
	else
		snprintf(buf, sz, "%s (id %s)", key, id);
	return buf;
}
