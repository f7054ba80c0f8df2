/* main.c - wfs: mount a NAS hub tree read-only, served through FUSE.
 *
 * Checks everything that can be checked before mounting (so a refusal never
 * leaves a stray mount), takes the LOCAL_STORE lock, mounts, detaches, and
 * lets the caller go only once every thread runs (fs/detach.h), so a
 * script can use the mount on its next line, and a status of 0 means it.
 */
#include "clock.h"
#include "connready.h"
#include "detach.h"
#include "doctor.h"
#include "fh.h"
#include "ops.h"
#include "opts.h"
#include "path.h"
#include "startnas.h"
#include "startpaths.h"
#include "trim.h"
#include "wfs.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

/* One daemon per LOCAL_STORE: an flock held for the daemon's life. */
static int take_lock(struct wfs *w)
{
	char path[PATH_MAX], pid[32];
	int fd;

	snprintf(path, sizeof(path), "%s/wfs.lock", w->opt.local);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	/* A read-only LOCAL_STORE still serves its verified copies: lock what
	 * is there (flock needs no write access), the store itself if need be. */
	if (fd < 0 && errno == EROFS) {
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0 && errno == ENOENT)
			fd = open(w->opt.local, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0)
			w->store_readonly = 1;
	}
	if (fd < 0) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: cannot create lock file: %s\n", w->opt.local,
			strerror(errno));
		return -1;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);

		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		fprintf(stderr, "wfs: LOCAL_STORE %s: in use by another wfs daemon (pid %s, lock %s)\n",
			w->opt.local, *pid ? pid : "?", path);
		close(fd);
		return -1;
	}
	w->lock_fd = fd;
	return 0;
}

static void store_log(void *arg, int prio, const char *msg)
{
	wfs_log(arg, prio, "%s", msg);
}

/* The bytes of a blob may have changed: the kernel must forget its pages.
 * The store calls this holding its lock, and the kernel's invalidation
 * waits for pages that a read in flight holds -- a read that may need the
 * store lock.  So the node id is only queued (fs/inval.h: never blocks);
 * the queue's thread tells the kernel. */
static void store_changed(void *arg, uint64_t ino)
{
	struct wfs *w = arg;

	inval_push(&w->inval, ino);
}

static void notify_inval(void *arg, uint64_t ino)
{
	struct wfs *w = arg;

	fuse_lowlevel_notify_inval_inode(w->se, (fuse_ino_t)ino, 0, 0);
}

/* The queue was full, and which blobs changed is no longer known: every
 * node with a blob forgets its pages, and so does every directory ever
 * listed from the record (fs/dir.c).  Too many invalidations cost only
 * re-reads; a missing one would serve bytes the blob no longer has, or
 * keep the record's names in the kernel once the NAS is back.  Other
 * nodes have nothing to miss.  The ids are collected
 * under the table lock and notified without it (an invalidation waits for
 * readers, which may take that lock); a node forgotten meanwhile is an id
 * the kernel no longer knows (its notice fails) or, reused, one that gets a
 * spurious invalidation -- harmless either way. */
static void notify_inval_all(void *arg)
{
	struct wfs *w = arg;
	struct node_table *t = &w->nodes;
	fuse_ino_t *ids;
	size_t n = 0;

	pthread_mutex_lock(&t->lock);
	ids = malloc((t->nodes.count + 1) * sizeof(*ids));
	if (ids)
		HTAB_EACH(&t->nodes, b, l) {
			struct node *nd = htab_entry(l, struct node, hl);

			if (__atomic_load_n(&nd->blob, __ATOMIC_ACQUIRE) ||
			    __atomic_load_n(&nd->record_listed, __ATOMIC_ACQUIRE))
				ids[n++] = ino_of(w, nd);
		}
	/* the root is in no chain, and is listed from the record in an outage */
	if (ids && __atomic_load_n(&t->root->record_listed, __ATOMIC_ACQUIRE))
		ids[n++] = FUSE_ROOT_ID;
	pthread_mutex_unlock(&t->lock);
	if (!ids) {
		wfs_log(w, LOG_WARNING, "cache invalidations were coalesced, but no memory to "
			"invalidate every blob: a file demoted meanwhile may show stale pages");
		return;
	}
	wfs_log(w, LOG_INFO, "cache invalidations were coalesced: invalidating all %zu blobs "
		"and record-listed directories", n);
	for (size_t i = 0; i < n; i++)
		fuse_lowlevel_notify_inval_inode(w->se, ids[i], 0, 0);
	free(ids);
}

