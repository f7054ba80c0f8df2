/* jflat.c - a flat JSON object read without a tree; see jflat.h. */
#include "jflat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int grow_members(struct jflat *f)
{
	size_t cap = f->cap ? f->cap * 2 : 32;
	struct jflat_member *m = realloc(f->m, cap * sizeof(*m));

	if (!m)
		return -ENOMEM;
	f->m = m;
	f->cap = cap;
	return 0;
}

static struct jflat_member *next_member(struct jflat *f)
{
	if (f->n == f->cap && grow_members(f) < 0)
		return NULL;
	f->m[f->n] = (struct jflat_member){ 0 };
	return &f->m[f->n++];
}

static void let_go(struct jflat *f)
{
	json_decref(f->tree);
	f->tree = NULL;
	f->n = 0;
	f->object = 0;
}

/* The escapes read here, each with the byte it stands for ('u' is not). */
static char unescape(char c)
{
	static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
	const char *x = c ? strchr(from, c) : NULL;

	return x ? to[x - from] : 0;
}

size_t jflat_utf8_len(const unsigned char *s, const unsigned char *end)
{
	static const uint32_t least[] = { 0, 0, 0x80, 0x800, 0x10000 };
	size_t n = s[0] >= 0xc2 && s[0] <= 0xdf ? 2 : s[0] >= 0xe0 && s[0] <= 0xef ? 3 :
		   s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : 0;
	uint32_t v = s[0] & (0x7f >> n);

	if (!n || (size_t)(end - s) < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
		v = v << 6 | (s[i] & 0x3f);
	}
	return v < least[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff) ? 0 : n;
}

/* The string at *@p (on its '"') copied to *@out, NUL-terminated; *@p
 * past its closing quote.  Its length, or -1: not the shape read here. */
static ssize_t read_string(const char **p, const char *end, char **out)
{
	const char *s = *p + 1;
	char *o = *out;

	for (; s < end; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"') {
			ssize_t len = o - *out;

			*o++ = '\0';
			*p = s + 1;
			*out = o;
			return len;
		}
		if (c >= 0x80) {
			size_t n = jflat_utf8_len((const unsigned char *)s, (const unsigned char *)end);

			if (!n)
				return -1;
			memcpy(o, s, n);
			o += n;
			s += n - 1;
			continue;
		}
		if (c < 0x20)
			return -1;
		if (c == '\\' && (++s == end || !(c = (unsigned char)unescape(*s))))
			return -1;
		*o++ = (char)c;
	}
	return -1;
}

/* An integer within int64_t, not followed by more of a number; -1 else. */
static int read_int(const char **p, const char *end, int64_t *v)
{
	const char *s = *p;
	int neg = s < end && *s == '-';
	uint64_t u = 0;
	int digits = 0;

	s += neg;
	if (s == end || *s < '0' || *s > '9')
		return -1;
	if (*s == '0')
		s++;
	else
		for (; s < end && *s >= '0' && *s <= '9' && digits < 19; s++, digits++)
			u = u * 10 + (uint64_t)(*s - '0');
	if (s < end && ((*s >= '0' && *s <= '9') || *s == '.' || *s == 'e' || *s == 'E'))
		return -1;
	if (u > (uint64_t)INT64_MAX + neg)
		return -1;
	*v = neg ? (int64_t)(0 - u) : (int64_t)u;
	*p = s;
	return 0;
}

static int read_word(const char **p, const char *end, const char *w)
{
	size_t n = strlen(w);

	if ((size_t)(end - *p) < n || memcmp(*p, w, n))
		return -1;
	*p += n;
	return 0;
}

/* One value at *@p into @m: 0, or -1 when not the shape read here. */
static int read_value(const char **p, const char *end, char **out, struct jflat_member *m)
{
	ssize_t len;

	switch (**p) {
	case '"':
		m->s = *out;
		len = read_string(p, end, out);
		m->len = (size_t)len;
		m->type = JFLAT_STR;
		return len < 0 ? -1 : 0;
	case 't':
		m->type = JFLAT_TRUE;
		return read_word(p, end, "true");
	case 'f':
		m->type = JFLAT_FALSE;
		return read_word(p, end, "false");
	case 'n':
		m->type = JFLAT_NULL;
		return read_word(p, end, "null");
	default:
		m->type = JFLAT_INT;
		return read_int(p, end, &m->i);
	}
}

