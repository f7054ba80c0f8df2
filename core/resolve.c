/* resolve.c - contained link resolution; see resolve.h. */
#include "resolve.h"
#include "path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int hub_roots_add(struct hub_roots *roots, const char *path)
{
	char *real;

	if (roots->n >= HUB_MAX_ROOTS)
		return -E2BIG;
	real = realpath(path, NULL);
	if (!real)
		return -errno;
	if (strlen(real) >= PATH_MAX) {
		free(real);
		return -ENAMETOOLONG;
	}
	strcpy(roots->path[roots->n++], real);
	free(real);
	return 0;
}

int hub_root_of(const struct hub_roots *roots, const char *abs, const char **rest)
{
	int best = -1;
	size_t best_len = 0;

	for (int i = 0; i < roots->n; i++) {
		const char *r = path_under(roots->path[i], abs);
		size_t len = strlen(roots->path[i]);

		if (r && (best < 0 || len > best_len)) {
			best = i;
			best_len = len;
			*rest = r;
		}
	}
	return best;
}

/* Note @lex (absolute, normalised) as a point of the chain. */
static void note_via(const struct hub_roots *roots, const char *via_dir, const char *lex,
		     struct hub_res *out)
{
	const char *rel, *name;
	size_t n;

	if (!via_dir || out->via[0])
		return;
	n = strlen(via_dir);
	rel = path_under(roots->path[0], lex);
	if (!rel || strncmp(rel, via_dir, n) != 0 || rel[n] != '/')
		return;
	name = rel + n + 1;
	if (*name && !strchr(name, '/') && strlen(name) <= NAME_MAX)
		strcpy(out->via, name);
}

/* @done is a physical path (no links) and @path a normalised one, both
 * relative to the same root: keep in @done the components they share, and
 * put the rest of @path in @todo. */
static void keep_common_prefix(char *done, const char *path, char *todo)
{
	size_t i = 0, keep = 0;

	for (;; i++) {
		if (done[i] == '\0' && (path[i] == '/' || path[i] == '\0')) {
			keep = i;
			break;
		}
		if (done[i] != path[i])
			break;
		if (done[i] == '/')
			keep = i;
	}
	done[keep] = '\0';
	path += keep;
	while (*path == '/')
		path++;
	memmove(todo, path, strlen(path) + 1);
}

