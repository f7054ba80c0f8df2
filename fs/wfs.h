/* wfs.h - the daemon's context: everything the FUSE operations share. */
#ifndef WFS_DAEMON_H
#define WFS_DAEMON_H

/* 3.12: fuse_session_loop_mt() takes the fuse_loop_cfg_* config (with an
 * older version it reads that config as the 3.2 struct: a thread per request). */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "auto.h"
#include "connabort.h"
#include "control.h"
#include "dirattr.h"
#include "inval.h"
#include "metrics.h"
#include "nasgate.h"
#include "nasclose.h"
#include "record.h"
#include "node.h"
#include "passthrough.h"
#include "uring.h"
#include "store.h"
#include "resolve.h"
#include "ringread.h"

#include <stdarg.h>

enum wfs_log_target { WFS_LOG_STDERR, WFS_LOG_SYSLOG };

struct wfs_opts {
	const char *nas, *local, *mnt;
	char *local_owned; /* -o local= */
	char *extra_roots[HUB_MAX_ROOTS];
	int n_extra_roots;
	int foreground, debug, single_thread;
	double entry_timeout, attr_timeout, negative_timeout, blob_timeout;
	enum wfs_log_target log;
	int log_set;
	unsigned max_threads;
	unsigned nas_timeout_ms;
	unsigned copy_workers;
	unsigned readahead_kb;
	int passthrough;
	int nas_passthrough;
	int fuse_uring;
	int nas_read_ring;   /* a worker reads the NAS on its own io_uring (core/ringread.h) */
	uint64_t promote_bw; /* bytes/s, 0 = unlimited */
	struct policy_opts policy; /* automatic promotion, capacity (core/policy.h) */
	char *metrics_file;  /* -o metrics_file= (absolute) */
	unsigned metrics_interval;
};

/* The listings of directory passes under way (fs/dir.c). */
struct listing;
struct walk_plan;
struct dir_lists {
	pthread_mutex_t lock;
	struct listing *head; /* LOCK: most recently used first */
	unsigned n;           /* LOCK */
	uint32_t last_id;     /* LOCK: the id given last */
	struct walk_plan *plan; /* LOCK: the walk under way (core/walkplan.h) */
	int prefetching;      /* LOCK: workers listing the plan's next directories */
	unsigned tails;       /* LOCK: replies' tails running on threads of their own */
	pthread_cond_t tails_done; /* LOCK: @tails went to 0 */
};

struct wfs {
	/* First: the passthrough hooks get the session's userdata, this. */
	struct passthrough pt;
	struct wfs_opts opt;
	struct hub_roots roots;
	struct node_table nodes;
	struct wfs_fh *open_fhs;   /* nodes.lock: every open not freed (fs/fh.h) */
	struct fuse_session *se;
	int lock_fd;
	int word_fd;                /* the caller's pipe until the daemon serves (fs/detach.h) */
	int store_readonly;        /* LOCAL_STORE's filesystem is read-only (set at start) */
	struct nas_gate gate;      /* NAS calls with deadlines; up or down (core/nasgate.h) */
	struct nas_closer closer;  /* NAS descriptors closed off the workers (core/nasclose.h) */
	struct ringread ringread;  /* a worker's NAS reads on its own io_uring (nas.c) */
	struct record record;      /* local revisions, for when it is down (core/record.h) */
	int gate_inited, record_opened;
	struct store store;
	struct pins pins;          /* ref pins (core/pins.h) */
	struct auto_promoter autop; /* the policy thread (core/auto.h) */
	struct control ctl;
	int store_open, pins_open;
	char local_abs[PATH_MAX], mnt_abs[PATH_MAX];
	struct metrics_writer metrics;
	int pt_warned;
	/* nodes.lock: the kernel refused a backing of this kind for its
	 * filesystem's stack depth (ELOOP: LOCAL_STORE, or the NAS, on
	 * overlayfs or another stacked one): every file there would be */
	uint8_t pt_deep_local, pt_deep_nas;
	/* -o nas_passthrough: the daemon's descriptor of each NAS file it
	 * registered as a backing, by backing id, under nodes.lock (fs/file.c
	 * pt_nas_keep_locked) */
	struct pt_nas_fd {
		int id, fd;
		uint64_t counted; /* its page-cache bytes counted as NAS reads (file.c) */
	} *pt_nas_fds;
	size_t pt_nas_n, pt_nas_cap;
	/* Blobs whose bytes changed, for the kernel to forget (fs/inval.h):
	 * pushed by the store's changed hook, drained by its own thread. */
	struct inval_queue inval;
	uint64_t pt_opens_total;
	struct dir_lists lists;
	/* Listed directories, stat'ed again through the mount (fs/dirattr.h) */
	struct dir_attrs dirattr;
	/* Requests over io_uring, -o fuse_uring (fs/uring.h) */
	struct fuse_uring uring;
	/* The connection mounted, learnt right after the mount: its bdi's
	 * name, and what is aborted at shutdown (fs/connabort.h) */
	struct conn_id conn;
	/* The start-up's look at NAS_HUB, left to its thread past its
	 * deadline (fs/main.c check_nas): main's reference, until released */
	struct nas_check *check_left;
};

/* The backing id an open announces (fs/file.c; for passthrough.c). */
int fh_backing_id(uint64_t fh);

extern const struct fuse_lowlevel_ops wfs_ops;

/* One line per event: the path and the reason. */
void wfs_log(const struct wfs *w, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void wfs_log_open(struct wfs *w);

#endif
