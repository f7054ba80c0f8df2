/* resolve.c - fuzz the link resolver and the namespace rules (core/resolve.c,
 * core/ns.c, core/path.c) over trees made from the input.
 *
 * Input: lines "<op> <path> [<arg>]", at most 96:
 *   d PATH          a directory (parents are made as needed)
 *   f PATH [TEXT]   a regular file
 *   l PATH TARGET   a symlink; in TARGET (and PATH), @0 @1 @o @t stand
 *                   for the absolute paths of NAS_HUB, the second
 *                   directory, a directory outside every root and the
 *                   tree's top, @L for a 250-byte name (long paths)
 *   p PATH          a fifo (never served)
 *   ? PATH          a made-up path to classify as a client would send it
 *   L N             the roots (N mod 4): 0 NAS_HUB alone; 1 (default) and a
 *                   sibling extra root; 2 and an extra root inside NAS_HUB;
 *                   3 and an extra root that contains NAS_HUB
 * A PATH is relative to NAS_HUB, or to the second directory with "@1/", or
 * to the outside one with "@o/" ("@o/secret" always exists); "." and ".."
 * in it are dropped and a line that would create through a link is
 * skipped.  Then every entry of the mount is classified (ns_walk), so is
 * every made-up path whose parents a client could reach (normalised,
 * hub_check_parents); every made-up path is also looked up the way a
 * reader's open reaches it, and every resolved link the mount shows is
 * followed, the way the kernel follows it through the mount (each hop
 * classified and checked again).
 *
 * WFS_FUZZ_VERBOSE=1 prints every classification checked.
 *
 * Invariants (a violation traps):
 *  - every entry the walk classifies is classified alike by descriptor,
 *    from its directory (ns_classify_in, what a READDIRPLUS batch uses);
 *  - every path the resolver or the namespace lstat()s, readlink()s or
 *    opendir()s lies inside a root, reached without following a link and
 *    without climbing out of the roots (lstat, readlink and opendir are
 *    wrapped with ld --wrap);
 *  - a file's backing path is a physical regular file inside a root, and
 *    its presented attributes are that file's, without write bits;
 *  - a directory's backing path is a physical directory inside NAS_HUB;
 *  - a resolved link's text is relative, stays inside the mount, and
 *    followed through the mount reaches the same file (or a directory);
 *  - a link shown as it is shows the NAS link's own text.
 */
#include "fuzz.h"

#include "ns.h"
#include "path.h"
#include "resolve.h"

#include <dirent.h>

#define MAX_LINES 96
#define MAX_WALKED 256
#define MAX_QUERIES 16

static char top[PATH_MAX];
static struct hub_roots roots;
static char dir0[PATH_MAX], dir1[PATH_MAX], out_dir[PATH_MAX];
static int active; /* inside the code under test: check what it touches */
static int verbose; /* WFS_FUZZ_VERBOSE=1: print each classification */

/* ---- what the code under test touches ---- */

int __real_lstat(const char *path, struct stat *st);
ssize_t __real_readlink(const char *path, char *buf, size_t sz);
DIR *__real_opendir(const char *path);
int __wrap_lstat(const char *path, struct stat *st);
ssize_t __wrap_readlink(const char *path, char *buf, size_t sz);
DIR *__wrap_opendir(const char *path);

static int inside_roots(const char *abs)
{
	for (int i = 0; i < roots.n; i++)
		if (path_under(roots.path[i], abs))
			return 1;
	return 0;
}

/* @p is handed to a system call that resolves it: walk it as the kernel
 * would and check that nothing outside the roots is looked at and no link
 * is followed (but the last component's with @follow_last). */
