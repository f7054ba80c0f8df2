/* connready.c - see connready.h. */
#include "connready.h"
#include "wfs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>

/* The connection's read-ahead, past the 128 KiB the kernel caps a FUSE
 * mount at during INIT (large sequential reads of weights want more), set
 * through sysfs.  Called right after the INIT reply is written (the kernel
 * has applied it then), on a FUSE worker.  The bdi is named by the
 * connection's device, learnt from /proc/self/mountinfo right after the
 * mount (fs/connabort.h), never by a stat() of the mount point, which
 * would hold the mount busy against an umount racing start-up. */
static void raise_readahead(void *arg)
{
	struct wfs *w = arg;
	char path[128];
	FILE *f;

	if (!w->conn.known) {
		wfs_log(w, LOG_INFO, "cannot set read-ahead of %s: not found in /proc/self/mountinfo",
			w->opt.mnt);
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", w->conn.major,
		 w->conn.minor);
	f = fopen(path, "w");
	if (!f || fprintf(f, "%u\n", w->opt.readahead_kb) < 0 || fclose(f) != 0)
		wfs_log(w, LOG_INFO, "cannot set read-ahead of %s via %s: %s", w->opt.mnt, path,
			strerror(errno));
	else
		wfs_log(w, LOG_DEBUG, "read-ahead of %s set to %u KiB", w->opt.mnt,
			w->opt.readahead_kb);
}

/* The INIT reply is written and applied: the connection's settings are
 * final.  Runs on the FUSE worker that answered INIT. */
void connection_ready(void *arg)
{
	struct wfs *w = arg;
	size_t payload;
	int r, offered;

	if (w->opt.readahead_kb)
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