static void write_pid(struct wfs *w)
{
	char pid[32];
	int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());

	if (w->store_readonly)
		return;
	if (ftruncate(w->lock_fd, 0) == 0 && pwrite(w->lock_fd, pid, (size_t)n, 0) < 0)
		wfs_log(w, LOG_WARNING, "cannot write pid to %s/wfs.lock", w->opt.local);
}

/* ---- start-up and shut-down, in the order main() runs them ---- */

static void tune_malloc(void)
{
	/* Each NAS read is answered from a 1 MiB buffer (libfuse copies the
	 * reply through one: a 1 MiB reply does not fit a default-sized pipe,
	 * so it is never spliced).  From mmap'ed chunks every buffer would be
	 * fresh pages to fault in, clear and unmap again -- 40% of the daemon's
	 * CPU per read; from the heap they are reused. */
	mallopt(M_MMAP_THRESHOLD, 16 << 20);
	mallopt(M_TRIM_THRESHOLD, 64 << 20);
	/* Two malloc arenas, not glibc's 8 a core: memory a thread frees stays
	 * in its arena, and READDIRPLUS batches and listings are made on any
	 * worker (the walk's next directories on whichever replied).  After a
	 * 201k-entry walk the daemon kept 64.1-64.4 MiB with an arena a
	 * thread, 55.5 MiB with two (bench.py --only memory).  The threads
	 * mostly wait on the NAS or the kernel, not on malloc's lock. */
	mallopt(M_ARENA_MAX, 2);
}

/* An open through the mount holds one or two descriptors of ours (its NAS
 * file, its local copy): 8 ranks mapping a 160-shard model hold 2600, past
 * the soft limit of a service (1024 under systemd): opens would get EMFILE. */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* The options left for FUSE, checked now by a session made and dropped
 * (libfuse names an unknown one): before LOCAL_STORE is created or opened,
 * not after.  0 or -1. */
static int check_fuse_opts(const struct fuse_args *args)
{
	struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se = NULL;
	int ok = 1;

	for (int i = 0; ok && i < args->argc; i++)
		ok = fuse_opt_add_arg(&copy, args->argv[i]) == 0;
	if (ok)
		se = fuse_session_new(&copy, &wfs_ops, sizeof(wfs_ops), NULL);
	if (se)
		fuse_session_destroy(se);
	else
		fprintf(stderr, ok ? "wfs: bad -o option (see wfs --help)\n" : "wfs: out of memory\n");
	fuse_opt_free_args(&copy);
	return se ? 0 : -1;
}

/* Every option, checked before anything is opened or mounted.  Returns -1
 * to go on, or the exit status (--help, --version: 0; a bad option: 2). */
static int parse_args(struct wfs *w, struct fuse_args *args)
{
	int r = dir_lists_init(&w->lists);

	if (r < 0) {
		fprintf(stderr, "wfs: %s\n", strerror(-r));
		return 1;
	}
	r = opts_parse(&w->opt, args);
	if (r == OPTS_HELP) {
		opts_usage(stdout);
		return 0;
	}
	if (r == OPTS_VERSION) {
		printf("wfs %s (libfuse %s)\n", WFS_VERSION, fuse_pkgversion());
		return 0;
	}
	if (r < 0 || check_fuse_opts(args) < 0)
		return 2;
	if (!w->opt.log_set)
		w->opt.log = w->opt.foreground ? WFS_LOG_STDERR : WFS_LOG_SYSLOG;
	return -1;
}

