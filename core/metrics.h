/* metrics.h - the store's counters and gauges, and the NAS's state (up or
 * down, nasgate.h) and the local record's size, for operators: as a JSON
 * object (wfsctl stats --json), as Prometheus text exposition format 0.0.4
 * (wfsctl stats --prometheus), and as a node-exporter textfile rewritten
 * atomically every few seconds (wfs -o metrics_file=PATH).
 *
 * Counters count since the daemon started (Prometheus treats a restart as
 * a counter reset).  Knows nothing of FUSE: the daemon's own counters
 * (passthrough opens) live in struct store, where the daemon adds to them.
 */
#ifndef WFS_METRICS_H
#define WFS_METRICS_H

#include "nasgate.h"
#include "store.h"

struct record;

#include <jansson.h>
#include <pthread.h>

/* What the figures are read from: the store, and the NAS gate and the
 * local record (each may be NULL: tools, tests, a read-only store). */
struct metrics_src {
	struct store *store;
	struct nas_gate *gate;
	struct record *record;
};

/* The NAS's state and the local record's size: in "status" and "stats"
 * alike (README.md "Control protocol"). */
struct metrics_nas {
	struct nas_gate_stats gate;     /* without a gate: up, since 0, all 0 */
	unsigned timeout_ms;            /* the gate's deadline; 0: no gate */
	int recorded;                   /* a local record is kept */
	uint64_t record_files, record_entries;
	int64_t record_built;           /* CLOCK_REALTIME s of its last good build; 0: none */
	uint64_t record_builds, record_looks; /* struct record's built_gen, looks */
};

/* Label values of wfs_promotions_failed_total{reason=...}, by enum store_fail. */
extern const char *const metrics_fail_reason[STORE_FAIL_N];
/* Names of the routes (wfs_route_on{route=...}, stats "routes"), by enum
 * store_route, and of their states, by enum store_route_state. */
extern const char *const metrics_route_name[STORE_ROUTES];
extern const char *const metrics_route_state[STORE_ROUTE_STATES];

struct metrics {
	uint64_t served_local_bytes, served_nas_bytes;
	uint64_t opens, passthrough_opens;
	uint64_t listed_ahead, listed_ahead_taken, dir_attrs_refreshed, uring_requests;
	uint64_t nas_reads_ring, nas_reads_handed;
	/* by enum store_route: 1 when ON; the state and a refusal's -errno */
	uint64_t route_on[STORE_ROUTES];
	int route_state[STORE_ROUTES], route_err[STORE_ROUTES];
	/* the mount's read-ahead: in effect now (KiB; known: its file read),
	 * and what the daemon asked and how (struct store_readahead) */
	uint64_t readahead_kb, readahead_bytes;
	int readahead_known;
	struct store_readahead readahead;
	uint64_t fs_nodes;
	uint64_t promotions_started, promotions_verified, promotions_cancelled;
	uint64_t promotions_failed;             /* sum of failed_by */
	uint64_t failed_by[STORE_FAIL_N];
	uint64_t mismatches, demotions, evictions;
	uint64_t auto_queued, held_no_room, held_excluded;
	uint64_t store_blobs, store_bytes, free_bytes;
	uint64_t limit, floor, reserved, pinned_bytes;
	uint64_t queued, copying;
	uint64_t blobs_by_state[BLOB_NSTATES];
	uint64_t index_writes;
	uint64_t blobs_known;
	uint64_t retries;            /* failed copies the store queued again (its backoff) */
	uint64_t local_read_errors;  /* reads of local copies that failed: demoted */
	/* partial copies (store.h): files, bytes of their verified ranges,
	 * bytes read from them, ranges copied and failed, bytes copied */
	uint64_t part_files, part_bytes, part_read_bytes, part_copied, part_failed;
	uint64_t part_copied_bytes;
	struct metrics_nas nas;
};

/* The read-ahead in KiB the kernel has now, from @path (struct
 * store_readahead's: the bdi's read_ahead_kb).  0 or -errno. */
int metrics_readahead_now(const char *path, uint64_t *kb);

/* One consistent reading of the store (takes its lock briefly), the gate
 * and the record (their locks, briefly; never the NAS itself). */
void metrics_collect(const struct metrics_src *src, struct metrics *m);

/* Just the NAS's state and the record's size (status: it reads the store
 * itself). */
void metrics_collect_nas(struct nas_gate *g, struct record *r, struct metrics_nas *out);
/* The "nas" object of status and stats: {"state":"up"|"down","since",
 * "outages","timeouts","failed_down","from_record","stuck","reason",
 * "timeout_ms"} (new reference, NULL on ENOMEM) */
json_t *metrics_nas_json(const struct metrics_nas *n);
/* {"kept","files","entries","built"} (new reference, NULL on ENOMEM) */
json_t *metrics_record_json(const struct metrics_nas *n);
/* The refs the record shows at another revision than the NAS names while
 * the NAS is down (record.h): [{"path","shows","nas"}] (new reference;
 * NULL on ENOMEM).  @r may be NULL: []. */
json_t *metrics_refs_held_json(struct record *r);

/* Prometheus text exposition format: malloc'ed, NUL-terminated, ends with
 * a newline.  NULL only on ENOMEM. */
char *metrics_prometheus(const struct metrics *m);

/* The same figures as a JSON object (new reference; NULL on ENOMEM). */
json_t *metrics_json(const struct metrics *m);

/* The control server's reply to {"op":"stats"} (optionally with
 * "prometheus":true, which adds the text as "prometheus"):
 * {"ok":true,"metrics":{...},"prometheus":"..."}.  NULL on ENOMEM. */
json_t *metrics_reply(const struct metrics_src *src, const json_t *req);

/* Write the Prometheus text to @path atomically: a temporary file in the
 * same directory ("<path>.<pid>.tmp", which node-exporter's *.prom glob
 * skips), mode 0644, renamed over @path.  Returns 0 or -errno. */
int metrics_write_file(const struct metrics_src *src, const char *path);

/* A thread that calls metrics_write_file() every @interval_s seconds (first
 * at once).  Failures are logged through the store's log hook, once until
 * the next success.  _stop wakes it, joins it and removes @path (a stopped
 * daemon's figures must not look current: alert on absent(wfs_info)).
 * _start returns 0 or -errno; _stop is safe on a writer never started. */
struct metrics_writer {
	struct metrics_src src;     /* set before the thread starts, then read-only */
	char *path;
	unsigned interval_s;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;        /* with @lock; CLOCK_MONOTONIC */
	int stop, running;          /* stop: @lock; running: the owner thread only */
	int last_err;               /* the writer thread only */
};

int metrics_writer_start(struct metrics_writer *mw, const char *path, unsigned interval_s,
			 const struct metrics_src *src);
void metrics_writer_stop(struct metrics_writer *mw);

#endif
