/* nasgate.h - NAS calls with a deadline, and whether the NAS is up.
 *
 * A hung NFS server blocks a system call in the kernel, uninterruptibly;
 * a FUSE worker blocked so takes its reader with it, and when every
 * worker is, the whole mount -- local copies included -- stops answering.
 * So every NAS call made for a FUSE request runs here instead: on one of
 * a bounded set of NAS threads, while the caller waits at most the
 * deadline (nas_timeout).  A call that passes its deadline goes on, on its
 * thread, as long as the NAS keeps it; the caller has its answer already.
 * The deadline is the NAS's: it runs from when a NAS thread takes the
 * call.  A call that waits nas_timeout for a thread is given up too, and
 * says the NAS is down only if no thread ended a call (or got answers in a
 * call of many operations) meanwhile; with the threads answering others
 * all along, the NAS is slow and busy, not down
 * (-EBUSY: a burst of more calls than threads on a NAS answering each
 * within its deadline must not take it for an outage).
 *
 * Down and up: a call that passes its deadline, or fails with an error
 * that means the NAS itself is unreachable (nas_gate_unavailable), marks
 * the NAS down; while it is down calls fail at once with -EHOSTDOWN,
 * without touching it.  EIO or ESTALE say that of the NAS only if its root
 * says so too: they ask the prober to look now.  The prober is one thread
 * of its own: while the NAS is down it stats NAS_HUB (with the same
 * deadline), at 100 ms, then backing off to 2 s; the first answer marks it
 * up.  At most NAS_GATE_THREADS calls are stuck at once: with all of them
 * stuck, calls fail at once (-EHOSTDOWN) and the NAS is down.  A NAS not
 * mounted answers through its mount point, an empty directory: callers
 * that find NAS_HUB so where they expected a file report -ENOMEDIUM
 * (nas_root_gone), which marks it down until the prober finds an entry.
 *
 * Knows nothing of FUSE; the store and the fs glue use it.
 */
#ifndef WFS_NASGATE_H
#define WFS_NASGATE_H

#include "peeras.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Enough for the FUSE workers' concurrent reads (the kernel keeps up to
 * max_background in flight, but a NAS read waits on the disk, not on us)
 * and few enough that a hung NAS pins no more than this many threads.
 * More calls at once than this wait for a thread (see above). */
#define NAS_GATE_THREADS 16
/* nas_timeout: the default, and the most a user may choose.  A healthy NFS
 * server answers in milliseconds; a cold read of 1 MiB from a busy one in
 * tens.  1 s is 10x a bad but working NAS and short enough that a reader of
 * a local revision does not notice an outage; above 2 s an engine's own
 * watchdogs start to fire. */
#define NAS_GATE_TIMEOUT_MS 1000
#define NAS_GATE_TIMEOUT_MAX_MS 2000
#define NAS_GATE_PROBE_MIN_MS 100
#define NAS_GATE_PROBE_MAX_MS 2000 /* a stat and a statfs: cheap for any NAS */

/* What a caller asks a NAS thread to do: @fn(@arg), returning 0 or -errno.
 * @arg belongs to the gate from nas_call until it returns; if the call
 * passes its deadline, @fn still runs to its end and then @release(@arg)
 * is called on the NAS thread (so @arg must be heap memory then, and hold
 * copies of everything @fn reads). */
struct nas_job;

struct nas_gate_stats {
	int up;                 /* 1: up */
	int64_t since;          /* CLOCK_REALTIME seconds: when it last changed state
				 * (the start, if never) */
	uint64_t outages;       /* times it went down */
	uint64_t timeouts;      /* calls that passed their deadline */
	uint64_t failed_down;   /* calls refused because it was down */
	uint64_t busy;          /* calls given up after nas_timeout waiting for a
				 * NAS thread, the threads answering others
				 * (-EBUSY: not taken for an outage) */
	uint64_t from_record;   /* requests answered from the local record
				 * (counted by the caller, nas_gate_count_record) */
	unsigned stuck;         /* calls past their deadline still running now */
	char reason[128];       /* why it went down last ("" if never) */
};

