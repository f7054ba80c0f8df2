/* ns.c - the namespace rules; see ns.h and DESIGN.md "The namespace". */
#include "ns.h"
#include "nasopen.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void present_link(struct ns_entry *out, const struct stat *lst)
{
	out->kind = NS_LINK;
	out->st = *lst;
	out->st.st_mode = S_IFLNK | 0777;
	out->st.st_size = (off_t)strlen(out->target);
	out->st.st_nlink = 1;
}

static int show_verbatim(const char *path, const struct stat *lst, enum ns_link_state why,
			 struct ns_entry *out)
{
	ssize_t n = readlink(path, out->target, sizeof(out->target) - 1);

	if (n < 0)
		return -errno;
	out->target[n] = '\0';
	out->link_state = why;
	present_link(out, lst);
	return 0;
}

static void backing_attrs(struct ns_entry *out, const struct stat *st)
{
	out->backing_st = *st;
	out->has_backing_st = 1;
}

/* (not a memset of the whole entry: 8 KiB of path buffers, for each entry
 * of a walk) */
static void entry_reset(struct ns_entry *out)
{
	out->kind = 0;
	out->link_state = 0;
	out->has_backing_st = 0;
	memset(&out->st, 0, sizeof(out->st));
	out->backing[0] = out->target[0] = out->blob_id[0] = '\0';
}

/* What the lstat of @rel (at @path) says: 0 with a directory or regular
 * file presented, 1 for a link (the caller classifies it), or -errno: the
 * stat's @err (ENOTDIR as ENOENT), or ENOENT for a fifo, socket or device,
 * which the mount hides. */
static int present_lstat(struct ns_entry *out, const char *path, const char *rel,
			 const struct stat *lst, int err)
{
	const char *name;

	if (err)
		return err == -ENOTDIR ? -ENOENT : err;
	if (S_ISLNK(lst->st_mode))
		return 1;
	if (!S_ISDIR(lst->st_mode) && !S_ISREG(lst->st_mode))
		return -ENOENT;
	out->kind = S_ISDIR(lst->st_mode) ? NS_DIR : NS_FILE;
	out->st = *lst;
	if (out->kind == NS_FILE)
		backing_attrs(out, lst);
	out->st.st_mode &= ~(mode_t)0222;
	strcpy(out->backing, path);
	name = hub_repo_blob_name(rel);
	if (name && out->kind == NS_FILE)
		snprintf(out->blob_id, sizeof(out->blob_id), "%s", name);
	return 0;
}

/* present_closed's paths, on the heap: it runs on the NAS threads, whose
 * stacks are small (nasgate.c), below ns_classify's and the walk's own. */
struct closed_paths {
	char dir[PATH_MAX], text[PATH_MAX], lex[PATH_MAX], norm[PATH_MAX];
	char abs[3 * PATH_MAX];
};

/* Where the link @p->text, in the directory @p->dir of root 0, leads at
 * its first hop: the root it lies in (-1: none, or no lexical answer: a
 * ".." after a name), @p->lex its absolute path, *@rest the part below the
 * root. */
static int first_hop(const struct hub_roots *roots, struct closed_paths *p, const char **rest)
{
	int n;

	if (path_dotdot_after_name(p->text) >= 0)
		return -1;
	if (p->text[0] == '/')
		n = snprintf(p->abs, sizeof(p->abs), "%s", p->text);
	else
		n = snprintf(p->abs, sizeof(p->abs), "%s%s%s/%s", roots->path[0], *p->dir ? "/" : "",
			     p->dir, p->text);
	if (n < 0 || n >= (int)sizeof(p->abs) || path_normalize(p->abs, p->lex, PATH_MAX) < 0 ||
	    hub_respell(roots, p->lex) < 0)
		return -1;
	return hub_root_of(roots, p->lex, rest);
}

/* Does the relative @p->text, in @p->dir of root 0, stay inside root 0 as
 * text (no ".." above the root)?  (A ".." after a name is the kernel's to
 * resolve in the mount, which mirrors the NAS's directories and links.) */
static int inside_root(struct closed_paths *p)
{
	int n = snprintf(p->abs, sizeof(p->abs), "%s%s%s", p->dir, *p->dir ? "/" : "", p->text);

	return n >= 0 && n < (int)sizeof(p->abs) && path_normalize(p->abs, p->norm, PATH_MAX) == 0;
}

