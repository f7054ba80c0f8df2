/* resolve.c - contained link resolution; see resolve.h. */
#include "resolve.h"
#include "path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* @path as an absolute, normalised name into @out (PATH_MAX): "" when it
 * cannot be had. */
static void given_name(const char *path, char *out)
{
	char cwd[PATH_MAX], joined[2 * PATH_MAX];

	out[0] = '\0';
	if (path[0] == '/')
		snprintf(joined, sizeof(joined), "%s", path);
	else if (!getcwd(cwd, sizeof(cwd)) ||
		 snprintf(joined, sizeof(joined), "%s/%s", cwd, path) >= (int)sizeof(joined))
		return;
	if (path_normalize(joined, out, PATH_MAX) < 0)
		out[0] = '\0';
}

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
	strcpy(roots->path[roots->n], real);
	given_name(path, roots->given[roots->n]);
	if (!strcmp(roots->given[roots->n], real))
		roots->given[roots->n][0] = '\0';
	roots->n++;
	free(real);
	return 0;
}

int hub_respell(const struct hub_roots *roots, char *lex)
{
	const char *rest, *best_rest = NULL;
	char canon[PATH_MAX];
	size_t best_len = 0;
	int best = -1;

	if (hub_root_of(roots, lex, &rest) >= 0)
		return 0;
	for (int i = 0; i < roots->n; i++) {
		size_t len = strlen(roots->given[i]);

		if (len && len > best_len && (rest = path_under(roots->given[i], lex))) {
			best = i;
			best_len = len;
			best_rest = rest;
		}
	}
	if (best < 0)
		return 0;
	if (snprintf(canon, sizeof(canon), "%s%s%s", roots->path[best], *best_rest ? "/" : "",
		     best_rest) >= (int)sizeof(canon))
		return -ENAMETOOLONG;
	strcpy(lex, canon);
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

/* A walk towards the end of a link chain: a root, the physical path walked
 * so far inside it (no links), and the components still to walk.  Each
 * step takes one component off @todo; a link puts its text back in front
 * of the rest, once the text alone showed where it goes. */
struct walk {
	const struct hub_roots *roots;
	const char *via_dir;
	struct hub_res *out;
	const struct stat *entry_st; /* the caller's lstat of the first component */
	int root;
	char done[PATH_MAX], todo[PATH_MAX];
	struct stat last;            /* lstat of @done, when @have_last */
	int have_last;
	char link_dir[PATH_MAX];     /* the directory of @rel, relative to root 0 */
};

/* What a step leaves (or < 0: -errno). */
enum { WALK_MORE, WALK_ARRIVED, WALK_SETTLED /* out->kind says where it ended */ };

/* A link text and the rest of the path, before normalisation. */
#define JOINED_MAX (3 * PATH_MAX)

static void walk_drop(struct walk *wk, const char *rest)
{
	memmove(wk->todo, rest, strlen(rest) + 1);
}

/* Put @tail (a path still to walk, "" for none) after @todo. */
static int walk_append(struct walk *wk, const char *tail)
{
	size_t n = strlen(wk->todo);

	if (!*tail)
		return 0;
	if (n + 1 + strlen(tail) >= sizeof(wk->todo))
		return -ENAMETOOLONG;
	if (n)
		wk->todo[n++] = '/';
	strcpy(wk->todo + n, tail);
	return 0;
}

/* The chain goes on at @text (a link's text and the rest of the path),
 * read from the physical directory @base ("" for a text that is
 * absolute): decide from the text alone where, before anything it names
 * is touched.  The text is taken as text up to a ".." that follows a name
 * of its own (path_dotdot_after_name); from there on it is walked, so
 * that ".." after a link is its target's parent, as for the kernel. */
static int walk_relocate(struct walk *wk, const char *base, const char *text)
{
	char joined[JOINED_MAX], lex[PATH_MAX];
	const char *rest = NULL;
	long cut = path_dotdot_after_name(text);
	int prev_root = wk->root, r, jn;

	jn = snprintf(joined, sizeof(joined), "%s%s%.*s", base, *base ? "/" : "",
		      cut >= 0 ? (int)cut : (int)strlen(text), text);
	/* Only a text cut short is refused here: a long one that normalises to
	 * a path that fits (a relative link deep in the tree) is fine, as for
	 * the kernel. */
	if (jn < 0 || jn >= JOINED_MAX)
		return -ENAMETOOLONG;
	r = path_normalize(joined, lex, sizeof(lex));
	if (r == 0)
		r = hub_respell(wk->roots, lex);
	if (r < 0)
		return r;
	wk->root = hub_root_of(wk->roots, lex, &rest);
	if (wk->root < 0) {
		/* where it went: doctor_scan names the directories */
		strcpy(wk->out->real, lex);
		wk->out->kind = HUB_RES_ESCAPE;
		return WALK_SETTLED;
	}
	if (cut < 0) /* (else @lex is a point on the way, not of the chain) */
		note_via(wk->roots, wk->via_dir, lex, wk->out);
	wk->have_last = 0;
	/* What the new path shares with the physical path walked so far (same
	 * root) needs no second walk. */
	if (wk->root == prev_root) {
		keep_common_prefix(wk->done, rest, wk->todo);
	} else {
		wk->done[0] = '\0';
		strcpy(wk->todo, rest);
	}
	return walk_append(wk, cut >= 0 ? text + cut : "");
}

/* "..", with @rest after it: up in @done, or, above the root, only on into
 * another root. */
static int walk_up(struct walk *wk, const char *rest)
{
	char base[PATH_MAX + 4], text[PATH_MAX];

	if (wk->done[0]) {
		path_dirname(wk->done, wk->done, sizeof(wk->done));
		wk->have_last = 0;
		walk_drop(wk, rest);
		return WALK_MORE;
	}
	snprintf(base, sizeof(base), "%s/..", wk->roots->path[wk->root]);
	snprintf(text, sizeof(text), "%s", rest); /* (@rest is in @todo, which this rewrites) */
	return walk_relocate(wk, base, text);
}

/* @cand, the next component, is a link: on to its text, then @rest. */
static int walk_link(struct walk *wk, const char *cand, const char *rest)
{
	char link[PATH_MAX], base[2 * PATH_MAX + 2], text[JOINED_MAX];
	ssize_t len;
	int n;

	if (++wk->out->hops > HUB_MAX_HOPS) {
		wk->out->kind = HUB_RES_LOOP;
		return WALK_SETTLED;
	}
	len = readlink(cand, link, sizeof(link) - 1);
	if (len < 0)
		return -errno;
	link[len] = '\0';
	base[0] = '\0';
	if (link[0] != '/')
		snprintf(base, sizeof(base), "%s%s%s", wk->roots->path[wk->root],
			 wk->done[0] ? "/" : "", wk->done);
	n = snprintf(text, sizeof(text), "%s/%s", link, rest);
	if (n < 0 || n >= (int)sizeof(text))
		return -ENAMETOOLONG;
	return walk_relocate(wk, base, text);
}

/* The next lstat searches @done: note a directory that some class (owner,
 * group, others) cannot search, unless it is one above the link itself
 * (see hub_res.closed).
 * One that cannot be looked at counts as closed. */
static void walk_note_search(struct walk *wk)
{
	char dir[PATH_MAX];
	struct stat st;
	size_t n = strlen(wk->done);

	if (wk->out->closed || (wk->root == 0 && (!n || path_under(wk->done, wk->link_dir))))
		return;
	if (!wk->have_last) {
		if (snprintf(dir, sizeof(dir), "%s%s%s", wk->roots->path[wk->root], n ? "/" : "",
			     wk->done) >= (int)sizeof(dir) || lstat(dir, &st) < 0) {
			wk->out->closed = 1;
			return;
		}
		wk->last = st;
		wk->have_last = 1;
	}
	/* every class: a reader in the directory's group is held to its group
	 * bits even where others may search (0705) */
	if ((wk->last.st_mode & 0111) != 0111)
		wk->out->closed = 1;
}

/* One component off @todo. */
static int walk_step(struct walk *wk)
{
	char *p = wk->todo, *comp, cand[PATH_MAX];
	struct stat st;
	size_t n;

	while (*p == '/')
		p++;
	if (!*p)
		return WALK_ARRIVED;
	comp = p;
	while (*p && *p != '/')
		p++;
	n = (size_t)(p - comp);
	while (*p == '/')
		p++;
	/* p: the rest, after this component */
	if (n == 1 && comp[0] == '.') {
		walk_drop(wk, p);
		return WALK_MORE;
	}
	if (n == 2 && comp[0] == '.' && comp[1] == '.')
		return walk_up(wk, p);
	if (snprintf(cand, sizeof(cand), "%s%s%s/%.*s", wk->roots->path[wk->root],
		     wk->done[0] ? "/" : "", wk->done, (int)n, comp) >= (int)sizeof(cand))
		return -ENAMETOOLONG;
	if (wk->entry_st) {
		st = *wk->entry_st;
		wk->entry_st = NULL;
	} else if (walk_note_search(wk), lstat(cand, &st) < 0) {
		if (errno != ENOENT && errno != ENOTDIR)
			return -errno;
		wk->out->kind = HUB_RES_DANGLING;
		return WALK_SETTLED;
	}
	if (S_ISLNK(st.st_mode))
		return walk_link(wk, cand, p);
	if (wk->done[0] && strlen(wk->done) + 1 + n >= sizeof(wk->done))
		return -ENAMETOOLONG;
	if (wk->done[0])
		strcat(wk->done, "/");
	strncat(wk->done, comp, n);
	wk->last = st; /* the attributes of done, as it now stands */
	wk->have_last = 1;
	if (!S_ISDIR(st.st_mode) && *p) {
		wk->out->kind = HUB_RES_DANGLING; /* "file/more": ENOTDIR */
		return WALK_SETTLED;
	}
	walk_drop(wk, p);
	return WALK_MORE;
}

/* Nothing left to walk: the target is @done in @root. */
static int walk_arrive(struct walk *wk)
{
	struct hub_res *out = wk->out;

	if (snprintf(out->real, sizeof(out->real), "%s%s%s", wk->roots->path[wk->root],
		     wk->done[0] ? "/" : "", wk->done) >= (int)sizeof(out->real))
		return -ENAMETOOLONG;
	if (wk->have_last)
		out->st = wk->last;
	else if (lstat(out->real, &out->st) < 0)
		return -errno;
	out->root = wk->root;
	note_via(wk->roots, wk->via_dir, out->real, out);
	if (S_ISREG(out->st.st_mode))
		out->kind = HUB_RES_FILE;
	else if (S_ISDIR(out->st.st_mode))
		out->kind = HUB_RES_DIR;
	else
		out->kind = HUB_RES_OTHER;
	return 0;
}

int hub_resolve(const struct hub_roots *roots, const char *rel, const char *via_dir,
		const struct stat *entry_st, struct hub_res *out)
{
	struct walk wk = { .roots = roots, .via_dir = via_dir, .out = out };
	const char *slash = strrchr(rel, '/');
	size_t n = slash ? (size_t)(slash - rel) : 0;
	int r;

	out->kind = 0;
	out->root = out->hops = out->closed = 0;
	out->real[0] = out->via[0] = '\0';
	memset(&out->st, 0, sizeof(out->st));
	if (strlen(rel) >= sizeof(wk.todo))
		return -ENAMETOOLONG;
	/* The directories above @rel are physical (see resolve.h): the walk
	 * starts at its last component, whose lstat the caller may have. */
	memcpy(wk.done, rel, n);
	wk.done[n] = '\0';
	strcpy(wk.link_dir, wk.done);
	strcpy(wk.todo, slash ? slash + 1 : rel);
	if (strcmp(wk.todo, ".") && strcmp(wk.todo, ".."))
		wk.entry_st = entry_st;
	while ((r = walk_step(&wk)) == WALK_MORE)
		;
	if (r == WALK_ARRIVED)
		return walk_arrive(&wk);
	return r < 0 ? r : 0;
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
