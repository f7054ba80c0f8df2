/* jtext.c - a JSON file's text built an entry at a time; see jtext.h. */
#include "jtext.h"
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What is in the buffer out to the file. */
static void flush_out(struct jtext *t)
{
	int r = durable_pwrite_fd(t->fd, t->p, t->n, (off_t)t->out);

	if (r < 0) {
		t->werr = r;
		t->err = 1;
		return;
	}
	t->out += t->n;
	t->n = 0;
}

void jtext_put(struct jtext *t, const char *s, size_t n)
{
	if (t->err)
		return;
	if (t->streaming && t->n && t->n + n > JTEXT_FLUSH) {
		flush_out(t);
		if (t->err)
			return;
	}
	if (t->n + n + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 1 << 16;
		char *p;

		while (cap < t->n + n + 1)
			cap *= 2;
		if (!(p = realloc(t->p, cap))) {
			t->err = 1;
			return;
		}
		t->p = p;
		t->cap = cap;
	}
	memcpy(t->p + t->n, s, n);
	t->n += n;
	t->p[t->n] = '\0';
}

void jtext_str(struct jtext *t, const char *s)
{
	jtext_put(t, s, strlen(s));
}

static int put_cb(const char *buf, size_t size, void *arg)
{
	struct jtext *t = arg;

	jtext_put(t, buf, size);
	return t->err ? -1 : 0;
}

void jtext_json_new(struct jtext *t, json_t *o)
{
	if (!o || (!t->err && json_dump_callback(o, put_cb, t, JSON_COMPACT | JSON_SORT_KEYS)))
		t->err = 1;
	json_decref(o);
}

void jtext_open_new(struct jtext *t, json_t *o)
{
	size_t start = t->out + t->n; /* (what is out counts: jtext_stream) */

	jtext_json_new(t, o);
	if (t->err)
		return;
	/* "{}" becomes "{", "{...}" becomes "{...," (the '}', put last, is
	 * still in the buffer: a buffer goes out before a put, not after) */
	t->n--;
	if (t->out + t->n > start + 1)
		t->p[t->n++] = ',';
	t->p[t->n] = '\0';
}

char *jtext_take(struct jtext *t, size_t *len)
{
	char *p = t->err ? NULL : t->p ? t->p : calloc(1, 1);

	if (t->err)
		free(t->p);
	*len = p ? t->n : 0;
	memset(t, 0, sizeof(*t));
	return p;
}

void jtext_stream(struct jtext *t, int fd)
{
	t->streaming = 1;
	t->fd = fd;
}

int jtext_end(struct jtext *t, size_t *len)
{
	int r;

	if (!t->err && t->n)
		flush_out(t);
	r = t->werr ? t->werr : t->err ? -ENOMEM : 0;
	*len = t->out;
	free(t->p);
	memset(t, 0, sizeof(*t));
	return r;
}

/* ---- reading back ---- */

/* The head line, which ends ,"<key>":[, read as an object without @key;
 * @r set on the first element's line.  0, or -EAGAIN: not that layout. */
static int open_lines(struct jtext_reader *r, const char *text, size_t len, const char *key)
{
	const char *nl = memchr(text, '\n', len);
	size_t n = nl ? (size_t)(nl - text) : 0, klen = strlen(key);
	json_t *o;
	char *h;
	int e;

	if (n < klen + 6 || memcmp(nl - klen - 5, ",\"", 2) || memcmp(nl - klen - 3, key, klen) ||
	    memcmp(nl - 3, "\":[", 3))
		return -EAGAIN;
	n -= klen + 5;
	if (!(h = malloc(n + 1)))
		return -ENOMEM;
	memcpy(h, text, n);
	h[n] = '}';
	o = json_loadb(h, n + 1, JSON_REJECT_DUPLICATES, NULL);
	free(h);
	e = json_is_object(o) && !json_object_get(o, key) ? jflat_from_json(&r->head, o) : -EAGAIN;
	json_decref(o);
	r->first = r->p = nl + 1;
	r->end = text + len;
	r->i = 0;
	return e;
}

/* The next line's element: 1 with @s, @n; 0 after the last; -EAGAIN: not
 * that layout. */