static void check_touch(const char *fn, const char *p, int follow_last)
{
	char cur[PATH_MAX * 2];
	const char *rest = NULL, *s;
	int ri;

	FUZZ_ASSERT(p[0] == '/', "%s(\"%s\"): a relative path", fn, p);
	for (ri = 0; ri < roots.n && !rest; ri++)
		rest = path_under(roots.path[ri], p);
	FUZZ_ASSERT(rest, "%s(\"%s\"): outside every root", fn, p);
	snprintf(cur, sizeof(cur), "%s", roots.path[ri - 1]);
	for (s = rest; *s;) {
		size_t n = strcspn(s, "/"), len = strlen(cur);
		int last = !s[n] || !s[n + strspn(s + n, "/")];
		struct stat st;

		if (n == 0 || (n == 1 && s[0] == '.')) {
			/* nothing to look up */
		} else if (n == 2 && s[0] == '.' && s[1] == '.') {
			char *slash = strrchr(cur, '/');

			if (slash == cur)
				slash[1] = '\0';
			else
				*slash = '\0';
			FUZZ_ASSERT(inside_roots(cur), "%s(\"%s\"): climbs out of the roots to %s",
				    fn, p, cur);
		} else {
			if (len + 1 + n >= sizeof(cur))
				return; /* ENAMETOOLONG */
			snprintf(cur + len, sizeof(cur) - len, "/%.*s", (int)n, s);
			if (last && !follow_last)
				return;
			if (__real_lstat(cur, &st) < 0)
				return; /* nothing further is looked at */
			FUZZ_ASSERT(!S_ISLNK(st.st_mode), "%s(\"%s\"): follows the link %s", fn, p,
				    cur);
			if (!S_ISDIR(st.st_mode))
				return;
		}
		s += n;
		s += strspn(s, "/");
	}
}

int __wrap_lstat(const char *path, struct stat *st)
{
	if (active)
		check_touch("lstat", path, 0);
	return __real_lstat(path, st);
}

ssize_t __wrap_readlink(const char *path, char *buf, size_t sz)
{
	if (active)
		check_touch("readlink", path, 0);
	return __real_readlink(path, buf, sz);
}

DIR *__wrap_opendir(const char *path)
{
	if (active)
		check_touch("opendir", path, 1);
	return __real_opendir(path);
}

/* ---- the tree ---- */

struct line {
	char op;
	char *path, *arg;
};

/* @in with @0 @1 @o @t (absolute paths) and @L (a 250-byte name) put in. */
static int expand(const char *in, char *out, size_t outsz)
{
	static char long_name[251];
	size_t k = 0;

	if (!long_name[0])
		memset(long_name, 'L', sizeof(long_name) - 1);
	for (const char *a = in; *a; a++) {
		const char *sub = NULL;

		if (a[0] == '@') {
			switch (a[1]) {
			case '0': sub = dir0; break;
			case '1': sub = dir1; break;
			case 'o': sub = out_dir; break;
			case 't': sub = top; break;
			case 'L': sub = long_name; break;
			}
		}
		if (sub) {
			size_t m = strlen(sub);

			if (k + m + 1 > outsz)
				return -1;
			memcpy(out + k, sub, m);
			k += m;
			a++;
		} else {
			if (k + 2 > outsz)
				return -1;
			out[k++] = *a;
		}
	}
	out[k] = '\0';
	return 0;
}

/* Make @rel (expanded) under @base, every parent a plain directory; 0 or
 * -1 (skipped). */