/* A link to a file whose chain searched a directory some class cannot
 * search (hub_res.closed): shown as the file, the mount would hand it to
 * readers the NAS keeps out.  Shown as a link -- its own first hop, so
 * that the reader's kernel walks the chain a hop at a time, checking each
 * directory against the reader (each hop classified here again), and
 * learns no name the NAS would not show it (the target's own name may lie
 * in a directory it cannot list).  A relative text that stays inside
 * NAS_HUB as written, as a dangling link is shown (its form tells nothing
 * of where it leads); one naming NAS_HUB otherwise relative, inside the
 * mount; one into another root absolute, as on the NAS.  The blob is still
 * the target's. */
static int present_closed(const struct hub_roots *roots, const char *rel,
			  const struct hub_res *res, const struct stat *lst, const char *path,
			  const char *name, struct ns_entry *out)
{
	struct closed_paths *p = malloc(sizeof(*p));
	const char *rest = NULL;
	ssize_t n;
	int root, r = 0;

	if (!p)
		return -ENOMEM;
	n = readlink(path, p->text, sizeof(p->text) - 1);
	if (n < 0) {
		r = -errno;
		goto out;
	}
	p->text[n] = '\0';
	path_dirname(rel, p->dir, sizeof(p->dir));
	if (p->text[0] != '/' && inside_root(p)) {
		snprintf(out->target, sizeof(out->target), "%s", p->text);
	} else if ((root = first_hop(roots, p, &rest)) > 0 || (root < 0 && res->root != 0)) {
		snprintf(out->target, sizeof(out->target), "%s", root > 0 ? p->lex : res->real);
		out->link_state = NS_LINK_FOREIGN; /* (its backing says: a file) */
	} else {
		size_t rl = strlen(roots->path[0]);

		if (root < 0) /* (no first hop to be had: the way to the target) */
			rest = res->real + rl + (res->real[rl] == '/');
		r = path_relative(p->dir, rest, out->target, sizeof(out->target));
	}
	if (!r) {
		if (name)
			snprintf(out->blob_id, sizeof(out->blob_id), "%s", name);
		present_link(out, lst);
	}
out:
	free(p);
	return r;
}

int ns_classify(const struct hub_roots *roots, const char *rel, struct ns_entry *out)
{
	char path[PATH_MAX], blob_dir[PATH_MAX], dir[PATH_MAX], to[PATH_MAX];
	const char *via_dir = NULL, *name;
	struct hub_res res;
	struct stat lst;
	int r;

	entry_reset(out);
	r = path_join(roots->path[0], rel, path, sizeof(path));
	if (r < 0)
		return r;
	r = present_lstat(out, path, rel, &lst, lstat(path, &lst) < 0 ? -errno : 0);
	if (r <= 0)
		return r;

	if (hub_snapshot_blob_dir(rel, blob_dir, sizeof(blob_dir)))
		via_dir = blob_dir;
	r = hub_resolve(roots, rel, via_dir, &lst, &res);
	if (r < 0)
		return r;

	switch (res.kind) {
	case HUB_RES_DANGLING:
		return show_verbatim(path, &lst, NS_LINK_DANGLING, out);
	case HUB_RES_LOOP:
		return show_verbatim(path, &lst, NS_LINK_LOOP, out);
	case HUB_RES_ESCAPE:
		return show_verbatim(path, &lst, NS_LINK_ESCAPE, out);
	case HUB_RES_OTHER:
		return -ENOENT;
	case HUB_RES_DIR:
		if (res.root != 0)
			return show_verbatim(path, &lst, NS_LINK_FOREIGN, out);
		path_dirname(rel, dir, sizeof(dir));
		r = path_relative(dir, res.real + strlen(roots->path[0]) +
				  (res.real[strlen(roots->path[0])] == '/'),
				  out->target, sizeof(out->target));
		if (r < 0)
			return r;
		present_link(out, &lst);
		return 0;
	case HUB_RES_FILE:
		break;
	}

	strcpy(out->backing, res.real);
	backing_attrs(out, &res.st); /* the lstat of a regular file */
	if (res.via[0]) {
		/* A snapshot entry that is a blob of its own repo: show the link
		 * huggingface_hub would have written, so every hop stays inside
		 * the mount. */
		path_dirname(rel, dir, sizeof(dir));
		r = path_join(via_dir, res.via, to, sizeof(to));
		if (r < 0)
			return r;
		r = path_relative(dir, to, out->target, sizeof(out->target));
		if (r < 0)
			return r;
		snprintf(out->blob_id, sizeof(out->blob_id), "%s", res.via);
		present_link(out, &lst);
		return 0;
	}
	name = hub_repo_blob_name(rel);
	if (res.closed)
		return present_closed(roots, rel, &res, &lst, path, name, out);
	/* Any other link to a file (a repo blob pointing into a hub-level store,
	 * say) is shown as the file itself. */
	out->kind = NS_FILE;
	out->st = res.st;
	out->st.st_mode &= ~(mode_t)0222;
	if (name)
		snprintf(out->blob_id, sizeof(out->blob_id), "%s", name);
	return 0;
}

