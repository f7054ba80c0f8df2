/* startpaths.h - the paths of the command line, checked at start-up
 * before anything is created or mounted. */
#ifndef WFS_STARTPATHS_H
#define WFS_STARTPATHS_H

#include <stddef.h>

struct wfs;

/* MOUNTPOINT (a directory, not a mount point, apart from NAS_HUB) and
 * LOCAL_STORE (created, not under MOUNTPOINT), both made absolute in
 * w->opt: the daemon leaves its working directory when it detaches.
 * NAS_HUB is looked at before (w->roots, when it answered).  0, or -1
 * with the reason on stderr, naming the path. */
int startpaths_check(struct wfs *w);

/* @p made absolute and normalised without asking the filesystem.  0 or
 * -errno. */
int abs_lexical(const char *p, char *out, size_t sz);

#endif