int jflat_parse_fast(struct jflat *f, const char *p, size_t n)
{
	const char *end = p + n;
	char *out;

	let_go(f);
	/* every string's two quotes make room for its NUL: @n bytes hold them */
	if (f->bcap < n + 1) {
		char *b = realloc(f->buf, n + 1);

		if (!b)
			return -ENOMEM;
		f->buf = b;
		f->bcap = n + 1;
	}
	out = f->buf;
	if (n < 2 || *p++ != '{')
		return -EAGAIN;
	if (*p == '}')
		goto close;
	for (;;) {
		struct jflat_member *m = next_member(f);

		if (!m)
			return -ENOMEM;
		m->key = out;
		if (*p != '"' || read_string(&p, end, &out) < 0 ||
		    (f->n > 1 && strcmp(m[-1].key, m->key) >= 0) ||
		    p == end || *p++ != ':' || p == end || read_value(&p, end, &out, m) < 0 ||
		    p == end)
			return -EAGAIN;
		if (*p != ',')
			break;
		if (++p == end)
			return -EAGAIN;
	}
close:
	if (*p != '}' || p + 1 != end)
		return -EAGAIN;
	f->object = 1;
	return 0;
}

static int by_key(const void *a, const void *b)
{
	return strcmp(((const struct jflat_member *)a)->key, ((const struct jflat_member *)b)->key);
}

int jflat_from_json(struct jflat *f, json_t *o)
{
	const char *k;
	json_t *v;

	let_go(f);
	f->tree = json_incref(o);
	f->object = json_is_object(o);
	json_object_foreach(o, k, v) {
		struct jflat_member *m = next_member(f);

		if (!m) {
			let_go(f);
			return -ENOMEM;
		}
		m->key = k;
		if (json_is_string(v)) {
			*m = (struct jflat_member){ k, JFLAT_STR, json_string_value(v),
						    json_string_length(v), 0, NULL };
		} else if (json_is_integer(v)) {
			m->type = JFLAT_INT;
			m->i = (int64_t)json_integer_value(v);
		} else {
			m->type = json_is_true(v) ? JFLAT_TRUE : json_is_false(v) ? JFLAT_FALSE :
				  json_is_null(v) ? JFLAT_NULL : JFLAT_TREE;
			m->tree = m->type == JFLAT_TREE ? v : NULL;
		}
	}
	if (f->n > 1)
		qsort(f->m, f->n, sizeof(*f->m), by_key);
	return 0;
}

int jflat_parse(struct jflat *f, const char *p, size_t n)
{
	json_t *o;
	int r = jflat_parse_fast(f, p, n);

	if (r != -EAGAIN)
		return r;
	if (!(o = json_loadb(p, n, JSON_REJECT_DUPLICATES, NULL))) {
		let_go(f);
		return -EINVAL;
	}
	r = jflat_from_json(f, o);
	json_decref(o);
	return r;
}

int jflat_same(const struct jflat *a, const struct jflat *b)
{
	if (a->object != b->object || a->n != b->n)
		return 0;
	for (size_t i = 0; i < a->n; i++) {
		const struct jflat_member *x = &a->m[i], *y = &b->m[i];

		if (strcmp(x->key, y->key) || x->type != y->type ||
		    (x->type == JFLAT_STR && (x->len != y->len || memcmp(x->s, y->s, x->len + 1))) ||
		    (x->type == JFLAT_INT && x->i != y->i) ||
		    (x->type == JFLAT_TREE && !json_equal(x->tree, y->tree)))
			return 0;
	}
	return 1;
}

void jflat_free(struct jflat *f)
{
	let_go(f);
	free(f->m);
	free(f->buf);
	memset(f, 0, sizeof(*f));
}

const struct jflat_member *jflat_get(const struct jflat *f, const char *key)
{
	size_t lo = 0, hi = f->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, f->m[mid].key);

		if (!c)
			return &f->m[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

const char *jflat_str(const struct jflat *f, const char *key)
{
	const struct jflat_member *m = jflat_get(f, key);

	return m && m->type == JFLAT_STR ? m->s : NULL;
}

int64_t jflat_int(const struct jflat *f, const char *key)
{
	const struct jflat_member *m = jflat_get(f, key);

	return m && m->type == JFLAT_INT ? m->i : 0;
}

int jflat_true(const struct jflat *f, const char *key)
{
	const struct jflat_member *m = jflat_get(f, key);

	return m && m->type == JFLAT_TRUE;
}

json_t *jflat_tree(const struct jflat *f, const char *key)
{
	const struct jflat_member *m = jflat_get(f, key);

	return m && m->type == JFLAT_TREE ? m->tree : NULL;
}
