/* ops.h - the FUSE operations, one concern a file (as overlayfs does):
 * ops.c lookup, attributes and xattrs; file.c open/read; dir.c listings;
 * refuse.c the writes that get EROFS.  Internal to fs/. */
#ifndef WFS_OPS_H
#define WFS_OPS_H

#include "wfs.h"

struct wfs *W(fuse_req_t req);
struct node *N(struct wfs *w, fuse_ino_t ino);
fuse_ino_t ino_of(struct wfs *w, struct node *n);
/* The node's blob, made on first need (NULL for non-files or ENOMEM). */
struct blob *node_blob(struct wfs *w, struct node *n);
/* A name classified already (@r: 0 or the NAS's -errno, or one that says
 * it could not answer: then the record's): take a lookup reference. */
int lookup_classified(struct wfs *w, struct node *parent, const char *name, const char *rel,
		      int r, const struct ns_entry *ent, struct fuse_entry_param *e);
/* Classify parent/name and take a lookup reference. */
int do_lookup(struct wfs *w, struct node *parent, const char *name, struct fuse_entry_param *e);

void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
/* dir.c: the listing table of struct wfs (0 or -errno; destroy it either
 * way), freed at the end. */
int dir_lists_init(struct dir_lists *ls);
void dir_lists_destroy(struct dir_lists *ls);
/* dir.c: wait for the replies' tails still running on threads of their
 * own (over io_uring): after the rings stopped, before what they use goes. */
void dir_tails_wait(struct dir_lists *ls);
void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int to_set, struct fuse_file_info *fi);
void op_mknod(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m, dev_t d);
void op_mkdir(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m);
void op_unlink(fuse_req_t req, fuse_ino_t p, const char *name);
void op_rmdir(fuse_req_t req, fuse_ino_t p, const char *name);
void op_symlink(fuse_req_t req, const char *link, fuse_ino_t p, const char *name);
void op_rename(fuse_req_t req, fuse_ino_t p, const char *name, fuse_ino_t np, const char *nn, unsigned int flags);
void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t np, const char *nn);
void op_create(fuse_req_t req, fuse_ino_t p, const char *name, mode_t m, struct fuse_file_info *fi);
void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off, struct fuse_file_info *fi);
void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags);
void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);
void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi);

#endif
