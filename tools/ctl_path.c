/* ctl_path.c - from command-line PATHs to the daemon's socket and
 * mount-relative paths; see ctl_path.h. */
#include "ctl_path.h"
#include "ctl_conn.h"
#include "ctl_fmt.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

void ctl_target_free(struct ctl_target *t)
{
	size_t i;

	for (i = 0; i < t->nrel; i++)
		free(t->rel[i]);
	free(t->rel);
	free(t->socket);
	free(t->root);
	t->rel = NULL;
	t->socket = t->root = NULL;
	t->nrel = 0;
}

struct strv {
	char **v;
	size_t n;
};

static int strv_add(struct strv *s, const char *str)
{
	char **nv = realloc(s->v, (s->n + 1) * sizeof(*nv));

	if (!nv)
		return -ENOMEM;
	s->v = nv;
	s->v[s->n] = strdup(str);
	if (!s->v[s->n])
		return -ENOMEM;
	s->n++;
	return 0;
}

static void strv_free(struct strv *s)
{
	while (s->n)
		free(s->v[--s->n]);
	free(s->v);
	s->v = NULL;
}

/* Collapse "//" and "." lexically; ".." is kept (see make_absolute). */
static void squeeze(char *p)
{
	char *w = p, *r = p;

	while (*r) {
		if (r[0] == '/' && (r[1] == '/' || (r[1] == '.' && (r[2] == '/' || !r[2])))) {
			r += r[1] == '/' ? 1 : 2;
			continue;
		}
		*w++ = *r++;
	}
	*w = '\0';
	if (w > p + 1 && w[-1] == '/')
		w[-1] = '\0';
	if (!*p)
		strcpy(p, "/");
}

/* Errors of a path's resolution after which the path is taken as given:
 * find_root tells apart a dead FUSE mount (ENOTCONN) and one this user may
 * not enter (EACCES: without -o allow_other), naming the directory; and a
 * wfs mount whose NAS is down answers EIO for a name it cannot show now,
 * which the daemon, asked about the path, says why of (not in its record,
 * the NAS down since when) where a bare "Input/output error" would not. */
static int root_error(int r)
{
	return r == -ENOTCONN || r == -EACCES || r == -EIO;
}

/* realpath(@path) into @out; a path where nothing resolves (root_error) as
 * it is, lexically absolute: find_root names the mount from it.  0 or
 * -errno. */
static int resolve_dir(const char *path, char *out)
{
	int r;

	if (realpath(path, out))
		return 0;
	r = -errno;
	if (root_error(r) && snprintf(out, PATH_MAX, "%s", path) >= PATH_MAX)
		return -ENAMETOOLONG;
	return r;
}

/* The absolute form of @arg without following a symlink in its last
 * component: in the mount, snapshot entries are links to ../../blobs/<id>,
 * and the daemon must see the snapshot path (and a dangling link must stay
 * nameable).  The directories above it are resolved with realpath, so ".."
 * means what the kernel means by it -- and so is the last component when
 * @arg ends in "/" (or "/.") and is a directory: as for the kernel, that
 * names the directory a link leads to (a shell's completion of a link to a
 * directory adds the "/"); a file so named is still the file.  A
 * root_error: @out the path as given, made absolute. */
static int make_absolute(const char *arg, char *out)
{
	char buf[PATH_MAX * 2], dir[PATH_MAX];
	char *slash, *base;
	struct stat st;
	size_t n;
	int r = 0, as_dir;

	if (arg[0] == '/') {
		n = (size_t)snprintf(buf, sizeof(buf), "%s", arg);
	} else {
		if (!getcwd(dir, sizeof(dir)))
			return -errno;
		n = (size_t)snprintf(buf, sizeof(buf), "%s/%s", dir, arg);
	}
	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	as_dir = buf[n - 1] == '/' || (n >= 2 && !strcmp(buf + n - 2, "/."));
	squeeze(buf);
	if (as_dir && strcmp(buf, "/") && !stat(buf, &st) && S_ISDIR(st.st_mode))
		return resolve_dir(buf, out);
	slash = strrchr(buf, '/');
	base = slash + 1;
	if (!*base || !strcmp(base, "..")) {
		/* "/" or ".../..": a directory, nothing to keep unresolved */
		return resolve_dir(buf, out);
	}
	if (slash == buf)
		strcpy(dir, "/");
	else {
		*slash = '\0';
		r = resolve_dir(buf, dir);
		if (r < 0 && !root_error(r))
			return r;
	}
	if ((size_t)snprintf(out, PATH_MAX, "%s%s%s", dir,
			     strcmp(dir, "/") ? "/" : "", base) >= PATH_MAX)
		return -ENAMETOOLONG;
	return r;
}