/* Rules: IMMUTABLE after nas_gate_init; LOCK: under @lock; ATOMIC. */
struct nas_gate {
	pthread_mutex_t lock;
	pthread_cond_t work;      /* LOCK: a job queued, stop */
	pthread_cond_t probe;     /* LOCK: wakes the prober (CLOCK_MONOTONIC) */
	pthread_cond_t changed;   /* LOCK: the state changed, a thread ended (CLOCK_MONOTONIC) */
	char root[4096];          /* IMMUTABLE: what the prober stats */
	unsigned timeout_ms;      /* IMMUTABLE */
	void (*log)(void *arg, int prio, const char *msg); /* IMMUTABLE, may be NULL */
	void *log_arg;            /* IMMUTABLE */
	struct nas_job *qhead, *qtail; /* LOCK: jobs waiting for a thread */
	unsigned threads, idle;   /* LOCK: NAS threads started, waiting for work */
	unsigned queued;          /* LOCK: jobs on the queue */
	unsigned starting;        /* LOCK: threads created that have not taken the lock yet */
	unsigned stuck;           /* LOCK: threads running a job past its deadline */
	uint64_t answered;        /* LOCK: calls the NAS threads have ended, and
				   * a nas_timeout of a call of many operations
				   * that got answers (its caller counts it) */
	int64_t busy_said_ms;     /* LOCK: when a busy call was last logged */
	int stop;                 /* LOCK */
	int probe_now;            /* LOCK: an EIO/ESTALE asked the prober to look */
	int probe_busy;           /* LOCK: a probe is running (maybe stuck) */
	int need_entries;         /* LOCK: down for an empty or missing NAS_HUB
				   * (ENOMEDIUM): up again only once it holds an entry */
	_Atomic int up;           /* ATOMIC: acquire loads on every call */
	int64_t since;            /* LOCK */
	char reason[128];         /* LOCK */
	int started;              /* owner: the prober runs */
	pthread_t prober;
	_Atomic uint64_t outages, timeouts, failed_down, from_record, busy;
	_Atomic uint64_t generation; /* ATOMIC: +1 at every change of state */
};

/* @root: NAS_HUB (may be given before it can be reached).  @timeout_ms 0:
 * NAS_GATE_TIMEOUT_MS.  Starts up; no thread runs until the first call or
 * nas_gate_start.  Returns 0 or -errno. */
int nas_gate_init(struct nas_gate *g, const char *root, unsigned timeout_ms,
		  void (*log)(void *arg, int prio, const char *msg), void *log_arg);
/* Start the prober (after any fork). */
int nas_gate_start(struct nas_gate *g);
/* Stop the prober and the idle NAS threads; threads stuck in the NAS are
 * left to end on their own (they hold only their job). */
void nas_gate_destroy(struct nas_gate *g);

/* Run @fn(@arg) on a NAS thread and wait for it: at most nas_timeout for a
 * thread, and nas_timeout once one has it (the deadline).  Returns what
 * @fn returned, or -ETIMEDOUT (the deadline passed, or no thread ended any
 * call while this one waited for a thread: the NAS is marked down, and
 * @arg is the gate's: @release(@arg) is called when @fn ends, or before
 * nas_call returns if @fn never started), or -EHOSTDOWN (the NAS is down
 * or every NAS thread is stuck: @fn was not run, @release is not called),
 * or -EBUSY (nas_timeout passed with no thread free, the threads ending
 * other calls all along: @fn was not run, @release is not called, the NAS
 * is not marked down).  With @g NULL, @fn runs on the caller's thread (tools,
 * tests).  @fn's own -ETIMEDOUT (a soft NFS mount giving up) is returned
 * as -ENOTCONN, so that -ETIMEDOUT always means the gate owns @arg. */
int nas_call(struct nas_gate *g, int (*fn)(void *arg), void *arg, void (*release)(void *arg));

/* nas_call for a call on a descriptor an earlier call opened (a read):
 * an error meaning unreachable only asks the prober to look, as EIO does.
 * Such a descriptor may be of a mount since gone (a FUSE NAS client
 * restarted, a stale NFS mount replaced) while the NAS path answers
 * again: the caller opens the path afresh, and that call says whether the
 * NAS is down.  A deadline passed marks it down, as for any call. */
int nas_call_on_fd(struct nas_gate *g, int (*fn)(void *arg), void *arg,
		   void (*release)(void *arg));

/* nas_call for a call of many NAS operations (a directory listing, a batch
 * of lookups), where the whole may take longer than the deadline on a NAS
 * that answers every one of them in time (100,000 entries; a loaded
 * server): @fn adds to *@progress after each operation answered, and a
 * deadline that passes with answers since it was set is set again, a
 * nas_timeout on.  So such a call is never taken for a hung NAS while it
 * gets answers, and one that stops getting them returns -ETIMEDOUT within
 * two nas_timeouts of its last answer (the NAS marked down, as nas_call's).
 * A call still waiting for a NAS thread is given up as nas_call's is.
 * @progress lives in @arg (it is read until nas_call_progress returns). */