/* What the start-up learnt of NAS_HUB, from check_start() to open_nas(). */
struct nas_start {
	struct ns_entry *root;
	int empty;                /* NAS_HUB answered, an empty directory */
	int err;                  /* 0, or why the NAS did not answer */
	char what[PATH_MAX + 64]; /* the path that did not */
};

/* NAS_HUB looked at, the paths checked, LOCAL_STORE's lock taken: nothing
 * to undo when this fails.  A NAS that does not answer may be served from
 * LOCAL_STORE's record; one that says no (missing, not a directory, no
 * access) is refused. */
static int check_start(struct wfs *w, struct nas_start *ns)
{
	ns->root = calloc(1, sizeof(*ns->root));
	if (!ns->root)
		return -1;
	ns->err = startnas_check(w, ns->root, &ns->empty, ns->what, sizeof(ns->what));
	if (ns->err < 0 && !nas_cannot_answer(ns->err)) {
		fprintf(stderr, "wfs: %s: %s\n", ns->what,
			ns->err == -ENOTDIR ? "not a directory" : strerror(-ns->err));
	} else if (startpaths_check(w) == 0 && take_lock(w) == 0) {
		return 0;
	}
	free(ns->root);
	return -1;
}

/* LOCAL_STORE's record (and from it the root, when the NAS did not
 * answer), the node table and the NAS gate. */
static int open_nas(struct wfs *w, struct nas_start *ns)
{
	int r;

	r = record_open(&w->record, w->opt.local, w->store_readonly, store_log, w);
	if (r < 0) {
		/* (a damaged record is set aside and opens empty: this is memory) */
		fprintf(stderr, "wfs: LOCAL_STORE %s: cannot open its record: %s\n", w->opt.local,
			strerror(-r));
		free(ns->root);
		return -1;
	}
	w->record_opened = 1;
	/* An empty NAS_HUB the record shows revisions of is a mount point with
	 * no NAS on it (wfs started before the NFS mount): a NAS down, whose
	 * copies are kept (their sources are not "gone"), not a hub emptied. */
	if (ns->err == 0 && ns->empty && record_has_any(&w->record)) {
		char rec_nas[PATH_MAX];

		record_nas(&w->record, rec_nas, sizeof(rec_nas));
		if (startnas_record_is_of_nas(w, rec_nas)) {
			ns->err = -ENOMEDIUM;
			snprintf(ns->what, sizeof(ns->what), "NAS_HUB %s is empty (is the NAS "
				 "mounted?)", w->opt.nas);
		}
	}
	r = ns->err < 0 ? startnas_from_record(w, ns->root, ns->what, ns->err) : 0;
	if (r == 0)
		r = node_table_init(&w->nodes, w->roots.path[0], ns->root);
	free(ns->root);
	if (r == 0 && (r = nas_gate_init(&w->gate, w->roots.path[0], w->opt.nas_timeout_ms,
					 store_log, w)) == 0)
		w->gate_inited = 1;
	if (r < 0) {
		if (r != -1)
			fprintf(stderr, "wfs: NAS_HUB %s: %s\n", w->opt.nas, strerror(-r));
		return -1;
	}
	if ((r = ringread_init(&w->ringread)) < 0) {
		fprintf(stderr, "wfs: cannot set up the NAS reads' rings: %s\n", strerror(-r));
		return -1;
	}
	if (ns->err == -ENOMEDIUM) {
		nas_gate_note(&w->gate, ns->err); /* down until NAS_HUB holds an entry */
	} else if (ns->err < 0) {
		char why[PATH_MAX + 128];

		snprintf(why, sizeof(why), "%s at start-up", strerror(-ns->err));
		nas_gate_set_down(&w->gate, why);
	}
	return 0;
}