int ns_dir_open(struct ns_dir *d, const struct hub_roots *roots, const char *rel)
{
	char path[PATH_MAX];
	int r;

	d->roots = roots;
	d->fd = d->blobs_fd = -1;
	d->blobs_tried = 0;
	d->blobs_rel[0] = '\0';
	if (strlen(rel) >= sizeof(d->rel))
		return -ENAMETOOLONG;
	memmove(d->rel, rel, strlen(rel) + 1); /* @rel may be d->rel itself */
	r = path_join(roots->path[0], rel, path, sizeof(path));
	if (r < 0)
		return r;
	d->fd = nas_open(roots, path, O_DIRECTORY);
	return d->fd < 0 ? d->fd : 0;
}

void ns_dir_close(struct ns_dir *d)
{
	if (d->fd >= 0)
		close(d->fd);
	if (d->blobs_fd >= 0)
		close(d->blobs_fd);
	d->fd = d->blobs_fd = -1;
}

/* The shape huggingface_hub writes: a snapshot entry @name (@rel) whose
 * text, read from the link's own directory, leads to a regular file directly
 * in its repo's blobs/ -- one hop, classified as hub_resolve() would
 * (HUB_RES_FILE, via that name) from three calls relative to open
 * directories instead of four walks from the root.  1: not that shape (or
 * anything unexpected on the way): the caller takes the general walk. */