static int make(const char *base, const char *rel_in, char op, const char *arg)
{
	char p[PATH_MAX], comp[NAME_MAX + 1], rel[PATH_MAX * 2];
	const char *s = rel;
	size_t len = strlen(base);
	struct stat st;
	int depth = 0;

	if (len >= sizeof(p) || expand(rel_in, rel, sizeof(rel)) < 0)
		return -1;
	memcpy(p, base, len + 1);
	for (;;) {
		size_t n;

		s += strspn(s, "/");
		n = strcspn(s, "/");
		if (n == 0)
			return -1; /* nothing named */
		if (n > NAME_MAX || len + 1 + n >= sizeof(p) || ++depth > 70)
			return -1;
		memcpy(comp, s, n);
		comp[n] = '\0';
		s += n;
		s += strspn(s, "/");
		if (!strcmp(comp, ".") || !strcmp(comp, ".."))
			continue;
		p[len++] = '/';
		memcpy(p + len, comp, n + 1);
		len += n;
		if (!*s)
			break;
		if (__real_lstat(p, &st) == 0) {
			if (!S_ISDIR(st.st_mode))
				return -1; /* never through a link */
		} else if (mkdir(p, 0755) < 0) {
			return -1;
		}
	}
	switch (op) {
	case 'd':
		return mkdir(p, 0755);
	case 'f': {
		int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		size_t n = arg ? strlen(arg) : 0;

		if (fd < 0)
			return -1;
		if (n && write(fd, arg, n > 64 ? 64 : n) < 0) {
			close(fd);
			return -1;
		}
		close(fd);
		return 0;
	}
	case 'p':
		return mkfifo(p, 0644);
	case 'l': {
		char target[PATH_MAX];

		if (expand(arg ? arg : "", target, sizeof(target)) < 0)
			return -1;
		return symlink(target, p);
	}
	}
	return -1;
}

static void build_tree(struct line *v, int n, int layout)
{
	char p[PATH_MAX + 32];

	snprintf(p, sizeof(p), "%s/t", fuzz_base);
	snprintf(top, sizeof(top), "%s", p);
	switch (layout) {
	case 2:
		snprintf(dir0, sizeof(dir0), "%s/r0", top);
		snprintf(dir1, sizeof(dir1), "%s/r0/in", top);
		break;
	case 3:
		snprintf(dir1, sizeof(dir1), "%s/r1", top);
		snprintf(dir0, sizeof(dir0), "%s/r1/r0", top);
		break;
	default:
		snprintf(dir0, sizeof(dir0), "%s/r0", top);
		snprintf(dir1, sizeof(dir1), "%s/r1", top);
		break;
	}
	snprintf(out_dir, sizeof(out_dir), "%s/out", top);
	fuzz_mkdirs(dir0);
	fuzz_mkdirs(dir1);
	fuzz_mkdirs(out_dir);
	snprintf(p, sizeof(p), "%s/secret", out_dir);
	fuzz_write(p, "secret\n", 7);
	memset(&roots, 0, sizeof(roots));
	FUZZ_SETUP(hub_roots_add(&roots, dir0) == 0, "root");
	if (layout)
		FUZZ_SETUP(hub_roots_add(&roots, dir1) == 0, "extra root");
	for (int i = 0; i < n; i++) {
		const char *base = dir0, *rel = v[i].path;

		if (v[i].op == '?' || v[i].op == 'L')
			continue;
		if (!strncmp(rel, "@1/", 3)) {
			base = dir1;
			rel += 3;
		} else if (!strncmp(rel, "@o/", 3)) {
			base = out_dir;
			rel += 3;
		}
		(void)make(base, rel, v[i].op, v[i].arg);
	}
}

/* ---- the invariants ---- */

static int physical(const char *p)
{
	char *real = realpath(p, NULL);
	int same = real && !strcmp(real, p);

	free(real);
	return same;
}

static int mount_follow(const char *start, struct ns_entry *fin);
static int following; /* inside mount_follow: check entries, follow nothing more */