/* The invalidator (before the store: opening it may demote copies already),
 * the store and its pins, the metrics file, and what the control socket
 * answers from. */
static int open_store(struct wfs *w, const struct metrics_src *msrc)
{
	struct inval_hooks ih = { .arg = w, .notify = notify_inval,
				  .notify_all = notify_inval_all };
	struct store_opts so = { .workers = w->opt.copy_workers, .bw_limit = w->opt.promote_bw,
				 .policy = &w->opt.policy, .gate = &w->gate, .roots = &w->roots };
	struct store_hooks hooks = { .arg = w, .log = store_log, .changed = store_changed };
	int r = inval_init(&w->inval, 0, &ih);

	if (r == 0)
		r = dir_attrs_init(&w->dirattr, w->mnt_abs, &w->store.dir_attrs_refreshed);
	if (r < 0) {
		fprintf(stderr, "wfs: %s\n", strerror(-r));
		return -1;
	}
	r = store_open(&w->store, w->opt.local, &so, &hooks);
	w->store_open = 1;
	w->nodes.count = &w->store.fs_nodes; /* store_open zeroes the store */
	if (r == 0 && (r = pins_open(&w->pins, &w->store, &w->roots, &w->opt.policy)) == 0)
		w->pins_open = 1;
	if (r < 0) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: %s\n", w->opt.local, strerror(-r));
		return -1;
	}
	if (w->opt.metrics_file && (r = metrics_write_file(msrc, w->opt.metrics_file)) < 0) {
		fprintf(stderr, "wfs: -o metrics_file=%s: cannot write: %s\n", w->opt.metrics_file,
			strerror(-r));
		return -1;
	}
	w->ctl.roots = &w->roots;
	w->ctl.store = &w->store;
	w->ctl.pins = &w->pins;
	w->ctl.gate = &w->gate;
	w->ctl.record = &w->record;
	w->ctl.mount = w->opt.mnt;
	w->ctl.local = w->opt.local;
	w->ctl.owner = getuid();
	/* The record and the index were parsed (65 MB of JSON for 40,000
	 * local files, an entry at a time): what their parse left free,
	 * glibc keeps unless told. */
	heap_give_back();
	return 0;
}

/* "fsname=@path" as one -o option: libfuse splits options at commas and
 * takes a backslash as an escape, so both are escaped (a NAS_HUB path may
 * hold either). */
static void fsname_opt(const char *path, char *out, size_t sz)
{
	size_t n = (size_t)snprintf(out, sz, "fsname=");

	for (; *path && n + 3 < sz; path++) {
		if (*path == ',' || *path == '\\')
			out[n++] = '\\';
		out[n++] = *path;
	}
	out[n] = '\0';
}

/* How far start_session() got, for end_session(). */
enum session_stage { SES_NONE, SES_NEW, SES_SIGNALS, SES_MOUNTED };

/* The FUSE session: made, signals handled, the control socket bound (before
 * we detach, so wfsctl works on the line after wfs), mounted, the INIT hooks
 * in place, detached.  *@stage says how far it got, also on failure. */
static int start_session(struct wfs *w, struct fuse_args *args, int *ctl_bound,
			 enum session_stage *stage)
{
	char fsname[PATH_MAX + 16];
	int r;

