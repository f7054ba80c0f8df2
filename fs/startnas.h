/* startnas.h - NAS_HUB at start-up: looked at with a deadline, and, when
 * it does not answer, the mount's root taken from LOCAL_STORE's record.
 *
 * No NAS gate exists yet (its threads would not survive fuse_daemonize's
 * fork), so the start's NAS calls are made on a thread of their own and
 * waited for nas_timeout at most.  Messages go to stderr (the daemon has
 * not detached), each naming the path and the reason. */
#ifndef WFS_STARTNAS_H
#define WFS_STARTNAS_H

#include "ns.h"

#include <stddef.h>

struct wfs;
struct nas_check;

/* Look at NAS_HUB and every -o root: 0 with w->roots, the root's entry in
 * *@root and *@empty (NAS_HUB holds no entry: an NFS mount point with no
 * NAS on it, maybe); else -ETIMEDOUT (no answer: the thread is left, its
 * block in w->check_left) or the NAS's -errno, *@what saying where. */
int startnas_check(struct wfs *w, struct ns_entry *root, int *empty, char *what, size_t wsz);

/* Let go of main's hold on the block a late check left (w->check_left);
 * the check's thread frees it if it still runs. */
void startnas_release(struct nas_check *c);

/* Was the record (of @rec_nas) built for this NAS_HUB (as given, or as its
 * canonical path when the NAS answered)? */
int startnas_record_is_of_nas(struct wfs *w, const char *rec_nas);

/* The NAS did not answer (@err; @what says where): w->roots and *@root
 * from LOCAL_STORE's record, if it was built for this NAS_HUB, and a line
 * on stderr saying the mount serves the local revisions meanwhile.  0, or
 * -1 with the reason on stderr. */
int startnas_from_record(struct wfs *w, struct ns_entry *root, const char *what, int err);

#endif
