/* startpaths.c - the paths of the command line at start-up; see
 * startpaths.h. */
#include "startpaths.h"
#include "path.h"
#include "wfs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int abs_lexical(const char *p, char *out, size_t sz)
{
	char cwd[PATH_MAX], joined[PATH_MAX];
	int r;

	if (p[0] == '/')
		snprintf(joined, sizeof(joined), "%s", p);
	else if (!getcwd(cwd, sizeof(cwd)) || (r = path_join(cwd, p, joined, sizeof(joined))) < 0)
		return -ENAMETOOLONG;
	r = path_normalize(joined, out, sz);
	if (r == 0 && strlen(out) > 1 && out[strlen(out) - 1] == '/')
		out[strlen(out) - 1] = '\0';
	return r;
}

/* @p made absolute with its longest existing prefix resolved (symlinks,
 * "..", as the kernel resolves them) and the rest appended as written: a
 * LOCAL_STORE not made yet under a symlink into NAS_HUB is still inside
 * it.  -EINVAL for a ".." in that rest: after a name not made yet, it is
 * the kernel's to resolve at the mkdir, and no lexical answer is sure. */
static int abs_resolved(const char *p, char *out, size_t sz)
{
	char joined[PATH_MAX], head[PATH_MAX], real[PATH_MAX], tail[PATH_MAX] = "", cwd[PATH_MAX];
	size_t cut, n = 0;

	if (p[0] == '/')
		snprintf(joined, sizeof(joined), "%s", p);
	else if (!getcwd(cwd, sizeof(cwd)) ||
		 snprintf(joined, sizeof(joined), "%s/%s", cwd, p) >= (int)sizeof(joined))
		return -ENAMETOOLONG;
	snprintf(head, sizeof(head), "%s", joined);
	for (cut = strlen(head); !realpath(head, real); ) {
		char *slash = strrchr(head, '/');

		if (!slash || slash == head)
			return -ENOENT;
		*slash = '\0';
		cut = (size_t)(slash - head);
	}
	/* the rest, component by component: "." and empty ones dropped */
	for (const char *c = joined + cut; *c; ) {
		size_t len;

		c += strspn(c, "/");
		len = strcspn(c, "/");
		if (len == 2 && !strncmp(c, "..", 2))
			return -EINVAL;
		if (len && !(len == 1 && c[0] == '.')) {
			if (n + 1 + len >= sizeof(tail))
				return -ENAMETOOLONG;
			tail[n++] = '/';
			memcpy(tail + n, c, len);
			tail[n += len] = '\0';
		}
		c += len;
	}
	if (snprintf(out, sz, "%s%s", strcmp(real, "/") ? real : "", tail) >= (int)sz)
		return -ENAMETOOLONG;
	if (!out[0])
		snprintf(out, sz, "/");
	return 0;
}

/* A mount on NAS_HUB, above it or inside it reads the NAS through itself
 * (every request waits on its own: EIO), and one above LOCAL_STORE hides
 * the store from the daemon.  Canonical paths where they exist. */