	/* Ours first: libfuse takes an option's last value, and a user's -o
	 * fsname= or subtype= comes after. */
	fsname_opt(w->roots.path[0], fsname, sizeof(fsname));
	if (fuse_opt_insert_arg(args, 1, "-o") || fuse_opt_insert_arg(args, 2, fsname) ||
	    fuse_opt_insert_arg(args, 3, "-osubtype=wfs,default_permissions"))
		return -1;
	w->se = fuse_session_new(args, &wfs_ops, sizeof(wfs_ops), w);
	if (!w->se) {
		fprintf(stderr, "wfs: cannot start a FUSE session (bad -o option?)\n");
		return -1;
	}
	*stage = SES_NEW;
	if (fuse_set_signal_handlers(w->se) != 0)
		return -1;
	*stage = SES_SIGNALS;
	if ((r = control_bind(&w->ctl)) < 0 && !(r == -EROFS && w->store_readonly)) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: cannot create the control socket: %s\n",
			w->opt.local, strerror(-r));
		return -1;
	}
	*ctl_bound = r == 0;
	if (fuse_session_mount(w->se, w->opt.mnt) != 0) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: mount failed (is /dev/fuse there? root or "
			"fusermount3 needed)\n", w->opt.mnt);
		return -1;
	}
	*stage = SES_MOUNTED;
	if ((r = conn_find(w->mnt_abs, &w->conn)) < 0)
		wfs_log(w, LOG_WARNING, "%s: the FUSE mount is not in /proc/self/mountinfo (%s): "
			"no read-ahead setting, and no abort of the connection at shutdown",
			w->opt.mnt, strerror(-r));
	w->pt.init_done = connection_ready;
	w->pt.init_done_arg = w;
	if (w->opt.fuse_uring) {
		w->uring = (struct fuse_uring){
			.se = w->se, .devfd = fuse_session_fd(w->se),
			.threads = w->opt.max_threads, .log = store_log, .log_arg = w,
			.requests = &w->store.uring_requests,
			.note_request = passthrough_note_request, .note_arg = &w->pt,
			.keep = &w->ringread,
		};
		w->pt.uring = &w->uring;
	}
	if ((r = passthrough_install(&w->pt, w->se, w->opt.passthrough, fh_backing_id)) < 0) {
		fprintf(stderr, "wfs: cannot install the passthrough hooks: %s\n", strerror(-r));
		return -1;
	}
	/* -o log=stderr in the background keeps the stderr wfs was started
	 * with (2>>FILE) */
	if (!w->opt.foreground &&
	    (r = detach_fork(w->opt.log == WFS_LOG_STDERR, &w->word_fd)) < 0) {
		fprintf(stderr, "wfs: cannot start the daemon in the background: %s\n",
			strerror(-r));
		return -1;
	}
	/* in the child of the fork, the start-up's thread is not */
	if (!w->opt.foreground && w->check_left) {
		free(w->check_left);
		w->check_left = NULL;
	}
	write_pid(w);
	return 0;
}

/* The threads, only now: detach_fork() forks.  Those that only make the
 * mount better (the invalidator, the metrics writer, the link scan) are
 * logged when they cannot start; the NAS gate, promotion, the record and
 * the control socket must, and the caller of wfs is told which did not. */
static int start_threads(struct wfs *w, int ctl_bound, const struct metrics_src *msrc,
			 struct doctor_scan *links)
{
	const char *what = NULL;
	int r;