static void check_entry(const char *rel, const struct ns_entry *e)
{
	struct stat st;
	char nas_path[PATH_MAX * 2];

	snprintf(nas_path, sizeof(nas_path), "%s%s%s", roots.path[0], *rel ? "/" : "", rel);
	if (verbose)
		fprintf(stderr, "%-40s %s %s%s%s %s\n", *rel ? rel : "(root)",
			e->kind == NS_DIR ? "dir " : e->kind == NS_FILE ? "file" : "link",
			e->kind == NS_LINK ? ns_link_state_name(e->link_state) : "",
			e->kind == NS_LINK ? " -> " : "", e->kind == NS_LINK ? e->target : "",
			e->backing);
	switch (e->kind) {
	case NS_DIR:
		FUZZ_ASSERT(path_under(roots.path[0], e->backing) && physical(e->backing) &&
			    __real_lstat(e->backing, &st) == 0 && S_ISDIR(st.st_mode),
			    "\"%s\": directory backed by %s, not a directory of NAS_HUB", rel,
			    e->backing);
		break;
	case NS_FILE:
		FUZZ_ASSERT(inside_roots(e->backing), "\"%s\": file backed by %s, outside the roots",
			    rel, e->backing);
		FUZZ_ASSERT(physical(e->backing) && __real_lstat(e->backing, &st) == 0 &&
			    S_ISREG(st.st_mode), "\"%s\": backing %s is not a physical regular file",
			    rel, e->backing);
		FUZZ_ASSERT(e->st.st_ino == st.st_ino && e->st.st_dev == st.st_dev &&
			    e->st.st_size == st.st_size, "\"%s\": attributes not those of %s", rel,
			    e->backing);
		FUZZ_ASSERT(S_ISREG(e->st.st_mode) && !(e->st.st_mode & 0222),
			    "\"%s\": presented mode %o", rel, (unsigned)e->st.st_mode);
		FUZZ_ASSERT(e->has_backing_st && e->backing_st.st_ino == st.st_ino &&
			    e->backing_st.st_dev == st.st_dev && e->backing_st.st_size == st.st_size,
			    "\"%s\": backing attributes not those of %s", rel, e->backing);
		break;
	case NS_LINK:
		FUZZ_ASSERT(S_ISLNK(e->st.st_mode) && e->target[0] &&
			    e->st.st_size == (off_t)strlen(e->target),
			    "\"%s\": link presented as mode %o, size %lld, \"%s\"", rel,
			    (unsigned)e->st.st_mode, (long long)e->st.st_size, e->target);
		if (e->link_state != NS_LINK_RESOLVED) {
			char text[PATH_MAX];
			ssize_t n = __real_readlink(nas_path, text, sizeof(text) - 1);

			FUZZ_ASSERT(n >= 0 && (size_t)n == strlen(e->target) &&
				    !memcmp(text, e->target, (size_t)n),
				    "\"%s\": shown as it is (%s) but as \"%s\"", rel,
				    ns_link_state_name(e->link_state), e->target);
		} else {
			char dir[PATH_MAX], joined[PATH_MAX * 2], norm[PATH_MAX * 2];
			struct ns_entry fin;
			int r;

			FUZZ_ASSERT(e->target[0] != '/', "\"%s\": resolved to an absolute link %s", rel,
				    e->target);
			path_dirname(rel, dir, sizeof(dir));
			snprintf(joined, sizeof(joined), "%s%s%s", dir, *dir ? "/" : "", e->target);
			FUZZ_ASSERT(path_normalize(joined, norm, sizeof(norm)) == 0,
				    "\"%s\": resolved link \"%s\" leaves the mount", rel, e->target);
			if (e->backing[0]) {
				struct stat bst;

				FUZZ_ASSERT(e->has_backing_st && __real_lstat(e->backing, &bst) == 0 &&
					    S_ISREG(e->backing_st.st_mode) &&
					    e->backing_st.st_ino == bst.st_ino &&
					    e->backing_st.st_size == bst.st_size,
					    "\"%s\": backing attributes not those of %s", rel,
					    e->backing);
			}
			if (following)
				break;
			r = mount_follow(rel, &fin);
			/* r == 1: the way on leaves the mount through a link shown as it
			 * is (say blobs/ itself links into an extra root): the reader's
			 * own business, not the daemon's.  ENAMETOOLONG: a limit, not a
			 * wrong answer. */
			FUZZ_ASSERT(r >= 0 || r == -ENAMETOOLONG, "\"%s\" -> \"%s\": followed through the mount: %s", rel,
				    e->target, strerror(-r));
			if (r == 0 && e->backing[0])
				FUZZ_ASSERT(fin.kind == NS_FILE && !strcmp(fin.backing, e->backing),
					    "\"%s\" -> \"%s\": the mount leads to %s, the daemon "
					    "serves %s", rel, e->target,
					    fin.kind == NS_FILE ? fin.backing : "a non-file",
					    e->backing);
			else if (r == 0)
				FUZZ_ASSERT(fin.kind == NS_DIR, "\"%s\" -> \"%s\": not a directory",
					    rel, e->target);
		}
		break;
	default:
		FUZZ_ASSERT(0, "\"%s\": kind %d", rel, (int)e->kind);
	}
}

