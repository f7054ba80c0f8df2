/* rw.c - faultfs --rw: the regular files that exist in SRC may be written,
 * truncated, fallocated and synced -- what a loop device needs of its
 * backing file (an ext4 image whose bad sectors are `eio` ranges) -- and
 * nothing else changes: a create, mknod, mkdir, link, symlink, unlink,
 * rmdir, rename, chmod, chown, utimes or xattr change fails with EROFS.
 * Every operation passes the gate first, as reads do; eio ranges fail
 * reads only, and a write remaps the bytes it covers: reads of them
 * succeed after it (a disk remaps a bad sector when it is written). */

#include "faultfs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static void rw_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	size_t done = 0;

	GATE(req);
	while (done < size) {
		ssize_t n = pwrite((int)fi->fh, buf + done, size - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			if (done == 0) {
				fuse_reply_err(req, errno);
				return;
			}
			break; /* a short write, as pwrite's own */
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	if (done) {
		dev_t dev;
		ino_t sino;

		node_id(ino, &dev, &sino);
		eio_written(dev, sino, (uint64_t)off, done);
	}
	pthread_mutex_lock(&g.lock);
	g.writes++;
	g.write_bytes += done;
	pthread_mutex_unlock(&g.lock);
	fuse_reply_write(req, done);
}

static void rw_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	GATE(req);
	fuse_reply_err(req, (datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh)) < 0 ? errno : 0);
}

/* Each close(2) of an open: nothing is buffered here (the descriptor
 * closes at RELEASE), but the fault in force holds for it too. */
static void rw_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	GATE(req);
	fuse_reply_err(req, 0);
}

/* A loop device's discard and write-zeroes arrive as these (punch hole,
 * zero range). */
static void rw_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	(void)ino;
	GATE(req);
	fuse_reply_err(req, fallocate((int)fi->fh, mode, off, len) < 0 ? errno : 0);
}

/* truncate(2), ftruncate(2), open(O_TRUNC) without atomic_o_trunc: a new
 * size, with the times the kernel sets with it.  Any other change of
 * attributes is refused. */
static void rw_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	const int with_size = FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW |
			      FUSE_SET_ATTR_CTIME | FUSE_SET_ATTR_KILL_SUID | FUSE_SET_ATTR_KILL_SGID;
	struct stat st;
	int fd, r;

	GATE(req);
	if (!(to_set & FUSE_SET_ATTR_SIZE) || (to_set & ~with_size)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if ((r = stat_fd(node_fd(ino), &st)) < 0 || !S_ISREG(st.st_mode)) {
		fuse_reply_err(req, r < 0 ? -r : EROFS);
		return;
	}
	fd = fi ? (int)fi->fh : node_reopen(ino, O_WRONLY);
	if (fd < 0) {
		fuse_reply_err(req, -fd);
		return;
	}
	r = ftruncate(fd, attr->st_size) < 0 ? -errno : 0;
	if (!fi)
		close(fd);
	if (r == 0)
		r = stat_fd(node_fd(ino), &st);
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_attr(req, &st, 0);
}

/* ---- what --rw still refuses: the tree itself never changes */

static void rw_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	(void)parent, (void)name, (void)mode, (void)rdev;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	(void)parent, (void)name, (void)mode;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)parent, (void)name;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	(void)link, (void)parent, (void)name;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	(void)parent, (void)name, (void)newparent, (void)newname, (void)flags;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	(void)ino, (void)newparent, (void)newname;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	(void)parent, (void)name, (void)mode, (void)fi;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	(void)ino, (void)name, (void)value, (void)size, (void)flags;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

static void rw_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)ino, (void)name;
	GATE(req);
	fuse_reply_err(req, EROFS);
}

void rw_ops(struct fuse_lowlevel_ops *ops)
{
	ops->write = rw_write;
	ops->fsync = rw_fsync;
	ops->flush = rw_flush;
	ops->fallocate = rw_fallocate;
	ops->setattr = rw_setattr;
	ops->mknod = rw_mknod;
	ops->mkdir = rw_mkdir;
	ops->unlink = rw_unlink;
	ops->rmdir = rw_unlink;
	ops->symlink = rw_symlink;
	ops->rename = rw_rename;
	ops->link = rw_link;
	ops->create = rw_create;
	ops->setxattr = rw_setxattr;
	ops->removexattr = rw_removexattr;
}