	r = ringread_probe();
	store_note_route(&w->store, STORE_ROUTE_IO_URING,
			 r == -ENOSYS ? STORE_ROUTE_NOT_OFFERED :
			 r < 0 ? STORE_ROUTE_REFUSED : STORE_ROUTE_ON, r);
	if (r < 0)
		wfs_log(w, LOG_WARNING, "io_uring is not available (%s: a seccomp filter, as a "
			"container's, or the sysctl kernel.io_uring_disabled): NAS reads are handed "
			"to NAS threads and copies made with plain reads and writes -- slower, the "
			"same otherwise", strerror(-r));
	if ((r = inval_start(&w->inval)) < 0)
		wfs_log(w, LOG_WARNING, "cannot start the cache invalidation thread: %s; "
			"demoted files may show stale pages", strerror(-r));
	if ((r = dir_attrs_start(&w->dirattr)) < 0)
		wfs_log(w, LOG_WARNING, "cannot start the directory attribute thread: %s; "
			"a stat after a listing asks the daemon again", strerror(-r));
	if ((r = nas_closer_init(&w->closer)) < 0)
		wfs_log(w, LOG_WARNING, "cannot start the NAS closer thread: %s; NAS files are "
			"closed on the workers, where a hung NAS can hold them", strerror(-r));
	if ((r = nas_gate_start(&w->gate)) < 0)
		what = "the NAS gate's thread";
	else if ((r = store_start(&w->store)) < 0)
		what = "the copy workers";
	else if ((r = record_start(&w->record, &w->roots, &w->store, &w->gate)) < 0)
		what = "the record's thread";
	else if ((r = auto_start(&w->autop, &w->store, &w->roots, &w->opt.policy,
				 &w->pins)) < 0)
		what = "the automatic promotion thread";
	else if (ctl_bound && (r = control_start(&w->ctl)) < 0)
		what = "the control socket's thread";
	if (what) {
		char why[PATH_MAX + 128];

		snprintf(why, sizeof(why), "cannot start %s of LOCAL_STORE %s: %s; not mounted",
			 what, w->opt.local, strerror(-r));
		wfs_log(w, LOG_ERR, "%s", why);
		detach_failed(w->word_fd, why);
		return -1;
	}
	if (!ctl_bound)
		wfs_log(w, LOG_WARNING, "LOCAL_STORE %s is read-only: its verified copies serve, "
			"nothing is promoted, and there is no control socket (wfsctl cannot "
			"reach this mount)", w->opt.local);
	if (w->opt.metrics_file &&
	    (r = metrics_writer_start(&w->metrics, w->opt.metrics_file, w->opt.metrics_interval,
				      msrc)) < 0)
		wfs_log(w, LOG_ERR, "cannot start the metrics writer for %s: %s",
			w->opt.metrics_file, strerror(-r));
	if ((r = doctor_scan_start(links, &w->roots, store_log, w)) < 0)
		wfs_log(w, LOG_WARNING, "cannot start the scan for links leaving NAS_HUB: %s",
			strerror(-r));
	return 0;
}

/* Serve until unmounted or signalled.  Returns the exit status: a stop
 * by SIGTERM, SIGINT or SIGHUP is a clean one (systemctl stop), which
 * libfuse reports as the signal's number; an error as -errno. */
static int serve(struct wfs *w)
{
	struct fuse_loop_config *cfg;
	int ret;

	if (w->opt.single_thread) {
		ret = fuse_session_loop(w->se);
	} else {
		cfg = fuse_loop_cfg_create();
		fuse_loop_cfg_set_max_threads(cfg, w->opt.max_threads);
		ret = fuse_session_loop_mt(w->se, cfg);
		fuse_loop_cfg_destroy(cfg);
	}
	if (ret > 0)
		wfs_log(w, LOG_INFO, "stopping: %s", strsignal(ret));
	return ret < 0 ? 1 : 0;
}

/* The connection ended first: that ends every request waiting for an
 * answer we will not give, a READ whose pages a cache invalidation in
 * flight waits for included -- which a close alone would not do while
 * that notice's write() holds the device (fs/connabort.h).  A stand-in
 * holds the descriptor's number until the invalidator has stopped: its
 * notices fail at once, never land in another file.  The mount gone
 * already (unmounted from outside, or by the forced umount)?  The stand-in
 * is /dev/fuse, which polls POLLERR as an ended device does: libfuse then
 * does not unmount again (a mount made since on that path is not ours). */
