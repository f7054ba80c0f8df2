/* doctor.h - what is wrong with the NAS tree, as the mount sees it: links
 * that dangle, loop or leave NAS_HUB (shown as links, never followed), and
 * blobs flagged by verification.  Read-only; for `wfsctl doctor`. */
#ifndef WFS_DOCTOR_H
#define WFS_DOCTOR_H

#include "resolve.h"
#include "store.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

/* Walk @rel ("" for the whole hub) and build the reply object; an error
 * reply when @rel is not there or its walk failed. */
json_t *doctor_reply(const struct hub_roots *roots, struct store *s, const char *rel);

/* At mount: links under the repos' blobs/ and snapshots/ that lead outside
 * NAS_HUB (and every root=) are shown as links, and a site that keeps its
 * blob store beside the hub sees none of its weights.  The scan counts
 * them and logs one line naming how many and the directories they lead
 * into, with the -o root=DIR that would serve them (a line also when there
 * are none).  On a thread of its own, so the mount is not delayed; at most
 * DOCTOR_SCAN_MAX entries are looked at. */
#define DOCTOR_SCAN_MAX 200000
struct doctor_scan {
	const struct hub_roots *roots;
	void (*log)(void *arg, int prio, const char *msg);
	void *arg;
	atomic_int stop;
	int started;
	pthread_t thread;
};

/* Start the scan of @roots (which must outlive doctor_scan_stop); @log gets
 * the line (from the scan's thread).  Returns 0 or -errno. */
int doctor_scan_start(struct doctor_scan *d, const struct hub_roots *roots,
		      void (*log)(void *arg, int prio, const char *msg), void *arg);

/* Stop the scan (it ends at its next entry) and wait for its thread.  Safe
 * on a zeroed struct, and twice. */
void doctor_scan_stop(struct doctor_scan *d);
/* The same, joined until @deadline_ms (stopby.h): 0, or -ETIMEDOUT when
 * the scan is left in a NAS call (@d and @roots must then stay). */
int doctor_scan_stop_by(struct doctor_scan *d, int64_t deadline_ms);
/* Its first step alone: told to stop, not joined. */
void doctor_scan_stop_tell(struct doctor_scan *d);

#endif