/* @dir without its last component ("/a" -> "/"); 0, or -1 at "/". */
static int up(char *dir)
{
	char *slash = strrchr(dir, '/');

	if (!strcmp(dir, "/"))
		return -1;
	if (slash == dir)
		slash[1] = '\0';
	else
		*slash = '\0';
	return 0;
}

/* Walk from @abs up to "/" looking for the mount root's xattr.  On success
 * @root holds the directory and @sock the socket path.  -ENODATA: none
 * found; -ENOTCONN: a wfs mount whose daemon is gone (@root: its mount
 * point, the highest directory that answers so); -EACCES: none found, but
 * a directory on the way could not be asked (@root: the highest such),
 * most likely a FUSE mount of another user. */
static int find_root(const char *abs, char *root, char *sock, size_t socksz)
{
	char denied[PATH_MAX] = "";

	strcpy(root, abs);
	for (;;) {
		/* lgetxattr: never follow the link a PATH may name */
		ssize_t n = lgetxattr(root, CTL_SOCKET_XATTR, sock, socksz - 1);

		if (n > 0) {
			sock[n] = '\0';
			return 0;
		}
		if (n < 0 && errno == ENOTCONN) {
			char above[PATH_MAX];

			/* every path in a dead mount says so: name the mount */
			strcpy(above, root);
			while (!up(above) && lgetxattr(above, CTL_SOCKET_XATTR, sock, socksz - 1) < 0 &&
			       errno == ENOTCONN)
				strcpy(root, above);
			return -ENOTCONN;
		}
		if (n < 0 && errno == ERANGE)
			return -ENAMETOOLONG;
		if (n < 0 && errno == EACCES)
			strcpy(denied, root);
		if (up(root) < 0)
			break;
	}
	if (!*denied)
		return -ENODATA;
	strcpy(root, denied);
	return -EACCES;
}

/* glob met a directory it cannot read, and stops (GLOB_ERR): its return
 * says only that one was, so which one is said here. */
static int glob_unreadable(const char *dir, int err)
{
	char d[FMT_TEXT];

	fprintf(stderr, "wfsctl: %s: cannot read the directory: %s\n",
		fmt_text(dir, d, sizeof(d)), strerror(err));
	return 1;
}

/* Expand @arg if it is a glob that is not also a file's literal name.
 * With --socket (@as_given) one that matches nothing here goes as it is:
 * the mount may not be visible (a container with only the socket), and
 * the name may hold a '[' of its own. */
static int expand(const char *arg, int as_given, struct strv *out)
{
	struct stat st;
	glob_t g;
	size_t i;
	int r;

	if (!strpbrk(arg, "*?[") || !lstat(arg, &st))
		return strv_add(out, arg);
	r = glob(arg, GLOB_ERR, as_given ? NULL : glob_unreadable, &g);
	if ((r == GLOB_NOMATCH || r == GLOB_ABORTED) && as_given) {
		globfree(&g);
		return strv_add(out, arg);
	}
	if (r == GLOB_NOMATCH) {
		fprintf(stderr, "wfsctl: %s: no such file, and no match as a pattern\n", arg);
		return -ENOENT;
	}
	if (r) {
		fprintf(stderr, "wfsctl: %s: cannot expand the pattern%s\n", arg,
			r == GLOB_NOSPACE ? ": out of memory" : ": a directory is unreadable");
		return r == GLOB_NOSPACE ? -ENOMEM : -EIO;
	}
	r = 0;
	for (i = 0; i < g.gl_pathc && !r; i++)
		r = strv_add(out, g.gl_pathv[i]);
	globfree(&g);
	return r;
}