static void end_device(struct wfs *w)
{
	struct pollfd dev = { .fd = fuse_session_fd(w->se) };
	char how[256];
	int ended, gone, r = 0;

	if (dev.fd < 0)
		return; /* unmounted already (stop_serving) */
	ended = poll(&dev, 1, 0) == 1 && (dev.revents & POLLERR);
	if (!ended && (r = conn_abort(&w->conn, w->mnt_abs, dev.fd, how, sizeof(how))) < 0)
		wfs_log(w, LOG_INFO, "unmounting %s: cannot abort the FUSE connection (%s): a "
			"cache invalidation waiting for a read may keep the daemon from exiting",
			w->opt.mnt, how);
	else if (!ended)
		wfs_log(w, LOG_DEBUG, "unmounting %s: connection aborted (%s)", w->opt.mnt, how);
	gone = r == 1;
	/* Ended before the stop: unmounted, or aborted from outside (fusectl's
	 * abort), which leaves a mount that answers ENOTCONN -- and refuses
	 * the next wfs there -- unless it is unmounted here. */
	if (ended) {
		gone = !w->conn.known || conn_gone_from(&w->conn, w->mnt_abs);
		if (!gone)
			wfs_log(w, LOG_NOTICE, "unmounting %s: its FUSE connection was aborted from "
				"outside", w->opt.mnt);
	}
	/* libfuse unmounts the path (MNT_DETACH) unless the stand-in says the
	 * connection is gone: never a mount made there since, or on top */
	if (!gone && !ended && conn_gone_from(&w->conn, w->mnt_abs)) {
		wfs_log(w, LOG_INFO, "unmounting %s: another mount is there now (or none): "
			"left as it is", w->opt.mnt);
		gone = 1;
	}
	if ((r = inval_retire_fd(dev.fd, gone ? "/dev/fuse" : "/dev/null")) < 0)
		wfs_log(w, LOG_WARNING, "unmounting %s: no stand-in for the FUSE device: %s",
			w->opt.mnt, strerror(-r));
	else
		inval_stop(&w->inval);
	fuse_session_unmount(w->se);
	inval_stop(&w->inval);
}

/* The session's opens are gone: their NAS files closed, or @left of them
 * still closing in a NAS that does not answer. */
static void closing_said(struct wfs *w, unsigned left)
{
	if (left)
		wfs_log(w, LOG_WARNING, "%u NAS files still closing at exit (the NAS does not "
			"answer): left to the kernel", left);
}

/* After serving: the order matters.  The parts whose threads may be in a
 * NAS call (stopby.h) are all told first -- one may wait for another's stop
 * (a wfsctl sync for the record's build) -- then joined by one deadline,
 * nas_timeout from here.  Returns 0, or -ETIMEDOUT when a thread was left
 * behind: the index is written, the store held (store_leave), main() exits. */
static int stop_serving(struct wfs *w, struct doctor_scan *links)
{
	int64_t by;
	int left = 0;

	wfs_log(w, LOG_INFO, "unmounting %s", w->opt.mnt);
	end_device(w);
	/* The rings' threads end; closing the rings drops their hold on the
	 * device, which ends the requests still queued for them. */
	uring_stop(&w->uring);
	dir_tails_wait(&w->lists); /* they note directories, read the store */
	dir_attrs_stop(&w->dirattr); /* its stat in flight, if any, fails now */
	fh_free_left(w); /* no request comes now */
	by = mono_ms() + w->opt.nas_timeout_ms;
	control_stop_tell(&w->ctl);
	auto_stop_tell(&w->autop);
	doctor_scan_stop_tell(links);
	record_stop_tell(&w->record);
	store_stop_tell(&w->store); /* cancels copies */
	left |= control_stop_by(&w->ctl, by) < 0;
	metrics_writer_stop(&w->metrics); /* reads the store; removes the file */
	left |= auto_stop_by(&w->autop, by) < 0; /* the policy uses the store */
	left |= doctor_scan_stop_by(links, by) < 0;
	left |= record_stop_by(&w->record, by) < 0; /* its thread reads the store */
	left |= store_stop_by(&w->store, by) < 0;
	closing_said(w, nas_closer_stop_by(&w->closer, by));
	if (left) {
		store_leave(&w->store);
		wfs_log(w, LOG_INFO, "exiting without the threads still running (in a NAS call, "
			"or a long local re-hash of wfsctl verify --full)");
		return -ETIMEDOUT;
	}
	control_stop(&w->ctl);
	record_close(&w->record);
	w->record_opened = 0;
	store_close(&w->store); /* writes the index */
	w->store_open = 0;
	return 0;
}

