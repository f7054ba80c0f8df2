/* refuse.c - everything that would write gets EROFS, with a log line. */
#include "wfs.h"
#include "ops.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>


static void refuse(fuse_req_t req, fuse_ino_t parent, const char *name, const char *what)
{
	struct wfs *w = W(req);
	char rel[PATH_MAX], full[PATH_MAX];

	node_path(N(w, parent), rel, sizeof(rel));
	if (name)
		path_join(rel, name, full, sizeof(full));
	else
		snprintf(full, sizeof(full), "%s", rel);
	wfs_log(w, LOG_NOTICE, "refused %s of %s: read-only filesystem", what,
		*full ? full : "/");
	fuse_reply_err(req, EROFS);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int to_set,
		       struct fuse_file_info *fi)
{
	(void)a; (void)to_set; (void)fi;
	refuse(req, ino, NULL, "setattr");
}

void op_mknod(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m, dev_t d)
{
	(void)m; (void)d;
	refuse(req, p, name, "mknod");
}

void op_mkdir(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m)
{
	(void)m;
	refuse(req, p, name, "mkdir");
}

void op_unlink(fuse_req_t req, fuse_ino_t p, const char *name)
{
	refuse(req, p, name, "unlink");
}

void op_rmdir(fuse_req_t req, fuse_ino_t p, const char *name)
{
	refuse(req, p, name, "rmdir");
}

void op_symlink(fuse_req_t req, const char *link, fuse_ino_t p, const char *name)
{
	(void)link;
	refuse(req, p, name, "symlink");
}

void op_rename(fuse_req_t req, fuse_ino_t p, const char *name, fuse_ino_t np,
		      const char *nn, unsigned int flags)
{
	(void)np; (void)nn; (void)flags;
	refuse(req, p, name, "rename");
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t np, const char *nn)
{
	(void)ino;
	refuse(req, np, nn, "link");
}

void op_create(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m,
		      struct fuse_file_info *fi)
{
	(void)m; (void)fi;
	refuse(req, p, name, "create");
}

void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
			 struct fuse_file_info *fi)
{
	(void)bufv; (void)off; (void)fi;
	refuse(req, ino, NULL, "write");
}

void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	(void)name; (void)value; (void)size; (void)flags;
	refuse(req, ino, NULL, "setxattr");
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	(void)name;
	refuse(req, ino, NULL, "removexattr");
}

void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	(void)mode; (void)off; (void)len; (void)fi;
	refuse(req, ino, NULL, "fallocate");
}