static int set_str(char **dst, const char *src)
{
	*dst = strdup(src);
	return *dst ? 0 : -ENOMEM;
}

/* A path given with --socket when no mount is visible: it must already be
 * relative to the mount root, and stay inside it.  Cleaned lexically, as
 * there is nothing on this machine to resolve it against; a final "/" (or
 * "/.") is kept: "LINK/" is the directory a link to one leads to, which
 * the daemon resolves (through a mount, realpath does). */
static int relative_as_given(const char *arg, char **rel)
{
	size_t alen = strlen(arg), len = 0, cap = alen + 2;
	int dir = alen && (arg[alen - 1] == '/' ||
			   (arg[alen - 1] == '.' && (alen == 1 || arg[alen - 2] == '/')));
	const char *p = arg;
	char *out;

	if (arg[0] == '/')
		return -EXDEV;
	out = malloc(cap);
	if (!out)
		return -ENOMEM;
	out[0] = '\0';
	while (*p) {
		const char *seg = p;
		size_t n;

		while (*p && *p != '/')
			p++;
		n = (size_t)(p - seg);
		while (*p == '/')
			p++;
		if (!n || (n == 1 && *seg == '.'))
			continue;
		if (n == 2 && !strncmp(seg, "..", 2)) {
			if (!len) {
				free(out);
				return -EXDEV;
			}
			while (len && out[len - 1] != '/')
				len--;
			if (len)
				len--;
			out[len] = '\0';
			continue;
		}
		if (len)
			out[len++] = '/';
		memcpy(out + len, seg, n);
		len += n;
		out[len] = '\0';
	}
	if (dir && len)
		memcpy(out + len, "/", 2);
	*rel = out;
	return 0;
}

/* @abs, a symbolic link outside any mount, followed one hop into @out
 * (made absolute as a PATH is).  Only there: inside a mount a link is the
 * name the request is about (a snapshot's file), never its target. */
static int follow_outer_link(const char *abs, char *out)
{
	char target[PATH_MAX], joined[PATH_MAX * 2];
	const char *slash = strrchr(abs, '/');
	ssize_t n = readlink(abs, target, sizeof(target) - 1);

	if (n < 0)
		return -errno;
	target[n] = '\0';
	if (target[0] == '/')
		snprintf(joined, sizeof(joined), "%s", target);
	else
		snprintf(joined, sizeof(joined), "%.*s/%s", (int)(slash - abs), abs, target);
	return make_absolute(joined, out);
}

/* Could @a and @b be one socket?  0 only when both are there and differ
 * (inside a container the mount's own name for it may not exist). */