static void end_session(struct wfs *w, enum session_stage stage)
{
	if (stage >= SES_MOUNTED) {
		end_device(w); /* once unmounted, nothing more */
		uring_stop(&w->uring);
		dir_tails_wait(&w->lists);
		dir_attrs_stop(&w->dirattr);
	}
	if (stage >= SES_SIGNALS)
		fuse_remove_signal_handlers(w->se);
	if (stage >= SES_NEW)
		fuse_session_destroy(w->se);
	passthrough_free(&w->pt);
}

/* What open_nas() and open_store() made, however far they got (every stop
 * and close here is a no-op on what was never started; a failed
 * check_start() made nothing, and leaves a running daemon's metrics file
 * alone). */
static void close_state(struct wfs *w, struct doctor_scan *links)
{
	doctor_scan_stop(links); /* it logs through w */
	control_stop(&w->ctl);
	metrics_writer_stop(&w->metrics); /* removes the file */
	if (w->opt.metrics_file)
		unlink(w->opt.metrics_file); /* the start-up check may have written it */
	auto_stop(&w->autop);
	if (w->record_opened)
		record_close(&w->record);
	if (w->store_open)
		store_close(&w->store);
	if (w->gate_inited)
		nas_gate_destroy(&w->gate); /* after the store: its copies report to it */
	/* (stop_serving stopped it, when the daemon got that far) */
	closing_said(w, nas_closer_stop_by(&w->closer, mono_ms()));
	if (w->pins_open)
		pins_close(&w->pins);
	inval_destroy(&w->inval); /* after the store: its close may still report */
	node_table_destroy(&w->nodes);
	free(w->pt_nas_fds); /* (each backing's descriptor goes with the process) */
}

int main(int argc, char **argv)
{
	struct wfs w = {0};
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct doctor_scan links = {0}; /* links leaving NAS_HUB, counted at start-up */
	struct metrics_src msrc = { .store = &w.store, .gate = &w.gate, .record = &w.record };
	enum session_stage stage = SES_NONE;
	struct nas_start ns;
	int ret, ctl_bound = 0;

	/* before any file is opened: else the lock or the control socket
	 * could take 0-2, which the daemon points at /dev/null (detach.h) */
	if (std_fds_open() < 0)
		return 1;
	tune_malloc();
	raise_fd_limit();
	opts_init(&w.opt);
	w.lock_fd = -1;
	w.word_fd = -1;
	ret = parse_args(&w, &args);
	if (ret < 0) {
		ret = 1;
		wfs_log_open(&w); /* the store's start-up lines come first */
		if (check_start(&w, &ns) == 0) {
			if (open_nas(&w, &ns) == 0 && open_store(&w, &msrc) == 0 &&
			    start_session(&w, &args, &ctl_bound, &stage) == 0 &&
			    start_threads(&w, ctl_bound, &msrc, &links) == 0) {
				detach_ready(&w.word_fd);
				ret = serve(&w);
				if (stop_serving(&w, &links) < 0) {
					end_session(&w, stage); /* nothing else is freed */
					exit(ret);
				}
			}
			end_session(&w, stage);
			close_state(&w, &links);
		}
	}
	if (w.check_left)
		startnas_release(w.check_left);
	dir_lists_destroy(&w.lists);
	fuse_opt_free_args(&args);
	opts_free(&w.opt);
	if (w.lock_fd >= 0)
		close(w.lock_fd);
	/* Last, the FUSE workers gone: the buffers of reads still hung in the
	 * NAS, which the kernel may write yet -- freed with no allocation
	 * after that could be given their memory. */
	ringread_fini(&w.ringread);
	return ret;
}
