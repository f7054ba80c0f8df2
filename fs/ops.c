/* ops.c - the FUSE low-level operations: a read-only view of the NAS hub.
 *
 * Lookup classifies a name with ns_classify() and hands the kernel a node;
 * reads are sent straight from the backing file descriptor (spliced where
 * libfuse can), and the NAS pages are dropped behind us so the page cache
 * holds the file once (in the FUSE inode), not twice.
 */
#include "wfs.h"
#include "ops.h"
#include "nas.h"
#include "path.h"
#include "trim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <time.h>
#include <syslog.h>
#include <unistd.h>

#define XATTR_STATE "user.wfs.state"
#define XATTR_ID "user.wfs.id"
#define XATTR_SOCKET "user.wfs.socket" /* on the root: how wfsctl finds us */
#define XATTR_DAEMON_READS "user.wfs.daemon_reads" /* READ requests we served */
#define XATTR_PASSTHROUGH "user.wfs.passthrough"   /* opens the kernel serves */

struct wfs *W(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

struct node *N(struct wfs *w, fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? w->nodes.root : (struct node *)(uintptr_t)ino;
}

fuse_ino_t ino_of(struct wfs *w, struct node *n)
{
	return n == w->nodes.root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static void init(void *data, struct fuse_conn_info *conn)
{
	struct wfs *w = data;

	/* Send file data from the backing fd without copying it through us. */
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (conn->capable & FUSE_CAP_SPLICE_MOVE)
		conn->want |= FUSE_CAP_SPLICE_MOVE;
	/* Let the kernel keep several large reads in flight. */
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	/* Always READDIRPLUS: "auto" uses it for a directory's first batch
	 * only, and a walk then pays one LOOKUP round trip per later entry. */
	if (conn->capable & FUSE_CAP_READDIRPLUS) {
		conn->want |= FUSE_CAP_READDIRPLUS;
		conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
	}
	/* (canonical paths: the daemon has left the directory they were
	 * given relative to; max_readahead is INIT's cap in bytes, the
	 * read-ahead itself is readahead_kb's, set once mounted) */
	wfs_log(w, LOG_INFO, "mounted %s on %s (FUSE INIT: max_write %u, max_readahead %u bytes)",
		w->roots.n ? w->roots.path[0] : w->opt.nas, w->opt.mnt, conn->max_write,
		conn->max_readahead);
}

/* A content-addressed blob never changes, so the kernel may cache it long;
 * everything else (refs, snapshot listings) must follow the NAS closely. */
static double timeout_for(struct wfs *w, struct node *n, int attr)
{
	const char *id = __atomic_load_n(&n->blob_id, __ATOMIC_ACQUIRE);

	if (n->kind == NS_FILE && id && hub_id_kind(id) != HUB_ID_NONE)
		return w->opt.blob_timeout;
	return attr ? w->opt.attr_timeout : w->opt.entry_timeout;
}

static void fill_entry(struct wfs *w, struct node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino_of(w, n);
	e->generation = 1;
	node_attr(&w->nodes, n, &e->attr);
	e->attr_timeout = timeout_for(w, n, 1);
	e->entry_timeout = timeout_for(w, n, 0);
}

/* A name inside a snapshot ("<repo>/snapshots/<commit>/<path>") never
 * changes what it is: the commit fixes its link text, so the kernel may
 * keep the name, and a link's attributes, as long as a blob's.  Saves a
 * walk the revalidation of every entry once entry_timeout has passed.  A
 * directory's attributes stay short (its listing is cached until its
 * mtime is seen to change, and a download adds files to it), and so do a
 * plain file's: huggingface_hub without links writes the file itself
 * there, and its size seen while it was written would be kept a minute
 * (a reader's mmap cut short).  A file named by its content address has
 * the long time anyway (timeout_for). */
static void stable_entry(struct wfs *w, const char *rel, enum ns_kind kind,
			 struct fuse_entry_param *e)
{
	if (!hub_is_snapshot_name(rel))
		return;
	if (e->entry_timeout < w->opt.blob_timeout)
		e->entry_timeout = w->opt.blob_timeout;
	if (kind == NS_LINK && e->attr_timeout < w->opt.blob_timeout)
		e->attr_timeout = w->opt.blob_timeout;
}

/* The NAS cannot answer: a name of a local revision is answered from the
 * record; any other gets EIO (not ENOENT: it may well exist). */
static int lookup_from_record(struct wfs *w, struct node *parent, const char *name,
			      const char *rel, struct fuse_entry_param *e)
{
	struct record_entry *re = malloc(sizeof(*re));
	struct node *n;
	int r;

	if (!re)
		return -ENOMEM;
	r = record_entry_for(w, rel, re);
	if (r == 0) {
		n = node_get(&w->nodes, parent, name, &re->e, hub_holds_weights(rel));
		if (!n)
			r = -errno;
		else
			fill_entry(w, n, e);
	}
	free(re);
	return r;
}

/* The name @rel in @parent as the NAS classified it (@r: 0 with @ent, or
 * its -errno): take a lookup reference.  The record answers when the NAS
 * could not. */
int lookup_classified(struct wfs *w, struct node *parent, const char *name, const char *rel,
		      int r, const struct ns_entry *ent, struct fuse_entry_param *e)
{
	struct node *n = NULL;

	if (r == 0)
		r = nas_dangling_or(w, rel, ent);
	if (NAS_CANNOT_ANSWER(r) || r == -ENOLINK)
		return lookup_from_record(w, parent, name, rel, e);
	if (r == 0 && ent->kind == NS_LINK && ent->link_state != NS_LINK_RESOLVED)
		wfs_log(w, LOG_DEBUG, "link %s shown as is: %s", rel,
			ns_link_state_name(ent->link_state));
	if (r == 0) {
		n = node_get(&w->nodes, parent, name, ent, hub_holds_weights(rel));
		if (!n)
			r = -errno;
		else
			fill_entry(w, n, e);
	}
	if (r == 0)
		stable_entry(w, rel, ent->kind, e);
	/* A file that has a blob already: a changed source is noticed here.
	 * Others get theirs when first opened or asked about (node_blob), so a
	 * walk over a large hub does not build one per file. */
	if (r == 0 && ent->kind == NS_FILE && __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE))
		store_blob(&w->store, ent->backing, &ent->st, ent->blob_id);
	return r;
}

/* Classify parent/name and take a lookup reference. */
int do_lookup(struct wfs *w, struct node *parent, const char *name,
		     struct fuse_entry_param *e)
{
	char prel[PATH_MAX], rel[PATH_MAX];
	struct ns_entry *ent;
	int r;

	if (parent->kind != NS_DIR)
		return -ENOTDIR;
	if (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -ENOENT;
	r = node_path(parent, prel, sizeof(prel));
	if (r == 0)
		r = path_join(prel, name, rel, sizeof(rel));
	if (r < 0)
		return r;
	ent = malloc(sizeof(*ent));
	if (!ent)
		return -ENOMEM;
	r = lookup_classified(w, parent, name, rel, nas_classify(w, rel, ent), ent, e);
	free(ent);
	return r;
}

/* A file shown only under names that hold no weights, whose blob the
 * store has all the same: a repo's blobs/<id> whose way to it crosses a
 * directory others cannot search is shown as a link (ns.c
 * present_closed), and the kernel reaches the file by its own name (a
 * hub-level store's).  Such a file is copied when a promote walks its
 * repo, and from then on read as the blob (not auto-promoted: its reads
 * never come by a weight name). */
static struct blob *node_weights_known(struct wfs *w, struct node *n)
{
	char backing[PATH_MAX];
	struct blob *b;

	node_backing(&w->nodes, n, backing, sizeof(backing));
	b = *backing ? store_find(&w->store, backing) : NULL;
	if (b)
		__atomic_store_n(&n->weights, 1, __ATOMIC_RELEASE);
	return b;
}

struct blob *node_blob(struct wfs *w, struct node *n)
{
	struct blob *b = __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE);
	char backing[PATH_MAX];
	const char *id;
	struct stat st;

	if (b || n->kind != NS_FILE)
		return b;
	/* A ref, a marker, a client's file: never copied.  A NAS file with a
	 * name under a repo's blobs/ or snapshots/ is, whatever name it was
	 * first seen by (a hub-level blob store walked first, say); so is one
	 * a promote found through such a name's link (node_weights_known). */
	if (!__atomic_load_n(&n->weights, __ATOMIC_ACQUIRE) && !node_weights_known(w, n))
		return NULL;
	node_backing(&w->nodes, n, backing, sizeof(backing));
	id = __atomic_load_n(&n->blob_id, __ATOMIC_ACQUIRE);
	node_attr(&w->nodes, n, &st);
	b = store_blob(&w->store, backing, &st, id ? id : "");
	if (b) {
		blob_set_fs_ino(b, ino_of(w, n));
		__atomic_store_n(&n->blob, b, __ATOMIC_RELEASE);
	}
	return b;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct wfs *w = W(req);
	struct fuse_entry_param e;
	int r = do_lookup(w, N(w, parent), name, &e);

	if (r == -ENOENT) {
		/* A negative entry, cached briefly: new revisions on the NAS
		 * must show up within negative_timeout. */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = w->opt.negative_timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_entry(req, &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct wfs *w = W(req);

	node_forget(&w->nodes, N(w, ino), nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *f)
{
	struct wfs *w = W(req);

	for (size_t i = 0; i < count; i++)
		node_forget(&w->nodes, N(w, f[i].ino), f[i].nlookup);
	fuse_reply_none(req);
	/* The kernel dropping many inodes at once (memory pressure, a cache
	 * drop): give the freed nodes' memory back. */
	if (count >= 256)
		heap_give_back();
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	struct stat st;
	char path[PATH_MAX];
	double ttl = timeout_for(w, n, 1), left;
	int r, changed = 0;
	(void)fi;

	/* Attributes read less than their timeout ago (by a READDIRPLUS, a
	 * lookup) stand for the rest of it: the kernel could have kept them
	 * that long, and asks again only because a read marked the atime
	 * stale, which we never show changing.  No second NAS stat, and a
	 * reply with no NAS thread in its way. */
	if (n->kind != NS_LINK && ttl > 0 &&
	    node_attr_fresh(&w->nodes, n, ttl, &st, &left) == 0) {
		fuse_reply_attr(req, &st, left);
		return;
	}
	/* Refresh from the NAS: a file's size or mtime may change there. */
	if (n->kind != NS_LINK) {
		struct blob *b = __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE);

		if (n->kind == NS_FILE) {
			node_backing(&w->nodes, n, path, sizeof(path));
		} else {
			char rel[PATH_MAX];

			node_path(n, rel, sizeof(rel));
			path_join(w->roots.path[0], rel, path, sizeof(path));
		}
		/* No link is followed (nas_stat).  A link swapped in for the
		 * name (another type of file) or for a directory above it: the
		 * name is not this node any more -- stale, so that the kernel
		 * looks it up again.  The NAS cannot answer: the attributes
		 * last presented stand. */
		r = nas_stat(w, path, &st);
		if (r == 0) {
			pthread_mutex_lock(&w->nodes.lock);
			changed = (st.st_mode & S_IFMT) != (n->st.mode & S_IFMT);
			if (!changed)
				node_set_stat_locked(n, &st);
			pthread_mutex_unlock(&w->nodes.lock);
		}
		if (changed || r == -ELOOP || r == -ENOTDIR) {
			wfs_log(w, LOG_WARNING, "getattr %s: %s on the NAS now: stale", path,
				!changed ? "a link or a file on its path"
					 : S_ISLNK(st.st_mode) ? "a link" : "another type of file");
			fuse_reply_err(req, ESTALE);
			return;
		}
		/* New NAS attributes make the blob re-check its source. */
		if (r == 0 && n->kind == NS_FILE && b)
			store_source_attrs(&w->store, b, &st);
	}
	node_attr(&w->nodes, n, &st);
	fuse_reply_attr(req, &st, timeout_for(w, n, 1));
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	char buf[PATH_MAX];

	if (n->kind != NS_LINK) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	node_target(&w->nodes, n, buf, sizeof(buf));
	fuse_reply_readlink(req, buf);
}

/* ---- extended attributes: where a file is served from ---- */

/* The blob of @n if the store has one; never a new one: ls -l asks every
 * entry for security.selinux and the ACLs, and a blob made for each stayed
 * in the store's table for the mount's life. */
static struct blob *node_blob_known(struct wfs *w, struct node *n)
{
	struct blob *b = __atomic_load_n(&n->blob, __ATOMIC_ACQUIRE);
	char backing[PATH_MAX];

	if (b)
		return b;
	if (!__atomic_load_n(&n->weights, __ATOMIC_ACQUIRE))
		return n->kind == NS_FILE ? node_weights_known(w, n) : NULL;
	node_backing(&w->nodes, n, backing, sizeof(backing));
	return *backing ? store_find(&w->store, backing) : NULL;
}

static int xattr_value(struct wfs *w, struct node *n, const char *name, char *buf, size_t sz)
{
	const char *id = __atomic_load_n(&n->blob_id, __ATOMIC_ACQUIRE);

	if (n == w->nodes.root && !strcmp(name, XATTR_SOCKET))
		return snprintf(buf, sz, "%s", w->ctl.sock_path);
	if (n->kind != NS_FILE)
		return -ENODATA;
	if (!strcmp(name, XATTR_STATE)) {
		struct blob *b = node_blob_known(w, n);
		struct blob_info in;

		if (!b)
			return snprintf(buf, sz, "%s", blob_state_name(BLOB_NAS));
		blob_info(&w->store, b, &in);
		return snprintf(buf, sz, "%s", blob_info_state_name(&in));
	}
	if (!strcmp(name, XATTR_ID) && id)
		return snprintf(buf, sz, "%s", id);
	/* How reads are served: proof, for tests and operators, that the
	 * kernel reads a local copy itself. */
	if (!strcmp(name, XATTR_DAEMON_READS))
		return snprintf(buf, sz, "%llu", (unsigned long long)__atomic_load_n(
					&n->daemon_reads, __ATOMIC_RELAXED));
	if (!strcmp(name, XATTR_PASSTHROUGH)) {
		int k;

		pthread_mutex_lock(&w->nodes.lock);
		k = n->pt_opens;
		pthread_mutex_unlock(&w->nodes.lock);
		return snprintf(buf, sz, "%d", k);
	}
	return -ENODATA;
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct wfs *w = W(req);
	char val[PATH_MAX];
	int len = xattr_value(w, N(w, ino), name, val, sizeof(val));

	if (len < 0)
		fuse_reply_err(req, -len);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)len);
	else if ((size_t)len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, val, (size_t)len);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct wfs *w = W(req);
	struct node *n = N(w, ino);
	char list[64];
	size_t len = 0;

	if (n == w->nodes.root) {
		memcpy(list, XATTR_SOCKET, sizeof(XATTR_SOCKET));
		len = sizeof(XATTR_SOCKET);
	} else if (n->kind == NS_FILE) {
		memcpy(list, XATTR_STATE, sizeof(XATTR_STATE));
		len = sizeof(XATTR_STATE);
		if (__atomic_load_n(&n->blob_id, __ATOMIC_ACQUIRE)) {
			memcpy(list + len, XATTR_ID, sizeof(XATTR_ID));
			len += sizeof(XATTR_ID);
		}
	}
	if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, list, len);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct wfs *w = W(req);
	struct statvfs sv;
	(void)ino;

	int r = nas_statvfs(w, &sv);

	/* df must not hang on a NAS that does not answer: LOCAL_STORE's
	 * figures then (what is served meanwhile lives there). */
	if (NAS_CANNOT_ANSWER(r))
		r = statvfs(w->opt.local, &sv) < 0 ? -errno : 0;
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_statfs(req, &sv);
}

const struct fuse_lowlevel_ops wfs_ops = {
	.init = init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.readlink = op_readlink,
	.open = op_open,
	.read = op_read,
	.release = op_release,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.statfs = op_statfs,
	.setattr = op_setattr,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.create = op_create,
	.write_buf = op_write_buf,
	.setxattr = op_setxattr,
	.removexattr = op_removexattr,
	.fallocate = op_fallocate,
};