static int maybe_same_file(const char *a, const char *b)
{
	struct stat sa, sb;

	return stat(a, &sa) < 0 || stat(b, &sb) < 0 ||
	       (sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

static int resolve_one(struct ctl_target *t, const char *socket_opt,
		       const char *arg, const char *shown, char **rel)
{
	char abs[PATH_MAX], root[PATH_MAX], sock[PATH_MAX + 1];
	const char *under;
	int made = make_absolute(arg, abs), r = made;

	if (!r || root_error(r)) /* find_root names the mount */
		r = find_root(abs, root, sock, sizeof(sock));
	/* a link to a mount (or into one) from outside: its target is meant */
	for (int hops = 0; r == -ENODATA && made == 0 && hops < 40; hops++) {
		char next[PATH_MAX];
		int f = follow_outer_link(abs, next);

		if (f < 0 && !root_error(f))
			break;
		strcpy(abs, next);
		made = f;
		r = find_root(abs, root, sock, sizeof(sock));
	}
	if (r == -ENOTCONN) {
		fprintf(stderr, "wfsctl: %s: the wfs mount at %s is not connected "
			"(has the daemon died?)\n", shown, root);
		return r;
	}
	/* (with --socket a relative PATH needs no look: relative_as_given) */
	if (r == -EACCES && (!socket_opt || arg[0] == '/')) {
		/* FUSE lets only the mounting user in unless -o allow_other */
		fprintf(stderr, "wfsctl: %s: no access to %s to look for a wfs mount: %s "
			"(a FUSE mount without -o allow_other is only open to the user "
			"that mounted it%s)\n", shown, root, strerror(EACCES),
			socket_opt ? "; with --socket, name the path relative to the mount root"
				   : "");
		return r;
	}
	if (r && socket_opt) {
		r = relative_as_given(arg, rel);
		if (r == -EXDEV)
			fprintf(stderr, "wfsctl: %s: not inside a wfs mount, and with "
				"--socket such a path must be relative to the mount root\n", shown);
		return r;
	}
	if (r == -ENODATA && made == -EIO) {
		fprintf(stderr, "wfsctl: %s: %s\n", shown, strerror(EIO));
		return -EIO;
	}
	if (r == -ENODATA) {
		fprintf(stderr, "wfsctl: %s: not inside a wfs mount (no %s "
			"attribute on it or any directory above it)\n", shown, CTL_SOCKET_XATTR);
		return r;
	}
	if (r) {
		fprintf(stderr, "wfsctl: %s: %s\n", shown, strerror(-r));
		return r;
	}
	if (socket_opt && *sock && !maybe_same_file(socket_opt, sock)) {
		/* the request would go to another daemon, about its own mount */
		fprintf(stderr, "wfsctl: %s: in the wfs mount at %s, whose daemon listens on "
			"%s, not on --socket %s\n", shown, root, sock, socket_opt);
		return -EXDEV;
	}
	if (t->root && strcmp(t->root, root)) {
		fprintf(stderr, "wfsctl: %s: in the wfs mount at %s, but the other "
			"paths are in %s; one mount at a time\n", shown, root, t->root);
		return -EXDEV;
	}
	if (!t->root && (r = set_str(&t->root, root)))
		return r;
	if (!t->socket && (r = set_str(&t->socket, socket_opt ? socket_opt : sock)))
		return r;
	under = abs + strlen(root);
	while (*under == '/')
		under++;
	return set_str(rel, under);
}

static int resolve_target(struct ctl_target *t, const char *socket_opt,
			  char *const *args, size_t nargs)
{
	struct strv paths = { 0 };
	size_t i;
	int r = 0;

	memset(t, 0, sizeof(*t));
	for (i = 0; i < nargs && !r; i++)
		r = expand(args[i], socket_opt != NULL, &paths);
	if (!r && paths.n) {
		t->rel = calloc(paths.n, sizeof(*t->rel));
		if (!t->rel)
			r = -ENOMEM;
	}
	for (i = 0; i < paths.n && !r; i++) {
		r = resolve_one(t, socket_opt, paths.v[i], paths.v[i], &t->rel[i]);
		if (!r)
			t->nrel++;
	}
	if (!r && !t->socket && socket_opt)
		r = set_str(&t->socket, socket_opt);
	if (!r && !t->socket) {
		/* no PATH: the mount around the current directory */
		char *rel = NULL, cwd[PATH_MAX + 32];

		if (!getcwd(cwd, PATH_MAX))
			strcpy(cwd, ".");
		strcat(cwd, " (the current directory)");
		r = resolve_one(t, NULL, ".", cwd, &rel);
		free(rel);
		if (r == -ENODATA)
			fprintf(stderr, "wfsctl: give a PATH inside a wfs mount, or "
				"--socket LOCAL_STORE/wfs.sock\n");
	}
	strv_free(&paths);
	if (r)
		ctl_target_free(t);
	return r;
}

int ctl_target_resolve(struct ctl_conn *c, struct ctl_target *t, const char *socket_opt,
		       char *const *args, size_t nargs)
{
	char cwd[PATH_MAX];
	int r;

	/* Finding the mount asks it (lgetxattr, glob): a stopped daemon
	 * would hang wfsctl there, before any socket. */
	if (!nargs && !getcwd(cwd, sizeof(cwd)))
		strcpy(cwd, ".");
	r = ctl_watchdog_arm(c, nargs ? args[0] : cwd);
	if (r < 0)
		fprintf(stderr, "wfsctl: warning: no thread to time the mount out: %s\n",
			strerror(-r));
	r = resolve_target(t, socket_opt, args, nargs);
	ctl_watchdog_disarm(c);
	return r;
}