/* Follow @start through the mount as the kernel would: every directory the
 * walk enters is one the mount shows, every link's text is taken from the
 * mount, every entry met is checked (no link is followed from there
 * again).  0 with @fin the end point; 1 when the way leaves the mount (an
 * absolute link, or ".." above its root); -errno as the kernel would fail. */
static int mount_follow(const char *start, struct ns_entry *fin)
{
	char todo[PATH_MAX * 2], cur[PATH_MAX] = "", cand[PATH_MAX];
	struct ns_entry e;
	int hops = 0, r;

	snprintf(todo, sizeof(todo), "%s", start);
	following++;
	r = 0;
	for (;;) {
		char *s = todo + strspn(todo, "/"), comp[PATH_MAX];
		size_t n = strcspn(s, "/");

		if (n == 0) {
			r = ns_classify(&roots, cur, fin);
			if (r == 0)
				check_entry(cur, fin);
			break;
		}
		memcpy(comp, s, n);
		comp[n] = '\0';
		s += n;
		s += strspn(s, "/");
		memmove(todo, s, strlen(s) + 1);
		if (!strcmp(comp, "."))
			continue;
		if (!strcmp(comp, "..")) {
			if (!cur[0]) {
				r = 1;
				break;
			}
			path_dirname(cur, cur, sizeof(cur));
			continue;
		}
		if (path_join(cur, comp, cand, sizeof(cand)) < 0) {
			r = -ENAMETOOLONG;
			break;
		}
		r = ns_classify(&roots, cand, &e);
		if (r < 0)
			break;
		check_entry(cand, &e);
		if (e.kind == NS_DIR) {
			snprintf(cur, sizeof(cur), "%s", cand);
			continue;
		}
		if (e.kind == NS_FILE) {
			if (todo[0]) {
				r = -ENOTDIR;
			} else {
				*fin = e;
				r = 0;
			}
			break;
		}
		/* a loop the daemon found loops in the mount too (not followed
		 * round again: each hop would resolve HUB_MAX_HOPS links) */
		if (++hops > HUB_MAX_HOPS || e.link_state == NS_LINK_LOOP) {
			r = -ELOOP;
			break;
		}
		if (e.target[0] == '/') {
			r = 1;
			break;
		}
		{
			char next[PATH_MAX * 2];

			if (strlen(e.target) + 1 + strlen(todo) >= sizeof(next)) {
				r = -ENAMETOOLONG;
				break;
			}
			snprintf(next, sizeof(next), "%s/%s", e.target, todo);
			snprintf(todo, sizeof(todo), "%s", next);
		}
	}
	following--;
	return r;
}

/* ---- the run ---- */

struct seen {
	char *rel[MAX_WALKED];
	int n;
};

/* A READDIRPLUS batch classifies by descriptor (ns_classify_in): it must
 * say what the walk's ns_classify said of the same entry. */
static void check_classify_in(const char *rel, const struct ns_entry *e)
{
	static struct ns_dir d;
	static struct ns_entry in;
	char parent[PATH_MAX];
	const char *name = strrchr(rel, '/');
	int r;

	if (!*rel)
		return;
	path_dirname(rel, parent, sizeof(parent));
	name = name ? name + 1 : rel;
	if (ns_dir_open(&d, &roots, parent) == 0) {
		r = ns_classify_in(&d, name, &in);
		FUZZ_ASSERT(r == 0, "ns_classify_in(%s): %d, the walk's classification 0", rel, r);
		FUZZ_ASSERT(in.kind == e->kind && in.link_state == e->link_state &&
			    in.st.st_ino == e->st.st_ino && in.st.st_mode == e->st.st_mode &&
			    in.st.st_size == e->st.st_size && !strcmp(in.backing, e->backing) &&
			    !strcmp(in.target, e->target) && !strcmp(in.blob_id, e->blob_id),
			    "ns_classify_in(%s): kind %d target '%s' backing '%s' id '%s'; the walk: "
			    "kind %d target '%s' backing '%s' id '%s'", rel, in.kind, in.target,
			    in.backing, in.blob_id, e->kind, e->target, e->backing, e->blob_id);
	}
	ns_dir_close(&d);
}

