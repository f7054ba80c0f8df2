/* dir.c - directory listings, taken whole at opendir so offsets are stable. */
#include "wfs.h"
#include "ops.h"
#include "path.h"
#include "nasopen.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>
#include <dirent.h>


struct dir_entry {
	char *name;
	ino_t nas_ino;
	unsigned char nas_type;
};

/* Filled by opendir before the open is answered, read-only after (every
 * readdir of the handle comes after that reply). */
struct dir_handle {
	struct dir_entry *ents;
	size_t n;
	char rel[PATH_MAX];
};

static void dir_free(struct dir_handle *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->ents[i].name);
	free(d->ents);
	free(d);
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	struct dir_handle *d;
	char path[PATH_MAX];
	struct dirent *de;
	size_t cap = 0;
	DIR *dp;

	if (n->kind != NS_DIR) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	node_path(n, d->rel, sizeof(d->rel));
	path_join(w->roots.path[0], d->rel, path, sizeof(path));
	/* no link followed in any component (a parent swapped for a link) */
	dp = nas_opendir(&w->roots, path);
	if (!dp) {
		int err = errno;

		wfs_log(w, LOG_WARNING, "opendir %s: %s", path, strerror(err));
		free(d);
		fuse_reply_err(req, err);
		return;
	}
	/* Take the whole listing now, so offsets stay stable for this handle. */
	while ((de = readdir(dp))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (d->n == cap) {
			struct dir_entry *ne;

			cap = cap ? cap * 2 : 64;
			ne = realloc(d->ents, cap * sizeof(*ne));
			if (!ne)
				break;
			d->ents = ne;
		}
		d->ents[d->n].name = strdup(de->d_name);
		if (!d->ents[d->n].name)
			break;
		d->ents[d->n].nas_type = de->d_type;
		d->ents[d->n].nas_ino = de->d_ino ? de->d_ino : 1;
		d->n++;
	}
	closedir(dp);
	fi->fh = (uint64_t)(uintptr_t)d;
	/* The kernel may keep the listing; it drops it when the directory's
	 * mtime changes, which it sees within attr_timeout. */
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	if (fuse_reply_open(req, fi) == -ENOENT)
		dir_free(d);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, int plus)
{
	struct wfs *w = W(req);
	struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;
	struct node *dn = N(w, ino);
	char *buf = calloc(1, size), rel[PATH_MAX];
	struct ns_entry *ent = malloc(sizeof(*ent));
	size_t used = 0;
	uint64_t dot_ino = node_serial(&w->nodes, dn);

	if (!buf || !ent) {
		free(buf);
		free(ent);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* Offsets: 1 is ".", 2 is "..", 2 + i + 1 is entry i. */
	for (off_t i = off; i < (off_t)d->n + 2; i++) {
		struct fuse_entry_param e;
		struct stat st = {0};
		const char *name;
		struct node *n = NULL;
		size_t sz;

		memset(&e, 0, sizeof(e));
		if (i < 2) {
			name = i == 0 ? "." : "..";
			st.st_mode = S_IFDIR;
			st.st_ino = i == 0 ? dot_ino : 1; /* ".." is not ours to know */
			e.attr = st;
		} else {
			const struct dir_entry *de = &d->ents[i - 2];

			name = de->name;
			/* glibc hides entries whose d_ino is 0. */
			st.st_ino = de->nas_ino;
			if (path_join(d->rel, name, rel, sizeof(rel)) < 0)
				continue;
			if (!plus && (de->nas_type == DT_DIR || de->nas_type == DT_REG)) {
				st.st_mode = DTTOIF(de->nas_type);
			} else if (plus) {
				if (do_lookup(w, dn, name, &e) < 0)
					continue; /* hidden or vanished */
				n = N(w, e.ino);
				st = e.attr;
			} else {
				if (ns_classify(&w->roots, rel, ent) < 0)
					continue;
				st.st_mode = ent->st.st_mode & S_IFMT;
				st.st_ino = ent->st.st_ino;
			}
		}
		if (plus)
			sz = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, i + 1);
		else
			sz = fuse_add_direntry(req, buf + used, size - used, name, &st, i + 1);
		if (sz > size - used) {
			if (n)
				node_forget(&w->nodes, n, 1); /* not sent: undo the lookup */
			break;
		}
		used += sz;
	}
	wfs_log(w, LOG_DEBUG, "readdir%s %s off %lld size %zu: %zu bytes", plus ? "plus" : "",
		d->rel, (long long)off, size, used);
	fuse_reply_buf(req, buf, used);
	free(buf);
	free(ent);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	dir_free((struct dir_handle *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

