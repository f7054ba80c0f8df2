/* connready.c - see connready.h. */
#include "connready.h"
#include "metrics.h"
#include "wfs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>

/* The connection's read-ahead, past the 128 KiB the kernel caps a FUSE
 * mount at during INIT (large sequential reads of weights want more: a
 * cold mmap of a NAS blob read at about half the speed with 128), set
 * through sysfs -- the only way there is, and one a container's read-only
 * /sys refuses: then the warning names the file an operator can write from
 * outside, and stats shows the value in effect (core/metrics.c reads it).
 * Called right after the INIT reply is written (the kernel has applied it
 * then), on a FUSE worker.  The bdi is named by the connection's device,
 * learnt from /proc/self/mountinfo right after the mount (fs/connabort.h),
 * never by a stat() of the mount point, which would hold the mount busy
 * against an umount racing start-up.  A failure is logged before stats can
 * show it, so that a stats reply naming it means the line is written. */
static void raise_readahead(struct wfs *w)
{
	struct store_readahead ra = { .want_kb = w->opt.readahead_kb };
	uint64_t now = 0;
	FILE *f;

	if (!w->conn.known) {
		if (!ra.want_kb)
			return;
		ra.err = -ENOENT;
		wfs_log(w, LOG_WARNING, "cannot set read-ahead of %s: its connection is not in "
			"/proc/self/mountinfo; the kernel's stays", w->opt.mnt);
		store_note_readahead(&w->store, &ra);
		return;
	}
	snprintf(ra.path, sizeof(ra.path), "/sys/class/bdi/%u:%u/read_ahead_kb", w->conn.major,
		 w->conn.minor);
	if (!ra.want_kb) { /* -o readahead_kb=0: the kernel's, only shown */
		store_note_readahead(&w->store, &ra);
		return;
	}
	f = fopen(ra.path, "we");
	if (!f)
		ra.err = -errno;
	else {
		int bad;

		errno = 0;
		bad = fprintf(f, "%u\n", ra.want_kb) < 0;
		bad |= fclose(f) != 0; /* (the write is made here) */
		if (bad)
			ra.err = errno ? -errno : -EIO;
	}
	if (!ra.err) {
		store_note_readahead(&w->store, &ra);
		wfs_log(w, LOG_DEBUG, "read-ahead of %s set to %u KiB", w->opt.mnt, ra.want_kb);
		return;
	}
	if (metrics_readahead_now(ra.path, &now) < 0)
		now = 0;
	wfs_log(w, LOG_WARNING, "read-ahead of %s stays %" PRIu64 " KiB, not the %u asked: cannot "
		"write %s: %s; sequential reads through the mount are slower until %u is written "
		"there (from outside, if /sys is read-only here)", w->opt.mnt, now, ra.want_kb,
		ra.path, strerror(-ra.err), ra.want_kb);
	store_note_readahead(&w->store, &ra);
}

/* The INIT reply is written and applied: the connection's settings are
 * final.  Runs on the FUSE worker that answered INIT. */
void connection_ready(void *arg)
{
	struct wfs *w = arg;
	size_t payload;
	int r, offered;

	raise_readahead(w);
	pthread_mutex_lock(&w->pt.lock);
	payload = w->pt.uring_payload;
	r = w->pt.uring_error;
	offered = w->pt.offered;
	pthread_mutex_unlock(&w->pt.lock);
	/* (a backing file refused already, by an open that raced this, stays
	 * refused: store_note_route) */
	store_note_route(&w->store, STORE_ROUTE_PASSTHROUGH,
			 !w->pt.wanted ? STORE_ROUTE_OFF :
			 !offered ? STORE_ROUTE_NOT_OFFERED : STORE_ROUTE_ON, 0);
	store_note_route(&w->store, STORE_ROUTE_FUSE_URING,
			 !w->opt.fuse_uring ? STORE_ROUTE_OFF :
			 r < 0 ? STORE_ROUTE_REFUSED :
			 !payload ? STORE_ROUTE_NOT_OFFERED : STORE_ROUTE_ON, r);
	if (!w->opt.fuse_uring)
		return;
	if (r < 0)
		wfs_log(w, LOG_WARNING, "%s: FUSE over io_uring not asked for: its rings cannot be "
			"made (%s): requests go through /dev/fuse", w->opt.mnt, strerror(-r));
	else if (!payload)
		wfs_log(w, LOG_WARNING, "%s: the kernel does not offer FUSE over io_uring "
			"(kernel >= 6.14 with /sys/module/fuse/parameters/enable_uring set is "
			"needed): requests go through /dev/fuse", w->opt.mnt);
	else
		uring_start(&w->uring);
}