int nas_call_progress(struct nas_gate *g, int (*fn)(void *arg), void *arg,
		      void (*release)(void *arg), _Atomic uint64_t *progress);

/* A call the caller makes itself, waiting for it at most the deadline by
 * its own means (fs/uring.h: an io_uring read on a ring thread, no hand-off
 * to a NAS thread): nas_gate_admit() first -- 0, or -EHOSTDOWN, refused as
 * nas_call refuses (the NAS is down); then nas_gate_done() with its result,
 * -ETIMEDOUT if it passed the deadline (counted, and the NAS marked down,
 * as nas_call's would be).  Such calls are on descriptors (reads): their
 * other errors are judged as nas_call_on_fd's.  The caller bounds how many
 * of its calls may be stuck at once. */
int nas_gate_admit(struct nas_gate *g);
void nas_gate_done(struct nas_gate *g, int r);

/* Could the NAS not answer (the gate's refusal, a deadline, no thread
 * free in time, an error meaning it is unreachable)?  Then, and only then,
 * may a caller answer from what it kept locally; any other error is the
 * NAS's answer. */
int nas_cannot_answer(int r);
/* Is it up now?  (A hint: it may go down the next instant.)  Lock-free:
 * callable with any lock held. */
int nas_gate_up(struct nas_gate *g);
/* A NAS error seen outside nas_call (a copy worker's read, the sweep):
 * counted as a call's would be (down if unavailable, a probe for EIO). */
void nas_gate_note(struct nas_gate *g, int err);
/* Mark it down now, with a reason (start-up found NAS_HUB unreachable). */
void nas_gate_set_down(struct nas_gate *g, const char *reason);
/* 1 if -@err (@err < 0; 0 for any @err >= 0, a call's result) says the
 * NAS is unreachable rather than that one file is bad:
 * ENOTCONN, ETIMEDOUT, EHOSTDOWN, EHOSTUNREACH, ENETDOWN, ENETUNREACH,
 * ECONNREFUSED, ECONNRESET, ECONNABORTED, ENODEV, ESHUTDOWN; and
 * ENOMEDIUM, this program's own: NAS_HUB is empty or missing while what
 * wfs holds of it says it has entries (nas_root_gone) -- the NAS not
 * mounted, and its mount point seen instead.  That one keeps the NAS down
 * until the prober finds an entry in NAS_HUB. */
int nas_gate_unavailable(int err);
/* Is @root (NAS_HUB) missing or an empty directory?  1 yes, 0 it holds an
 * entry, -errno it could not be read.  A NAS call: made on a NAS thread
 * or a thread of the caller's that may be left stuck. */
int nas_root_gone(const char *root);
/* @err (-errno) of a NAS call on a path under @root ("" when not known;
 * @hub: it is NAS_HUB, else a further root, -o root=DIR): when @err says
 * the path is not there (ENOENT, ENOTDIR) and nothing else in @root is
 * either (nas_root_gone: that filesystem not mounted, its mount point seen
 * instead), -ENOMEDIUM for NAS_HUB (unreachable: nas_gate_unavailable),
 * -ENOLINK for a further root (the gate is not told: its prober looks at
 * NAS_HUB only, which answers); else @err.  A NAS call when it looks. */
int nas_missing_or_gone(const char *root, int hub, int err);
/* What -ENOMEDIUM and -ENOLINK mean, for a reason or a log line. */
#define NAS_GONE_WHY "NAS_HUB is empty or missing (the NAS is not mounted?)"
#define NAS_ROOT_GONE_WHY "its root (-o root=) is empty or missing (not mounted?)"
/* @err (-errno) said for a log line or a reason: the two above, else
 * strerror's. */
const char *nas_err_why(int err);
/* A request was answered from the local record instead of the NAS. */
void nas_gate_count_record(struct nas_gate *g);
void nas_gate_stats(struct nas_gate *g, struct nas_gate_stats *out);
/* Wait until the state generation differs from @gen, at most @timeout_ms;
 * returns the generation now (tests, the record's rebuild). */
uint64_t nas_gate_wait_change(struct nas_gate *g, uint64_t gen, int64_t timeout_ms);

#endif
