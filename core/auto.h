/* auto.h - automatic promotion: the policy thread.
 *
 * What the engine reads from the NAS becomes local by itself: the store
 * hands over blobs its reads made hot (store_wait_hot), and this thread
 * decides -- exclusion globs, the snapshot names of a blob, the sibling
 * shards a loader will read next (policy.c's rules, collect.c's sets) --
 * and queues them at the automatic priority.  Every ref_poll seconds (or
 * when poked) it follows the ref pins (pins_poll).  The walks this needs
 * read NAS directories, so they run here, never in a FUSE thread.  It also
 * hands the store the moments its failed copies are due again
 * (store_retry_due: the backoff, and the NAS gate coming back up).  While
 * the gate says the NAS is down it makes no NAS walk: hot blobs wait
 * (what to do with one depends on names only the NAS has: the exclusion
 * globs), and so do the ref pins; both are dealt with once it is up.
 */
#ifndef WFS_AUTO_H
#define WFS_AUTO_H

#include "pins.h"
#include "policy.h"
#include "resolve.h"
#include "store.h"

#include <pthread.h>
#include <stdatomic.h>

struct auto_promoter {
	struct store *store;          /* IMMUTABLE after auto_start */
	const struct hub_roots *roots; /* NULL: names unknown (no siblings, no globs by
					* snapshot name, no ref pins) */
	const struct policy_opts *policy;
	struct pins *pins;            /* may be NULL */
	pthread_t thread;
	int started;
	_Atomic int stop;
	_Atomic uint64_t handled;     /* hot blobs dealt with (tests wait on it) */
};

/* Start the policy thread (a no-op without a policy and roots). */
int auto_start(struct auto_promoter *a, struct store *s, const struct hub_roots *roots,
	       const struct policy_opts *policy, struct pins *pins);
/* Stop and join it; before store_close. */
void auto_stop(struct auto_promoter *a);
/* The daemon's bounded stop (stopby.h): joined until @deadline_ms, or
 * -ETIMEDOUT: left in a NAS call (a ref pin's listing, a sibling walk),
 * and the store must not be closed after it (store_leave). */
int auto_stop_by(struct auto_promoter *a, int64_t deadline_ms);
/* Its first step alone: told to stop, not joined (control.h: control_stop_tell). */
void auto_stop_tell(struct auto_promoter *a);

#endif