static int snapshot_blob_link(struct ns_dir *d, const char *rel, const char *name,
			      const struct stat *lst, struct ns_entry *out)
{
	char blob_dir[PATH_MAX], text[PATH_MAX], joined[2 * PATH_MAX], lex[PATH_MAX];
	char path[PATH_MAX], dir[PATH_MAX];
	const char *h;
	struct stat st;
	size_t bl;
	ssize_t n;

	if (!hub_snapshot_blob_dir(rel, blob_dir, sizeof(blob_dir)))
		return 1;
	n = readlinkat(d->fd, name, text, sizeof(text) - 1);
	if (n <= 0)
		return 1;
	text[n] = '\0';
	/* (lexical ".." is physical here: d->rel was opened without a link,
	 * and no ".." follows a name the text gives, which may be one) */
	if (text[0] == '/' || path_dotdot_after_name(text) >= 0 ||
	    path_join(d->rel, text, joined, sizeof(joined)) < 0 ||
	    path_normalize(joined, lex, sizeof(lex)) < 0)
		return 1;
	bl = strlen(blob_dir);
	if (strncmp(lex, blob_dir, bl) != 0 || lex[bl] != '/')
		return 1;
	h = lex + bl + 1;
	if (!*h || strchr(h, '/') || strlen(h) > NAME_MAX)
		return 1;
	if (!d->blobs_tried) {
		/* blobs/ a physical directory, as the walk's lstat would find */
		d->blobs_tried = 1;
		if (path_join(d->roots->path[0], blob_dir, path, sizeof(path)) < 0)
			return 1;
		d->blobs_fd = nas_open(d->roots, path, O_DIRECTORY);
		strcpy(d->blobs_rel, blob_dir);
	}
	if (d->blobs_fd < 0 || strcmp(d->blobs_rel, blob_dir) != 0)
		return 1;
	if (fstatat(d->blobs_fd, h, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
		return 1;
	if (path_join(d->roots->path[0], lex, out->backing, sizeof(out->backing)) < 0)
		return 1;
	path_dirname(rel, dir, sizeof(dir));
	if (path_relative(dir, lex, out->target, sizeof(out->target)) < 0)
		return 1;
	strcpy(out->blob_id, h);
	backing_attrs(out, &st);
	present_link(out, lst);
	return 0;
}

int ns_classify_in(struct ns_dir *d, const char *name, struct ns_entry *out)
{
	char rel[PATH_MAX], path[PATH_MAX];
	struct stat lst;
	int r;

	if (d->fd < 0 || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	entry_reset(out);
	if ((r = path_join(d->rel, name, rel, sizeof(rel))) < 0 ||
	    (r = path_join(d->roots->path[0], rel, path, sizeof(path))) < 0)
		return r;
	r = present_lstat(out, path, rel, &lst,
			  fstatat(d->fd, name, &lst, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0);
	if (r <= 0)
		return r;
	r = snapshot_blob_link(d, rel, name, &lst, out);
	if (r <= 0)
		return r;
	return ns_classify(d->roots, rel, out); /* any other link: the general walk */
}

int ns_classify_beneath(const struct hub_roots *roots, const char *rel, struct ns_entry *out)
{
	const char *name = strrchr(rel, '/');
	struct ns_dir *d;
	int r;

	if (!*rel)
		return ns_classify(roots, rel, out); /* the root: nothing above it */
	if (!(d = malloc(sizeof(*d))))
		return -ENOMEM;
	path_dirname(rel, d->rel, sizeof(d->rel));
	r = ns_dir_open(d, roots, d->rel);
	r = r == 0 ? ns_classify_in(d, name ? name + 1 : rel, out) : ns_dir_stale(r);
	ns_dir_close(d);
	free(d);
	return r;
}

const char *ns_link_state_name(enum ns_link_state s)
{
	switch (s) {
	case NS_LINK_RESOLVED: return "resolved";
	case NS_LINK_DANGLING: return "dangling";
	case NS_LINK_LOOP: return "loop";
	case NS_LINK_ESCAPE: return "escapes";
	case NS_LINK_FOREIGN: return "foreign";
	}
	return "?";
}

struct ns_batch_item {
	int res;
	enum ns_kind kind;
	enum ns_link_state link_state;
	struct stat st;
	size_t strs; /* offset of backing; target and blob_id follow it */
};

/* @p with room for @need items of @size (@cap of them now): @p itself,
 * the new block, or NULL (ENOMEM; @p untouched). */
static void *grow(void *p, size_t *cap, size_t need, size_t size)
{
	size_t c = *cap ? *cap : 16;

	if (need <= *cap)
		return p;
	while (c < need)
		c *= 2;
	p = realloc(p, c * size);
	if (p)
		*cap = c;
	return p;
}

int ns_batch_add(struct ns_batch *b, int res, const struct ns_entry *e)
{
	size_t lb, lt, li;
	struct ns_batch_item *it, *items;
	char *strs;

	items = grow(b->items, &b->cap, b->n + 1, sizeof(*b->items));
	if (!items)
		return -ENOMEM;
	b->items = items;
	if (res != 0) {
		b->items[b->n++].res = res;
		return 0;
	}
	lb = strlen(e->backing) + 1;
	lt = strlen(e->target) + 1;
	li = strlen(e->blob_id) + 1;
	strs = grow(b->strs, &b->strs_cap, b->len + lb + lt + li, 1);
	if (!strs)
		return -ENOMEM;
	b->strs = strs;
	it = &b->items[b->n++];
	it->res = 0;
	it->strs = b->len;
	it->kind = e->kind;
	it->link_state = e->link_state;
	it->st = e->st;
	memcpy(b->strs + b->len, e->backing, lb);
	memcpy(b->strs + b->len + lb, e->target, lt);
	memcpy(b->strs + b->len + lb + lt, e->blob_id, li);
	b->len += lb + lt + li;
	return 0;
}

int ns_batch_get(const struct ns_batch *b, size_t i, struct ns_entry *out)
{
	const struct ns_batch_item *it = &b->items[i];
	const char *s;

	if (it->res != 0)
		return it->res;
	s = b->strs + it->strs;
	out->kind = it->kind;
	out->link_state = it->link_state;
	out->st = it->st;
	out->has_backing_st = 0; /* not kept: a batch is a reply's attributes */
	/* each was shorter than its buffer in the entry it came from */
	strcpy(out->backing, s);
	s += strlen(s) + 1;
	strcpy(out->target, s);
	s += strlen(s) + 1;
	strcpy(out->blob_id, s);
	return 0;
}

void ns_batch_free(struct ns_batch *b)
{
	free(b->items);
	free(b->strs);
	memset(b, 0, sizeof(*b));
}

struct walk {
	const struct hub_roots *roots;
	int flags;
	int (*fn)(void *arg, const char *rel, const struct ns_entry *e);
	void *arg;
	struct ns_entry e; /* one per walk: only used between readdir calls */
	int fn_failed;     /* @fn returned an error: the walk stops */
	int broke;         /* a listing broke off part way: the walk stops */
};

/* One entry that vanished, is hidden, or cannot be read (a name too long,
 * no access) does not stop the walk of the others; running out of memory,
 * or what @fn says, does -- and under NS_WALK_STRICT any other error. */
static int skippable(const struct walk *wk, int r)
{
	if (r == -ENOMEM)
		return 0;
	if (!(wk->flags & NS_WALK_STRICT))
		return 1;
	return r == -ENOENT || r == -EACCES || r == -EPERM || r == -ELOOP || r == -ENAMETOOLONG;
}

static int walk_entry(struct walk *wk, struct ns_dir *in, const char *name, const char *rel,
		      int depth);

/* The entries of the directory @rel, each classified by descriptor in it
 * (ns_classify_in: a snapshot link is three calls relative to open
 * directories, where ns_classify looks up its path from the root for each
 * of five), then the directories among them in turn. */
static int walk_dir(struct walk *wk, const char *rel, int depth)
{
	struct ns_dir *nd = malloc(sizeof(*nd));
	struct dirent *de;
	DIR *d = NULL;
	int fd = -1, r;

	if (!nd)
		return -ENOMEM;
	/* listed physically: no link in any component, even one swapped in
	 * since the classification (nasopen.h) */
	r = ns_dir_open(nd, wk->roots, rel);
	if (r == 0 && ((fd = dup(nd->fd)) < 0 || !(d = fdopendir(fd)))) {
		r = -errno;
		if (fd >= 0)
			close(fd);
	}
	for (errno = 0; r == 0 && (de = readdir(d)); errno = 0) {
		char child[PATH_MAX];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (path_join(rel, de->d_name, child, sizeof(child)) < 0 ||
		    ((wk->flags & NS_WALK_WEIGHTS) && !hub_holds_weights(child)))
			continue;
		r = walk_entry(wk, nd, de->d_name, child, depth + 1);
		if (r < 0 && !wk->fn_failed && !wk->broke && skippable(wk, r))
			r = 0;
	}
	if (r == 0 && errno) {
		r = -errno; /* the listing broke off: entries after it unseen */
		wk->broke = 1;
	}
	if (d)
		closedir(d);
	ns_dir_close(nd);
	free(nd);
	return r;
}

/* @rel (the entry @name of @in; the walk's start when @in is NULL) to @fn,
 * and, a directory, what it holds. */
static int walk_entry(struct walk *wk, struct ns_dir *in, const char *name, const char *rel,
		      int depth)
{
	int r = in ? ns_classify_in(in, name, &wk->e) : ns_classify(wk->roots, rel, &wk->e);

	if (r < 0)
		return r;
	r = wk->fn(wk->arg, rel, &wk->e);
	wk->fn_failed = r < 0;
	if (r != 0 || wk->e.kind != NS_DIR || depth >= NS_WALK_DEPTH)
		return r;
	return walk_dir(wk, rel, depth);
}

int ns_walk(const struct hub_roots *roots, const char *rel, int flags,
	    int (*fn)(void *arg, const char *rel, const struct ns_entry *e), void *arg)
{
	struct walk *wk = malloc(sizeof(*wk));
	int r;

	if (!wk)
		return -ENOMEM;
	*wk = (struct walk){ .roots = roots, .flags = flags, .fn = fn, .arg = arg };
	r = hub_check_parents(roots, rel);
	if (r == 0)
		r = walk_entry(wk, NULL, NULL, rel, 0);
	free(wk);
	return r > 0 ? 0 : r;
}