static int check_overlap(struct wfs *w)
{
	char nas[PATH_MAX], mnt[PATH_MAX], local[PATH_MAX];
	int r;

	if (w->roots.n)
		snprintf(nas, sizeof(nas), "%s", w->roots.path[0]);
	else if (abs_resolved(w->opt.nas, nas, sizeof(nas)) < 0)
		return 0;
	if (!realpath(w->opt.mnt, mnt))
		return 0; /* startpaths_check names what is wrong */
	r = abs_resolved(w->opt.local, local, sizeof(local));
	if (r == -EINVAL) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: \"..\" after a directory that does not exist "
			"yet: where it leads is known only once it is made (name the store "
			"without it)\n", w->opt.local);
		return -1;
	}
	if (r < 0)
		return 0;
	if (path_under(mnt, nas) || path_under(nas, mnt)) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: %s NAS_HUB %s: wfs would read the NAS "
			"through its own mount (mount it elsewhere)\n", mnt,
			!strcmp(mnt, nas) ? "is" : path_under(mnt, nas) ? "holds" : "is inside",
			nas);
		return -1;
	}
	if (path_under(mnt, local)) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: %s MOUNTPOINT %s, which would hide it "
			"from wfs\n", local, strcmp(mnt, local) ? "inside" : "is", mnt);
		return -1;
	}
	/* (a mount on LOCAL_STORE/data hid every copy from the daemon, and
	 * every promotion failed EROFS) */
	if (path_under(local, mnt)) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: inside LOCAL_STORE %s, whose files it would "
			"hide from wfs (mount it elsewhere)\n", mnt, local);
		return -1;
	}
	/* A store on the NAS is no local copy: every "local" read would
	 * still be the NAS's, and the store showed in the mount's listing (and
	 * in every other mount of that NAS); a NAS inside the store would
	 * serve the store's own files. */
	for (int i = 0; i < (w->roots.n ? w->roots.n : 1); i++) {
		const char *root = w->roots.n ? w->roots.path[i] : nas;

		if (path_under(root, local) || path_under(local, root)) {
			fprintf(stderr, "wfs: LOCAL_STORE %s: %s NAS_HUB %s: the store must be a "
				"directory of its own on local disk\n", local,
				!strcmp(local, root) ? "is" : path_under(root, local) ? "inside" :
				"holds", root);
			return -1;
		}
	}
	return 0;
}

/* The store's copies are served as verified: a store directory another
 * user owns is one that user can change under the daemon (swap a copy,
 * or its control socket for a link the daemon's chmod follows), so it is
 * refused.  A parent that another user may write could have the store
 * renamed away and another put in its place: said, not refused (a
 * mount point owned by a service user is common, and that user is the
 * admin's). */
static int check_store_owner(const char *local)
{
	char p[PATH_MAX], *slash;
	uid_t me = geteuid();
	struct stat st;

	if (lstat(local, &st) < 0)
		return 0; /* (startpaths_check says why) */
	if (st.st_uid != me) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: owned by uid %u, not by this daemon's user "
			"(uid %u): that user could change the copies wfs serves as verified "
			"(chown it, or use a directory of your own)\n", local, (unsigned)st.st_uid,
			(unsigned)me);
		return -1;
	}
	snprintf(p, sizeof(p), "%s", local);
	while ((slash = strrchr(p, '/')) && slash != p) {
		*slash = '\0';
		if (stat(p, &st) == 0 && ((st.st_uid != 0 && st.st_uid != me) ||
		    ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))))
			fprintf(stderr, "wfs: warning: LOCAL_STORE %s: its parent %s (uid %u, mode "
				"%04o) may be written by another user, who could put a directory "
				"of their own in the store's place\n", local, p,
				(unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
	}
	return 0;
}

/* NAS_HUB is looked at first: an unreachable NAS may be served from
 * LOCAL_STORE's record. */
int startpaths_check(struct wfs *w)
{
	struct wfs_opts *o = &w->opt;
	struct statx stx;
	struct stat st;
	int r;

	if (statx(AT_FDCWD, o->mnt, 0, STATX_TYPE, &stx) < 0) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: %s%s\n", o->mnt, strerror(errno),
			errno == ENOTCONN ? " (a FUSE mount whose daemon is gone: unmount it "
			"first, umount MOUNTPOINT)" : "");
		return -1;
	}
	if (!S_ISDIR(stx.stx_mode)) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: not a directory\n", o->mnt);
		return -1;
	}
	if (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT &&
	    stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: already a mount point (unmount it first)\n",
			o->mnt);
		return -1;
	}
	if (check_overlap(w) < 0)
		return -1;
	if ((r = mkdir_p(o->local)) < 0) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: cannot create: %s\n", o->local, strerror(-r));
		return -1;
	}
	if (stat(o->local, &st) < 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: not a directory\n", o->local);
		return -1;
	}
	/* The daemon leaves its working directory ("/") when it detaches:
	 * relative paths must be made absolute now. */
	if (!realpath(o->local, w->local_abs)) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: %s\n", o->local, strerror(errno));
		return -1;
	}
	if (check_store_owner(w->local_abs) < 0)
		return -1;
	if (!realpath(o->mnt, w->mnt_abs)) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: %s\n", o->mnt, strerror(errno));
		return -1;
	}
	o->local = w->local_abs;
	o->mnt = w->mnt_abs;
	return 0;
}
