/* ctl_fmt.c - output helpers for wfsctl; see ctl_fmt.h. */
#include "ctl_fmt.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Control characters (C0, DEL, and C1 as UTF-8: U+0080-U+009F, which
 * terminals take as ESC [ and the like) of @s as '?', in place: a NAS
 * name or a reason with a newline or an escape sequence must not forge a
 * line of output or drive the terminal. */
static char *clean(char *s)
{
	char *w = s;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
			*w++ = '?';
			p++;
		} else {
			*w++ = *p < 0x20 || *p == 0x7f ? '?' : (char)*p;
		}
	}
	*w = '\0';
	return s;
}

const char *fmt_text(const char *s, char *buf, size_t sz)
{
	snprintf(buf, sz, "%s", s ? s : "");
	return clean(buf);
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
		t->cells[t->nrows * t->ncols + i] = clean(c);
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

uint64_t jget_total(const json_t *obj, const char *key)
{
	char total[64];
	uint64_t n = json_array_size(json_object_get(obj, key));

	snprintf(total, sizeof(total), "%s_total", key);
	return jget_u64(obj, total) > n ? jget_u64(obj, total) : n;
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
	return clean(buf);
}

const char *fmt_time(int64_t t, char *buf, size_t sz)
{
	time_t tt = (time_t)t;
	struct tm tm;

	if (!localtime_r(&tt, &tm) || !strftime(buf, sz, "%Y-%m-%d %H:%M:%S", &tm))
		snprintf(buf, sz, "@%lld", (long long)t);
	return buf;
}

const char *fmt_ago(int64_t t, char *buf, size_t sz)
{
	/* the daemon's clock and ours are one host's: a negative age is a step */
	long long s = (long long)time(NULL) - t;
	static const struct {
		long long unit, sub;
		const char *name, *subname;
	} steps[] = {
		{ 86400, 3600, "d", "h" }, { 3600, 60, "h", "min" }, { 60, 1, "min", "s" },
	};

	s = s < 0 ? 0 : s;
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++)
		if (s >= steps[i].unit) {
			snprintf(buf, sz, "%lld %s %lld %s", s / steps[i].unit, steps[i].name,
				 s % steps[i].unit / steps[i].sub, steps[i].subname);
			return buf;
		}
	snprintf(buf, sz, "%lld s", s);
	return buf;
}

/* Append to @buf (of @sz, @len used so far); returns the new length. */
static size_t __attribute__((format(printf, 4, 5)))
append(char *buf, size_t sz, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (len >= sz)
		return len;
	va_start(ap, fmt);
	n = vsnprintf(buf + len, sz - len, fmt, ap);
	va_end(ap);
	return n < 0 ? len : len + (size_t)n;
}

/* "; 3 calls timed out, 41 requests answered from the local record, 2
 * refused; 1 call still stuck in the NAS": the counts that are not 0. */
static size_t nas_counts(const json_t *nas, char *buf, size_t sz, size_t len)
{
	static const struct {
		const char *key, *one, *many;
	} counts[] = {
		{ "timeouts", "call timed out", "calls timed out" },
		{ "from_record", "request answered from the local record",
		  "requests answered from the local record" },
		{ "failed_down", "refused", "refused" },
		{ "busy", "call found no free NAS thread in time",
		  "calls found no free NAS thread in time" },
	};
	const char *sep = "; ";

	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		uint64_t n = jget_u64(nas, counts[i].key);

		if (!n)
			continue;
		len = append(buf, sz, len, "%s%llu %s", sep, (unsigned long long)n,
			     n == 1 ? counts[i].one : counts[i].many);
		sep = ", ";
	}
	if (jget_u64(nas, "stuck"))
		len = append(buf, sz, len, "; %llu call%s still stuck in the NAS",
			     (unsigned long long)jget_u64(nas, "stuck"),
			     jget_u64(nas, "stuck") == 1 ? "" : "s");
	return len;
}

const char *fmt_nas(const json_t *nas, char *buf, size_t sz)
{
	int64_t since = (int64_t)jget_u64(nas, "since");
	uint64_t outages = jget_u64(nas, "outages");
	char when[64], ago[64], why[512];
	/* it may quote a NAS path */
	const char *reason = fmt_text(jget_str(nas, "reason"), why, sizeof(why));
	size_t len;

	if (strcmp(jget_str(nas, "state"), "down")) {
		len = append(buf, sz, 0, "up");
		if (!outages)
			return buf;
		len = append(buf, sz, len, " since %s (%s); %llu outage%s so far%s%s",
			     fmt_time(since, when, sizeof(when)), fmt_ago(since, ago, sizeof(ago)),
			     (unsigned long long)outages, outages == 1 ? "" : "s",
			     *reason ? ", the last: " : "", reason);
	} else {
		len = append(buf, sz, 0, "DOWN since %s (%s)%s%s",
			     fmt_time(since, when, sizeof(when)), fmt_ago(since, ago, sizeof(ago)),
			     *reason ? ": " : "", reason);
	}
	nas_counts(nas, buf, sz, len);
	return buf;
}

const char *fmt_record(const json_t *rec, char *buf, size_t sz)
{
	int64_t built = (int64_t)jget_u64(rec, "built");
	uint64_t files = jget_u64(rec, "files");
	char when[64], ago[64];

	if (json_is_false(json_object_get(rec, "kept")))
		snprintf(buf, sz, "none kept by this mount: during a NAS outage it shows none "
			 "of its local copies");
	else if (!built)
		snprintf(buf, sz, "%llu file%s (not built yet)", (unsigned long long)files,
			 files == 1 ? "" : "s");
	else
		snprintf(buf, sz, "%llu file%s, %llu names, built %s (%s ago)",
			 (unsigned long long)files, files == 1 ? "" : "s",
			 (unsigned long long)jget_u64(rec, "entries"),
			 fmt_time(built, when, sizeof(when)), fmt_ago(built, ago, sizeof(ago)));
	return buf;
}
