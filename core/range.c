/* range.c - byte ranges; see range.h. */
#include "range.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int by_off(const void *a, const void *b)
{
	const struct brange *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

size_t brange_normalize(struct brange *v, size_t n)
{
	size_t out = 0;

	qsort(v, n, sizeof(*v), by_off);
	for (size_t i = 0; i < n; i++) {
		struct brange *last = out ? &v[out - 1] : NULL;

		if (!v[i].len)
			continue;
		if (last && v[i].off <= last->off + last->len) {
			uint64_t end = v[i].off + v[i].len;

			if (end > last->off + last->len)
				last->len = end - last->off;
			continue;
		}
		v[out++] = v[i];
	}
	return out;
}

uint64_t brange_total(const struct brange *v, size_t n)
{
	uint64_t t = 0;

	for (size_t i = 0; i < n; i++)
		t += v[i].len;
	return t;
}

size_t brange_gaps(const struct brange *v, size_t n, uint64_t off, uint64_t len,
		   struct brange *out, size_t cap)
{
	uint64_t pos = off, end = off + len;
	size_t k = 0;

	for (size_t i = 0; i < n && pos < end; i++) {
		uint64_t a = v[i].off, b = v[i].off + v[i].len;

		if (b <= pos)
			continue;
		if (a >= end)
			break;
		if (a > pos) {
			if (k < cap)
				out[k] = (struct brange){ pos, a - pos };
			k++;
		}
		pos = b;
	}
	if (pos < end) {
		if (k < cap)
			out[k] = (struct brange){ pos, end - pos };
		k++;
	}
	return k;
}

struct brange *brange_gaps_alloc(const struct brange *v, size_t n, uint64_t off, uint64_t len,
				 size_t *ng)
{
	struct brange *g;

	*ng = brange_gaps(v, n, off, len, NULL, 0);
	g = malloc((*ng + 1) * sizeof(*g));
	if (g)
		brange_gaps(v, n, off, len, g, *ng);
	return g;
}

int brange_covers(const struct brange *v, size_t n, uint64_t off, uint64_t len)
{
	return len == 0 || brange_gaps(v, n, off, len, NULL, 0) == 0;
}

/* One suffix, its multiplier; the table is read longest name first. */
static const struct { const char *name; unsigned shift; } suffixes[] = {
	{ "KiB", 10 }, { "MiB", 20 }, { "GiB", 30 }, { "TiB", 40 },
	{ "K", 10 }, { "M", 20 }, { "G", 30 }, { "T", 40 },
	/* lower case as well: "512m" meant MiB, as "512k" did KiB */
	{ "k", 10 }, { "m", 20 }, { "g", 30 }, { "t", 40 }, { "", 0 },
};

int brange_parse_size(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	const char *p = s;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
		unsigned sh = suffixes[i].shift;

		if (strcmp(p, suffixes[i].name))
			continue;
		if (sh && v > (UINT64_MAX >> sh))
			return -ERANGE;
		*out = v << sh;
		return 0;
	}
	return -EINVAL;
}

int brange_parse(const char *s, struct brange *out)
{
	const char *colon = s ? strchr(s, ':') : NULL;
	char head[64];
	uint64_t off, len;
	int r;

	if (!colon || (size_t)(colon - s) >= sizeof(head))
		return -EINVAL;
	memcpy(head, s, (size_t)(colon - s));
	head[colon - s] = '\0';
	if ((r = brange_parse_size(head, &off)) < 0 || (r = brange_parse_size(colon + 1, &len)) < 0)
		return r;
	if (!len)
		return -EINVAL;
	if (off > UINT64_MAX - len)
		return -ERANGE;
	*out = (struct brange){ off, len };
	return 0;
}