int hub_resolve(const struct hub_roots *roots, const char *rel, const char *via_dir,
		const struct stat *entry_st, struct hub_res *out)
{
	/* State: a root, the physical path walked so far inside it (no links),
	 * and the components still to walk. */
	char done[PATH_MAX], todo[PATH_MAX], cand[PATH_MAX], lex[PATH_MAX];
	char link[PATH_MAX], joined[3 * PATH_MAX];
	int root = 0, r, have_last = 0, jn = 0;
	struct stat st, last;

	out->kind = 0;
	out->root = out->hops = 0;
	out->real[0] = out->via[0] = '\0';
	memset(&out->st, 0, sizeof(out->st));
	if (strlen(rel) >= sizeof(todo))
		return -ENAMETOOLONG;
	/* The directories above @rel are physical (see resolve.h): start the
	 * walk at its last component. */
	{
		const char *slash = strrchr(rel, '/');
		size_t n = slash ? (size_t)(slash - rel) : 0;

		memcpy(done, rel, n);
		done[n] = '\0';
		strcpy(todo, slash ? slash + 1 : rel);
	}
	/* The caller's lstat of the entry stands for the walk's first one. */
	if (!strcmp(todo, ".") || !strcmp(todo, ".."))
		entry_st = NULL;

	for (;;) {
		char *p = todo, *comp;
		size_t n;

		while (*p == '/')
			p++;
		if (!*p)
			break;
		comp = p;
		while (*p && *p != '/')
			p++;
		n = (size_t)(p - comp);
		while (*p == '/')
			p++;
		/* p is now the rest after this component. */

		if (n == 1 && comp[0] == '.') {
			memmove(todo, p, strlen(p) + 1);
			continue;
		}
		if (n == 2 && comp[0] == '.' && comp[1] == '.') {
			if (done[0]) {
				path_dirname(done, done, sizeof(done));
				have_last = 0;
				memmove(todo, p, strlen(p) + 1);
				continue;
			}
			/* Climbing above this root: only allowed into another root. */
			jn = snprintf(joined, sizeof(joined), "%s/../%s", roots->path[root], p);
			goto relocate;
		}
		if (snprintf(cand, sizeof(cand), "%s%s%s/%.*s", roots->path[root],
			     done[0] ? "/" : "", done, (int)n, comp) >= (int)sizeof(cand))
			return -ENAMETOOLONG;
		if (entry_st) {
			st = *entry_st;
			entry_st = NULL;
		} else if (lstat(cand, &st) < 0) {
			if (errno == ENOENT || errno == ENOTDIR) {
				out->kind = HUB_RES_DANGLING;
				return 0;
			}
			return -errno;
		}
		if (S_ISLNK(st.st_mode)) {
			ssize_t len;

			if (++out->hops > HUB_MAX_HOPS) {
				out->kind = HUB_RES_LOOP;
				return 0;
			}
			len = readlink(cand, link, sizeof(link) - 1);
			if (len < 0)
				return -errno;
			link[len] = '\0';
			if (link[0] == '/')
				jn = snprintf(joined, sizeof(joined), "%s/%s", link, p);
			else
				jn = snprintf(joined, sizeof(joined), "%s%s%s/%s/%s",
					      roots->path[root], done[0] ? "/" : "", done, link, p);
			goto relocate;
		}
		if (done[0] && strlen(done) + 1 + n >= sizeof(done))
			return -ENAMETOOLONG;
		if (done[0])
			strcat(done, "/");
		strncat(done, comp, n);
		last = st; /* the attributes of done, as it now stands */
		have_last = 1;
		if (!S_ISDIR(st.st_mode) && *p) {
			out->kind = HUB_RES_DANGLING; /* "file/more": ENOTDIR */
			return 0;
		}
		memmove(todo, p, strlen(p) + 1);
		continue;

relocate:
		/* Decide from the text alone where the chain goes next. */
		{
			const char *rest = NULL;
			int prev_root = root;

			/* Only a text cut short is refused here: a long one that
			 * normalises to a path that fits (a relative link deep in
			 * the tree) is fine, as for the kernel. */
			if (jn < 0 || (size_t)jn >= sizeof(joined))
				return -ENAMETOOLONG;
			r = path_normalize(joined, lex, sizeof(lex));
			if (r < 0)
				return r;
			root = hub_root_of(roots, lex, &rest);
			if (root < 0) {
				/* where it went: doctor_scan names the directories */
				strcpy(out->real, lex);
				out->kind = HUB_RES_ESCAPE;
				return 0;
			}
			note_via(roots, via_dir, lex, out);
			have_last = 0;
			/* What the new path shares with the physical path walked so
			 * far (same root) needs no second walk. */
			if (root == prev_root)
				keep_common_prefix(done, rest, todo);
			else {
				done[0] = '\0';
				strcpy(todo, rest);
			}
		}
	}

	if (snprintf(out->real, sizeof(out->real), "%s%s%s", roots->path[root],
		     done[0] ? "/" : "", done) >= (int)sizeof(out->real))
		return -ENAMETOOLONG;
	if (have_last)
		out->st = last;
	else if (lstat(out->real, &out->st) < 0)
		return -errno;
	out->root = root;
	if (via_dir)
		note_via(roots, via_dir, out->real, out);
	if (S_ISREG(out->st.st_mode))
		out->kind = HUB_RES_FILE;
	else if (S_ISDIR(out->st.st_mode))
		out->kind = HUB_RES_DIR;
	else
		out->kind = HUB_RES_OTHER;
	return 0;
}

int hub_check_parents(const struct hub_roots *roots, const char *rel)
{
	char path[PATH_MAX];
	const char *p = rel;
	size_t base = strlen(roots->path[0]);

	if (base + 1 + strlen(rel) >= sizeof(path))
		return -ENAMETOOLONG;
	strcpy(path, roots->path[0]);
	while ((p = strchr(p, '/'))) {
		struct stat st;
		size_t n = (size_t)(p - rel);

		path[base] = '/';
		memcpy(path + base + 1, rel, n);
		path[base + 1 + n] = '\0';
		if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
			return -ENOENT;
		p++;
	}
	return 0;
}
