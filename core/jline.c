/* jline.c - a flat JSON object written without a tree; see jline.h. */
#include "jline.h"
#include "jflat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void jline_fail(struct jline *l, int e)
{
	if (!l->err)
		l->err = e;
}

/* The escape jansson writes for @c (below 0x20, '"' or '\'), in @seq;
 * its length. */
static size_t escape(unsigned char c, char seq[6])
{
	static const char from[] = "\"\\\b\f\n\r\t", to[] = "\"\\bfnrt", hex[] = "0123456789ABCDEF";
	const char *x = c ? memchr(from, c, sizeof(from) - 1) : NULL;

	seq[0] = '\\';
	if (x) {
		seq[1] = to[x - from];
		return 2;
	}
	memcpy(seq + 1, "u00", 3);
	seq[4] = hex[c >> 4];
	seq[5] = hex[c & 15];
	return 6;
}

/* @s, @n onto @t as a JSON string, quotes and all: 0, or -EINVAL when it
 * is not UTF-8 that jansson takes (@t then ends in part of it). */
static int put_string(struct jtext *t, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + n, *run = p;
	char seq[6];

	jtext_put(t, "\"", 1);
	while (p < end) {
		if (*p >= 0x80) {
			size_t k = jflat_utf8_len(p, end);

			if (!k)
				return -EINVAL;
			p += k;
		} else if (*p >= 0x20 && *p != '"' && *p != '\\') {
			p++;
		} else {
			jtext_put(t, (const char *)run, (size_t)(p - run));
			jtext_put(t, seq, escape(*p, seq));
			run = ++p;
		}
	}
	jtext_put(t, (const char *)run, (size_t)(p - run));
	jtext_put(t, "\"", 1);
	return 0;
}

/* A member for @key, its text begun ("<key>":) -- its value is put next
 * and end_member closes it -- or NULL when the line has failed. */
static struct jline_member *begin_member(struct jline *l, const char *key)
{
	size_t klen = strlen(key);
	struct jline_member *m;

	if (l->err)
		return NULL;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 32;

		if (!(m = realloc(l->m, cap * sizeof(*m)))) {
			jline_fail(l, -ENOMEM);
			return NULL;
		}
		l->m = m;
		l->cap = cap;
	}
	m = &l->m[l->n];
	/* the key as it is, for the sort, then the member's text */
	m->key = l->text.n;
	jtext_put(&l->text, key, klen + 1);
	m->val = l->text.n;
	if (put_string(&l->text, key, klen) < 0) {
		jline_fail(l, -EINVAL);
		return NULL;
	}
	jtext_put(&l->text, ":", 1);
	return m;
}

static void end_member(struct jline *l, struct jline_member *m)
{
	if (l->text.err) {
		jline_fail(l, -ENOMEM);
		return;
	}
	m->vlen = l->text.n - m->val;
	l->n++;
}

int jline_try_strn(struct jline *l, const char *key, const char *s, size_t n)
{
	size_t mark = l->text.n;
	struct jline_member *m = begin_member(l, key);

	if (!m)
		return l->err;
	if (put_string(&l->text, s, n) < 0) {
		l->text.n = mark; /* (the member taken back) */
		return -EINVAL;
	}
	end_member(l, m);
	return l->err;
}

void jline_strn(struct jline *l, const char *key, const char *s, size_t n)
{
	if (jline_try_strn(l, key, s, n) == -EINVAL)
		jline_fail(l, -EINVAL);
}

void jline_str(struct jline *l, const char *key, const char *s)
{
	jline_strn(l, key, s, strlen(s));
}

void jline_int(struct jline *l, const char *key, int64_t v)
{
	struct jline_member *m = begin_member(l, key);
	char b[24], *e = b + sizeof(b), *p = e;
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;

	if (!m)
		return;
	do
		*--p = (char)('0' + u % 10);
	while (u /= 10);
	if (v < 0)
		*--p = '-';
	jtext_put(&l->text, p, (size_t)(e - p));
	end_member(l, m);
}

void jline_bool(struct jline *l, const char *key, int v)
{
	struct jline_member *m = begin_member(l, key);

	if (!m)
		return;
	jtext_str(&l->text, v ? "true" : "false");
	end_member(l, m);
}

void jline_tree(struct jline *l, const char *key, json_t *v)
{
	struct jline_member *m = v ? begin_member(l, key) : NULL;
	char *s;

	if (!v)
		jline_fail(l, -ENOMEM);
	if (!m)
		return;
	if (!(s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS))) {
		jline_fail(l, json_is_array(v) || json_is_object(v) ? -ENOMEM : -EINVAL);
		return;
	}
	jtext_str(&l->text, s);
	free(s);
	end_member(l, m);
}

static int key_cmp(const struct jline *l, const struct jline_member *a,
		   const struct jline_member *b)
{
	return strcmp(l->text.p + a->key, l->text.p + b->key);
}

/* Sorted by key: an insertion sort, since the callers put the members
 * nearly in order and a line has ~20.  0, or -EINVAL: a key twice. */
static int sort_members(struct jline *l)
{
	for (size_t i = 1; i < l->n; i++) {
		struct jline_member x = l->m[i];
		size_t j = i;

		for (; j > 0 && key_cmp(l, &l->m[j - 1], &x) > 0; j--)
			l->m[j] = l->m[j - 1];
		l->m[j] = x;
	}
	for (size_t i = 1; i < l->n; i++)
		if (!key_cmp(l, &l->m[i - 1], &l->m[i]))
			return -EINVAL;
	return 0;
}

int jline_write(struct jline *l, struct jtext *t)
{
	int r = l->err ? l->err : sort_members(l);

	if (!r && !t->err) {
		jtext_put(t, "{", 1);
		for (size_t i = 0; i < l->n; i++) {
			if (i)
				jtext_put(t, ",", 1);
			jtext_put(t, l->text.p + l->m[i].val, l->m[i].vlen);
		}
		jtext_put(t, "}", 1);
	}
	if (!r && t->err)
		r = -ENOMEM;
	if (r)
		t->err = 1;
	l->n = 0;
	l->err = 0;
	l->text.n = 0;
	l->text.err = 0;
	return r;
}

void jline_free(struct jline *l)
{
	free(l->text.p);
	free(l->m);
	memset(l, 0, sizeof(*l));
}
