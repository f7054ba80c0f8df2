/* connready.c - see connready.h. */
#include "connready.h"
#include "wfs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>

/* A path field of /proc/self/mountinfo as the path it is: the kernel
 * writes space, tab, newline and backslash as octal escapes (\040). */
static char *mountinfo_unescape(char *s)
{
	char *out = s;

	for (const char *p = s; *p; out++) {
		if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
		    p[3] >= '0' && p[3] <= '7') {
			*out = (char)((p[1] - '0') << 6 | (p[2] - '0') << 3 | (p[3] - '0'));
			p += 4;
		} else {
			*out = *p++;
		}
	}
	*out = '\0';
	return s;
}

/* The connection's read-ahead, past the 128 KiB the kernel caps a FUSE
 * mount at during INIT (large sequential reads of weights want more), set
 * through sysfs.  Called right after the INIT reply is written (the kernel
 * has applied it then), on a FUSE worker: the mount is found in
 * /proc/self/mountinfo by its path, never by a stat() of the mount point,
 * which would hold the mount busy against an umount racing start-up. */
static void raise_readahead(void *arg)
{
	struct wfs *w = arg;
	unsigned maj = 0, min = 0, m1, m2;
	char line[4096], path[128];
	FILE *f = fopen("/proc/self/mountinfo", "r");
	int found = 0;

	while (f && fgets(line, sizeof(line), f)) {
		char point[PATH_MAX];

		/* the last match is the newest mount on that path: ours */
		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &m1, &m2, point) == 3 &&
		    !strcmp(mountinfo_unescape(point), w->mnt_abs) && strstr(line, " - fuse")) {
			maj = m1;
			min = m2;
			found = 1;
		}
	}
	if (f)
		fclose(f);
	if (!found) {
		wfs_log(w, LOG_INFO, "cannot set read-ahead of %s: not found in /proc/self/mountinfo",
			w->opt.mnt);
		return;
	}
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
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
	int r;

	if (w->opt.readahead_kb)
		raise_readahead(w);
	pthread_mutex_lock(&w->pt.lock);
	payload = w->pt.uring_payload;
	pthread_mutex_unlock(&w->pt.lock);
	if (!w->opt.fuse_uring)
		return;
	if (!payload) {
		wfs_log(w, LOG_WARNING, "%s: the kernel does not offer FUSE over io_uring "
			"(kernel >= 6.14 with /sys/module/fuse/parameters/enable_uring set is "
			"needed): requests go through /dev/fuse", w->opt.mnt);
		return;
	}
	if ((r = uring_start(&w->uring, payload)) < 0)
		wfs_log(w, LOG_WARNING, "%s: FUSE over io_uring not started: %s", w->opt.mnt,
			strerror(-r));
}
