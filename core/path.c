/* path.c - lexical path helpers; see path.h. */
#include "path.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* The component at *@p (its slashes skipped first), of *@n bytes (0 at
 * the end); *@p moves past it. */
static const char *next_component(const char **p, size_t *n)
{
	const char *seg;

	while (**p == '/')
		(*p)++;
	seg = *p;
	while (**p && **p != '/')
		(*p)++;
	*n = (size_t)(*p - seg);
	return seg;
}

static int is_dot(const char *seg, size_t n)
{
	return n == 1 && seg[0] == '.';
}

static int is_dotdot(const char *seg, size_t n)
{
	return n == 2 && seg[0] == '.' && seg[1] == '.';
}

int path_normalize(const char *in, char *out, size_t outsz)
{
	int absolute = in[0] == '/';
	size_t len = 0;
	const char *p = in;

	if (outsz < 2)
		return -ENAMETOOLONG;
	if (absolute)
		out[len++] = '/';
	out[len] = '\0';
	while (*p) {
		size_t n;
		const char *seg = next_component(&p, &n);

		if (n == 0 || is_dot(seg, n))
			continue;
		if (is_dotdot(seg, n)) {
			size_t base = absolute ? 1 : 0;

			if (len == base) {
				if (!absolute)
					return -EXDEV;
				continue;
			}
			while (len > base && out[len - 1] != '/')
				len--;
			if (len > base)
				len--; /* drop the separator too */
			out[len] = '\0';
			continue;
		}
		if (len + (len > (size_t)absolute) + n + 1 > outsz)
			return -ENAMETOOLONG;
		if (len > (size_t)absolute)
			out[len++] = '/';
		memcpy(out + len, seg, n);
		len += n;
		out[len] = '\0';
	}
	return 0;
}

long path_dotdot_after_name(const char *p)
{
	const char *start = p;
	int named = 0;

	while (*p) {
		size_t n;
		const char *seg = next_component(&p, &n);

		if (is_dotdot(seg, n) && named)
			return (long)(seg - start);
		named |= n && !is_dot(seg, n) && !is_dotdot(seg, n);
	}
	return -1;
}

const char *path_under(const char *root, const char *p)
{
	size_t n = strlen(root);

	if (n == 1 && root[0] == '/')
		return p[0] == '/' ? p + 1 : NULL;
	if (strncmp(root, p, n) != 0)
		return NULL;
	if (p[n] == '\0')
		return p + n;
	if (p[n] == '/')
		return p + n + 1;
	return NULL;
}

void path_dirname(const char *p, char *out, size_t outsz)
{
	const char *slash = strrchr(p, '/');
	size_t n = slash ? (size_t)(slash - p) : 0;

	if (n >= outsz)
		n = outsz - 1;
	memcpy(out, p, n);
	out[n] = '\0';
}

uint64_t path_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

int path_join(const char *a, const char *b, char *out, size_t outsz)
{
	/* (no snprintf: a tree walk joins a path for every entry it meets) */
	size_t la = strlen(a), lb = strlen(b), sep = la && lb;

	if (la + sep + lb >= outsz)
		return -ENAMETOOLONG;
	memmove(out + la + sep, b, lb + 1);
	memmove(out, a, la);
	if (sep)
		out[la] = '/';
	return 0;
}

/* Length of the first component of @p. */
static size_t first_len(const char *p)
{
	const char *s = strchr(p, '/');

	return s ? (size_t)(s - p) : strlen(p);
}

int path_relative(const char *from_dir, const char *to, char *out, size_t outsz)
{
	const char *f = from_dir, *t = to;
	size_t len = 0;

	/* Skip the components both paths share. */
	while (*f && *t) {
		size_t fl = first_len(f), tl = first_len(t);

		if (fl != tl || strncmp(f, t, fl) != 0)
			break;
		f += fl + (f[fl] == '/');
		t += tl + (t[tl] == '/');
	}
	out[0] = '\0';
	while (*f) {
		size_t fl = first_len(f);

		if (len + 3 >= outsz)
			return -ENAMETOOLONG;
		memcpy(out + len, "../", 3);
		len += 3;
		f += fl + (f[fl] == '/');
	}
	if (len + strlen(t) + 1 > outsz)
		return -ENAMETOOLONG;
	strcpy(out + len, t);
	len += strlen(t);
	if (len == 0) {
		strcpy(out, ".");
	} else if (out[len - 1] == '/') {
		out[len - 1] = '\0';
	}
	return 0;
}

enum hub_id_kind hub_id_kind(const char *name)
{
	size_t n = 0;

	for (; name[n]; n++) {
		char c = name[n];

		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return HUB_ID_NONE;
	}
	if (n == 64)
		return HUB_ID_SHA256;
	if (n == 40)
		return HUB_ID_SHA1;
	return HUB_ID_NONE;
}

int hub_snapshot_blob_dir(const char *rel, char *out, size_t outsz)
{
	size_t repo = first_len(rel);
	const char *rest = rel + repo;
	int n;

	/* "<repo>/snapshots/<rev>/<at least one more component>" */
	if (repo == 0 || strncmp(rest, "/snapshots/", 11) != 0)
		return 0;
	rest += 11;
	if (first_len(rest) == 0 || rest[first_len(rest)] != '/' || !rest[first_len(rest) + 1])
		return 0;
	n = snprintf(out, outsz, "%.*s/blobs", (int)repo, rel);
	return n > 0 && (size_t)n < outsz;
}

int hub_is_snapshot_name(const char *rel)
{
	char dir[PATH_MAX];

	return hub_snapshot_blob_dir(rel, dir, sizeof(dir));
}

const char *hub_repo_blob_name(const char *rel)
{
	size_t repo = first_len(rel);
	const char *name;

	if (repo == 0 || strncmp(rel + repo, "/blobs/", 7) != 0)
		return NULL;
	name = rel + repo + 7;
	if (!*name || strchr(name, '/'))
		return NULL;
	return name;
}

int hub_is_repo_folder(const char *name, size_t len)
{
	static const char *const kinds[] = { "models--", "datasets--", "spaces--" };

	if (len > NAME_MAX || memchr(name, '/', len))
		return 0;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(*kinds); i++) {
		size_t k = strlen(kinds[i]);

		if (len > k && !memcmp(name, kinds[i], k))
			return 1;
	}
	return 0;
}

size_t hub_repo_len(const char *rel)
{
	size_t n = first_len(rel);

	return hub_is_repo_folder(rel, n) ? n : 0;
}

int hub_holds_weights(const char *rel)
{
	size_t repo = hub_repo_len(rel), area;

	if (!*rel)
		return 1;
	if (!repo)
		return 0;
	if (!rel[repo])
		return 1;
	rel += repo + 1;
	area = first_len(rel);
	return (area == 5 && !strncmp(rel, "blobs", 5)) ||
	       (area == 9 && !strncmp(rel, "snapshots", 9));
}
