/* connabort.h - the daemon ends its own FUSE connection at shutdown.
 *
 * Closing /dev/fuse's last descriptor is how the kernel learns the daemon
 * is gone: the release aborts the connection, which ends every request
 * still waiting for an answer.  But a thread inside a write() to the
 * device holds a reference of its own to the file, and the release waits
 * for it.  A cache invalidation notice (fs/inval.h) is such a write, and
 * it waits for every locked page of its inode -- a page stays locked while
 * a READ of it waits for an answer.  At SIGTERM libfuse stops its idle
 * workers, so a READ still queued in the kernel is never read: the notice
 * waits for it, the close releases nothing, and the daemon waits for the
 * notice forever, its thread in D state (not even SIGKILL ends it).
 *
 * So the connection is aborted explicitly before the daemon waits for the
 * invalidation thread.  The abort ends the same requests the release
 * would have ended (the release of the last device is an abort); the
 * READ's pages unlock, the notice returns, the daemon exits.
 *
 * The connection is named by the FUSE superblock's device ("0:N" in
 * /proc/self/mountinfo), learnt right after the mount: at shutdown the
 * mount point must not be stat'ed (that would be a request to a daemon
 * that no longer answers).
 */
#ifndef WFS_CONNABORT_H
#define WFS_CONNABORT_H

#include <stddef.h>

struct conn_id {
	unsigned major, minor; /* the superblock's device: the bdi's and fusectl's name */
	int known;             /* found in mountinfo at mount time */
};

/* The FUSE connection mounted at @mnt (absolute, as mounted): the newest
 * FUSE mount on that path in /proc/self/mountinfo.  Never stat()s @mnt.
 * Returns 0, -ENOENT (no FUSE mount there) or -errno. */
int conn_find(const char *mnt, struct conn_id *c);

/* Abort the connection @c mounted at @mnt; @devfd is the session's
 * /dev/fuse descriptor, which polls POLLERR once the connection is ended
 * (that is how success is told).  Two kernel ways, in this order:
 *  - fusectl's /sys/fs/fuse/connections/<dev>/abort, when fusectl is
 *    mounted there (its files belong to the mount's owner: also for a
 *    daemon that is not root).  The mount stays: the caller unmounts.
 *  - umount2(@mnt, MNT_FORCE), root only: the kernel aborts the
 *    connection first (fuse_umount_begin), then unmounts unless the mount
 *    is busy (open files: EBUSY, the abort done all the same).  Tried
 *    only while the newest mount on @mnt is still @c (never a mount
 *    stacked on it since).
 * Returns 1 (aborted and unmounted), 0 (aborted, still mounted) or -errno
 * (not aborted: -EPERM, a daemon that is not root without fusectl).
 * *@how (@howsz bytes) says which way was taken or why none worked. */
int conn_abort(const struct conn_id *c, const char *mnt, int devfd, char *how, size_t howsz);

/* Is @mnt's newest mount now another than @c (or none at all): lazily
 * unmounted while busy and mounted again, or something mounted on top of
 * it?  Then an unmount of @mnt would detach that other mount, and the
 * caller must leave @mnt alone.  1 yes, 0 no or cannot tell (@c not
 * known, mountinfo unreadable). */
int conn_gone_from(const struct conn_id *c, const char *mnt);

#endif
