/* jtext.c - a JSON file's text built an entry at a time; see jtext.h. */
#include "jtext.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void jtext_put(struct jtext *t, const char *s, size_t n)
{
	if (t->err)
		return;
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
	size_t start = t->n;

	jtext_json_new(t, o);
	if (t->err)
		return;
	/* "{}" becomes "{", "{...}" becomes "{...," */
	t->n--;
	if (t->n > start + 1)
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

json_t *jtext_lines_open(struct jtext_lines *l, const char *text, size_t len, const char *key)
{
	const char *nl = memchr(text, '\n', len);
	size_t n = nl ? (size_t)(nl - text) : 0, klen = strlen(key);
	char *h;
	json_t *o;

	/* the head line ends ,"<key>":[ */
	if (n < klen + 6 || memcmp(nl - klen - 5, ",\"", 2) || memcmp(nl - klen - 3, key, klen) ||
	    memcmp(nl - 3, "\":[", 3))
		return NULL;
	n -= klen + 5;
	if (!(h = malloc(n + 1)))
		return NULL;
	memcpy(h, text, n);
	h[n] = '}';
	o = json_loadb(h, n + 1, JSON_REJECT_DUPLICATES, NULL);
	free(h);
	if (!json_is_object(o) || json_object_get(o, key)) {
		json_decref(o);
		return NULL;
	}
	*l = (struct jtext_lines){ .p = nl + 1, .end = text + len };
	return o;
}

int jtext_lines_next(struct jtext_lines *l, json_t **o)
{
	const char *nl = memchr(l->p, '\n', (size_t)(l->end - l->p));
	/* the line before ends "[" (the head), "," (more) or not (the last) */
	int more = l->p[-2] == '[' || l->p[-2] == ',';
	size_t n;

	*o = NULL;
	if (!nl)
		return -EAGAIN;
	n = (size_t)(nl - l->p);
	if (n == 2 && !memcmp(l->p, "]}", 2))
		return nl + 1 == l->end && (!l->i || l->p[-2] != ',') ? 0 : -EAGAIN;
	if (!more)
		return -EAGAIN;
	*o = json_loadb(l->p, n && l->p[n - 1] == ',' ? n - 1 : n, JSON_REJECT_DUPLICATES, NULL);
	l->p = nl + 1;
	l->i++;
	return *o ? 1 : -EAGAIN;
}