static int on_walk(void *arg, const char *rel, const struct ns_entry *e)
{
	struct seen *w = arg;

	check_entry(rel, e);
	check_classify_in(rel, e);
	if (w && w->n < MAX_WALKED)
		w->rel[w->n++] = strdup(rel);
	return 0;
}

/* A path as a client sends it (control requests are normalised and their
 * parents checked; FUSE lookups come one name at a time under a directory). */
static void query(const char *path, int walk)
{
	char norm[PATH_MAX];
	struct ns_entry e;
	int r;

	char buf[PATH_MAX * 2];

	if (expand(path, buf, sizeof(buf)) < 0)
		return;
	path = buf;
	/* the way a reader's open reaches it: one lookup at a time, each link
	 * the mount shows followed by the kernel */
	if (path[0] != '/')
		(void)mount_follow(path, &e);
	if (path[0] == '/' || path_normalize(path, norm, sizeof(norm)) < 0)
		return;
	r = hub_check_parents(&roots, norm);
	if (r == 0)
		r = ns_classify(&roots, norm, &e);
	if (r == 0)
		check_entry(norm, &e);
	if (walk && hub_check_parents(&roots, norm) == 0)
		(void)ns_walk(&roots, norm, NS_WALK_WEIGHTS, on_walk, NULL);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fuzz_make_base("resolve");
	verbose = getenv("WFS_FUZZ_VERBOSE") != NULL;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct line v[MAX_LINES];
	struct seen w = { .n = 0 };
	char *buf, *p, *end;
	int n = 0, layout = 1, nq = 0;

	if (size > 16384)
		return -1;
	buf = malloc(size + 1);
	FUZZ_SETUP(buf, "malloc");
	memcpy(buf, data, size);
	buf[size] = '\0';
	for (p = buf, end = buf + size; p < end && n < MAX_LINES;) {
		char *nl = memchr(p, '\n', (size_t)(end - p)), *sp;

		if (nl)
			*nl = '\0';
		if (p[0] && p[1] == ' ') {
			v[n].op = p[0];
			v[n].path = p + 2;
			v[n].arg = NULL;
			if (p[0] == 'l' || p[0] == 'f') {
				sp = strchr(p + 2, ' ');
				if (sp) {
					*sp = '\0';
					v[n].arg = sp + 1;
				}
			}
			if (p[0] == 'L')
				layout = (v[n].path[0] - '0') & 3;
			n++;
		}
		if (!nl)
			break;
		p = nl + 1;
	}
	build_tree(v, n, layout);

	/* Every system call of the code under test is checked from here on
	 * (the checks themselves use the __real_ calls and realpath). */
	active = 1;
	/* every entry of the mount */
	(void)ns_walk(&roots, "", 0, on_walk, &w);
	/* and made-up paths: the queries, under files and links, above them */
	query("", 0);
	query("nonexistent", 0);
	query("models--a--b/snapshots/r/x", 0);
	for (int i = 0; i < n && nq < MAX_QUERIES; i++)
		if (v[i].op == '?') {
			query(v[i].path, 1);
			nq++;
		}
	for (int i = 0; i < w.n && i < 32; i++) {
		char q[PATH_MAX + 8];

		snprintf(q, sizeof(q), "%s/x", w.rel[i]);
		query(q, 0);
		snprintf(q, sizeof(q), "%s/..", w.rel[i]);
		query(q, 0);
	}
	active = 0;
	for (int i = 0; i < w.n; i++)
		free(w.rel[i]);
	fuzz_rm_tree(top);
	free(buf);
	return 0;
}