static int next_line(struct jtext_reader *r, const char **s, size_t *n)
{
	const char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));
	/* the line before ends "[" (the head), "," (more) or not (the last) */
	int more = r->p[-2] == '[' || r->p[-2] == ',';

	if (!nl)
		return -EAGAIN;
	*n = (size_t)(nl - r->p);
	if (*n == 2 && !memcmp(r->p, "]}", 2))
		return nl + 1 == r->end && (!r->i || r->p[-2] != ',') ? 0 : -EAGAIN;
	if (!more)
		return -EAGAIN;
	*s = r->p;
	if (*n && r->p[*n - 1] == ',')
		(*n)--;
	r->p = nl + 1;
	r->i++;
	return 1;
}

/* Every line read once, before any is handed out: 0, -EAGAIN (a line not
 * that layout, or not JSON) or -ENOMEM. */
static int check_lines(struct jtext_reader *r)
{
	struct jflat f = { 0 };
	const char *s;
	size_t n;
	int e;

	while ((e = next_line(r, &s, &n)) > 0 && (e = jflat_parse(&f, s, n)) == 0)
		;
	jflat_free(&f);
	r->p = r->first;
	r->i = 0;
	return e == -EINVAL ? -EAGAIN : e;
}

static int open_whole(struct jtext_reader *r, const char *text, size_t len, const char *key,
		      char *why, size_t wsz)
{
	json_error_t err;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
	int e;

	if (!root) {
		snprintf(why, wsz, "%s", err.text);
		return -EINVAL;
	}
	e = jflat_from_json(&r->head, root);
	r->arr = json_object_get(root, key);
	r->list = json_is_array(r->arr);
	json_decref(root); /* (@r->head holds it) */
	return e;
}

int jtext_read_open(struct jtext_reader *r, const char *text, size_t len, const char *key,
		    char *why, size_t wsz)
{
	int e;

	memset(r, 0, sizeof(*r));
	e = open_lines(r, text, len, key);
	if (!e)
		e = check_lines(r);
	if (!e) {
		r->lines = r->list = 1;
		return 0;
	}
	jtext_read_close(r);
	return e == -EAGAIN ? open_whole(r, text, len, key, why, wsz) : e;
}

int jtext_read_next(struct jtext_reader *r, struct jflat *f)
{
	const char *s;
	size_t n;
	int e;

	if (!r->lines) {
		json_t *o = r->list ? json_array_get(r->arr, r->i) : NULL;

		if (!o)
			return 0;
		r->i++;
		e = jflat_from_json(f, o);
		return e < 0 ? e : 1;
	}
	e = next_line(r, &s, &n);
	if (e <= 0)
		return e;
	e = jflat_parse(f, s, n);
	return e < 0 ? e : 1;
}

void jtext_read_close(struct jtext_reader *r)
{
	jflat_free(&r->head);
	memset(r, 0, sizeof(*r));
}

/* The head read a step at a time, each step twice the last, until the
 * array's key shows: a head is small, the file may be huge. */
static char *read_head(int fd, const char *mark, char **end)
{
	size_t len = 0, cap = 0, mlen = strlen(mark);
	char *buf = NULL, *more;
	ssize_t n = 1;

	for (*end = NULL; !*end && n > 0 && len < JTEXT_HEAD_MAX; ) {
		size_t from = len > mlen ? len - mlen : 0;

		cap = cap ? cap * 2 : (size_t)64 << 10;
		if (!(more = realloc(buf, cap + 1))) {
			free(buf);
			errno = ENOMEM;
			return NULL;
		}
		buf = more;
		while (len < cap && (n = pread(fd, buf + len, cap - len, (off_t)len)) > 0)
			len += (size_t)n;
		if (n < 0) {
			free(buf);
			return NULL;
		}
		buf[len] = '\0';
		*end = strstr(buf + from, mark);
	}
	return buf;
}

long long jtext_head_version(const char *path, const char *key)
{
	char mark[64], *buf, *end;
	long long v = -EINVAL;
	json_t *head, *ver;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0)
		return -errno;
	snprintf(mark, sizeof(mark), ",\"%s\":[", key);
	buf = read_head(fd, mark, &end);
	if (!buf)
		v = -errno;
	close(fd);
	/* the head's members end where the array's begin: "{<members>,"
	 * closed there is an object of its own */
	if (buf && end) {
		end[0] = '}';
		head = json_loadb(buf, (size_t)(end - buf) + 1, JSON_REJECT_DUPLICATES, NULL);
		ver = json_object_get(head, "version");
		if (json_is_object(head))
			v = json_is_integer(ver) && json_integer_value(ver) > 0 ?
			    json_integer_value(ver) : 0;
		json_decref(head);
	}
	free(buf);
	return v;
}
