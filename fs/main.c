/* main.c - wfs: mount a NAS hub tree read-only, served through FUSE.
 *
 * Checks everything that can be checked before mounting (so a refusal never
 * leaves a stray mount), takes the LOCAL_STORE lock, mounts, and only then
 * detaches, so a script can use the mount on its next line.
 */
#include "wfs.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f,
"usage: wfs [-f] [-d] [-o OPT[,OPT...]] NAS_HUB LOCAL_STORE MOUNTPOINT\n"
"       wfs NAS_HUB MOUNTPOINT -o local=LOCAL_STORE[,OPT...]   (mount -t fuse.wfs)\n"
"\n"
"Present the Hugging Face hub cache at NAS_HUB, read-only, at MOUNTPOINT.\n"
"LOCAL_STORE is a directory on local disk owned by wfs (created if missing).\n"
"Without -f, wfs returns once the mount is ready and keeps serving in the\n"
"background.\n"
"\n"
"options:\n"
"  -f                   stay in the foreground (logs to stderr)\n"
"  -d                   debug logging (implies -f)\n"
"  -s                   single-threaded (for debugging)\n"
"  -h, --help           this text\n"
"  -V, --version        print the version\n"
"\n"
"wfs -o options:\n"
"  local=DIR            LOCAL_STORE, for the two-argument (fstab) form\n"
"  root=DIR             a further read-only root that NAS links may resolve\n"
"                       into (repeatable); other links leaving NAS_HUB are\n"
"                       shown as links and never followed\n"
"  entry_timeout=S      kernel cache time of names (default 1)\n"
"  attr_timeout=S       kernel cache time of attributes (default 1)\n"
"  negative_timeout=S   kernel cache time of missing names (default 1)\n"
"  blob_timeout=S       name and attribute cache time of content-addressed\n"
"                       blobs, whose content never changes (default 60)\n"
"  log=stderr|syslog    where log lines go (default: stderr with -f,\n"
"                       syslog in the background)\n"
"  max_threads=N        FUSE worker threads (default 16)\n"
"  copy_workers=N       concurrent promotions (default 2)\n"
"  passthrough=on|off   let the kernel read local copies itself (FUSE\n"
"                       passthrough, kernel >= 6.9; default on, falls back\n"
"                       to daemon-served reads when the kernel refuses)\n"
"  readahead_kb=N       kernel read-ahead of the mount (default 4096; 0 leaves\n"
"                       the kernel's 128)\n"
"  promote_mbps=N       cap on promotion reads from the NAS, MB/s, all copies\n"
"                       together (default 0: no cap)\n"
"  metrics_file=PATH    write Prometheus metrics to PATH (absolute; e.g. a\n"
"                       node-exporter textfile directory's wfs.prom),\n"
"                       replaced atomically; removed at exit\n"
"  metrics_interval=S   how often metrics_file is rewritten (default 15)\n"
	);
	policy_usage(f);
	fprintf(f,
"\n"
"FUSE -o options passed on: allow_other, allow_root, ro, fsname=, subtype=,\n"
"auto_unmount, nosuid, nodev, noatime, ...  fstab-only words (defaults,\n"
"nofail, noauto, auto, user, users, _netdev, x-*) are ignored.\n"
"\n"
"A revision added to the NAS shows up within max(negative_timeout,\n"
"entry_timeout) seconds.  Every write gets EROFS.\n");
}

struct arglist {
	char **v;
	int n;
};

static int arg_add(struct arglist *a, const char *s)
{
	char **nv = realloc(a->v, (size_t)(a->n + 2) * sizeof(*nv));

	if (!nv)
		return -ENOMEM;
	a->v = nv;
	a->v[a->n] = strdup(s);
	if (!a->v[a->n])
		return -ENOMEM;
	a->v[++a->n] = NULL;
	return 0;
}

static int parse_seconds(const char *opt, const char *val, double *out)
{
	char *end;
	double d = strtod(val, &end);

	if (*val == '\0' || *end || d < 0) {
		fprintf(stderr, "wfs: -o %s=%s: not a number of seconds\n", opt, val);
		return -1;
	}
	*out = d;
	return 0;
}

/* Split one -o argument: wfs options are taken, fstab-only words dropped,
 * the rest collected for libfuse. */
static int parse_o(struct wfs_opts *o, char *arg, struct arglist *fuse_o)
{
	static const char *const ignored[] = {
		"defaults", "nofail", "noauto", "auto", "user", "users", "nouser",
		"_netdev", "rw", NULL,
	};
	char *save = NULL;

	for (char *tok = strtok_r(arg, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '=');
		const char *val = eq ? eq + 1 : "";
		size_t klen = eq ? (size_t)(eq - tok) : strlen(tok);
		int skip = 0;

#define KEY(k) (klen == strlen(k) && !strncmp(tok, k, klen))
		for (int i = 0; ignored[i]; i++)
			if (!strcmp(tok, ignored[i]))
				skip = 1;
		if (skip || !strncmp(tok, "x-", 2) || !strncmp(tok, "comment=", 8))
			continue;
		if (KEY("local")) {
			free(o->local_owned);
			o->local = o->local_owned = strdup(val);
		} else if (KEY("root")) {
			if (o->n_extra_roots >= HUB_MAX_ROOTS - 1) {
				fprintf(stderr, "wfs: at most %d root= options\n", HUB_MAX_ROOTS - 1);
				return -1;
			}
			o->extra_roots[o->n_extra_roots++] = strdup(val);
		} else if (KEY("entry_timeout")) {
			if (parse_seconds("entry_timeout", val, &o->entry_timeout))
				return -1;
		} else if (KEY("attr_timeout")) {
			if (parse_seconds("attr_timeout", val, &o->attr_timeout))
				return -1;
		} else if (KEY("negative_timeout")) {
			if (parse_seconds("negative_timeout", val, &o->negative_timeout))
				return -1;
		} else if (KEY("blob_timeout")) {
			if (parse_seconds("blob_timeout", val, &o->blob_timeout))
				return -1;
		} else if (KEY("log")) {
			if (!strcmp(val, "stderr"))
				o->log = WFS_LOG_STDERR;
			else if (!strcmp(val, "syslog"))
				o->log = WFS_LOG_SYSLOG;
			else {
				fprintf(stderr, "wfs: -o log=%s: expected stderr or syslog\n", val);
				return -1;
			}
			o->log_set = 1;
		} else if (KEY("passthrough")) {
			if (!strcmp(val, "on") || !*val)
				o->passthrough = 1;
			else if (!strcmp(val, "off"))
				o->passthrough = 0;
			else {
				fprintf(stderr, "wfs: -o passthrough=%s: expected on or off\n", val);
				return -1;
			}
		} else if (KEY("readahead_kb")) {
			o->readahead_kb = (unsigned)strtoul(val, NULL, 10);
		} else if (KEY("copy_workers")) {
			o->copy_workers = (unsigned)strtoul(val, NULL, 10);
			if (o->copy_workers < 1 || o->copy_workers > 64) {
				fprintf(stderr, "wfs: -o copy_workers=%s: expected 1..64\n", val);
				return -1;
			}
		} else if (KEY("promote_mbps")) {
			char *end;
			double mb = strtod(val, &end);

			if (!*val || *end || mb < 0) {
				fprintf(stderr, "wfs: -o promote_mbps=%s: expected MB/s (0: no cap)\n", val);
				return -1;
			}
			o->promote_bw = (uint64_t)(mb * 1e6);
		} else if (KEY("metrics_file")) {
			if (val[0] != '/') {
				fprintf(stderr, "wfs: -o metrics_file=%s: must be an absolute path\n", val);
				return -1;
			}
			free(o->metrics_file);
			o->metrics_file = strdup(val);
		} else if (KEY("metrics_interval")) {
			char *end;
			unsigned long s = strtoul(val, &end, 10);

			if (!*val || *end || s < 1 || s > 86400) {
				fprintf(stderr, "wfs: -o metrics_interval=%s: expected 1..86400 seconds\n", val);
				return -1;
			}
			o->metrics_interval = (unsigned)s;
		} else if (KEY("max_threads")) {
			o->max_threads = (unsigned)strtoul(val, NULL, 10);
			if (o->max_threads < 1 || o->max_threads > 1024) {
				fprintf(stderr, "wfs: -o max_threads=%s: expected 1..1024\n", val);
				return -1;
			}
		} else {
			char key[64], err[PATH_MAX + 128];
			int pr;

			snprintf(key, sizeof(key), "%.*s", (int)klen, tok);
			pr = policy_parse_opt(&o->policy, key, val, err, sizeof(err));
			if (pr < 0) {
				fprintf(stderr, "wfs: %s\n", err);
				return -1;
			}
			if (pr == 0 && (arg_add(fuse_o, "-o") || arg_add(fuse_o, tok)))
				return -1;
		}
#undef KEY
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct wfs_opts *o, struct arglist *fuse_o)
{
	const char *pos[3];
	int npos = 0;

	for (int i = 1; i < argc; i++) {
		char *a = argv[i];

		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
			printf("wfs %s (libfuse %s)\n", WFS_VERSION, fuse_pkgversion());
			exit(0);
		} else if (!strcmp(a, "-f")) {
			o->foreground = 1;
		} else if (!strcmp(a, "-d")) {
			o->debug = o->foreground = 1;
		} else if (!strcmp(a, "-s")) {
			o->single_thread = 1;
		} else if (!strncmp(a, "-o", 2)) {
			char *val = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);

			if (!val) {
				fprintf(stderr, "wfs: -o needs an argument\n");
				return -1;
			}
			if (parse_o(o, val, fuse_o))
				return -1;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "wfs: unknown option %s (see wfs --help)\n", a);
			return -1;
		} else if (npos < 3) {
			pos[npos++] = a;
		} else {
			fprintf(stderr, "wfs: too many arguments: %s (see wfs --help)\n", a);
			return -1;
		}
	}
	if (npos == 3) {
		if (o->local) {
			fprintf(stderr, "wfs: LOCAL_STORE given twice (argument and -o local=)\n");
			return -1;
		}
		o->nas = pos[0];
		o->local = pos[1];
		o->mnt = pos[2];
	} else if (npos == 2 && o->local) {
		o->nas = pos[0];
		o->mnt = pos[1];
	} else {
		fprintf(stderr, "wfs: expected NAS_HUB LOCAL_STORE MOUNTPOINT (see wfs --help)\n");
		return -1;
	}
	return 0;
}

static int mkdir_p(const char *path)
{
	char buf[PATH_MAX];

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int check_paths(struct wfs *w)
{
	struct wfs_opts *o = &w->opt;
	struct statx stx;
	struct stat st;
	int r;

	if (stat(o->nas, &st) < 0) {
		fprintf(stderr, "wfs: NAS_HUB %s: %s\n", o->nas, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "wfs: NAS_HUB %s: not a directory\n", o->nas);
		return -1;
	}
	if (access(o->nas, R_OK | X_OK) < 0) {
		fprintf(stderr, "wfs: NAS_HUB %s: %s\n", o->nas, strerror(errno));
		return -1;
	}
	if ((r = hub_roots_add(&w->roots, o->nas)) < 0) {
		fprintf(stderr, "wfs: NAS_HUB %s: %s\n", o->nas, strerror(-r));
		return -1;
	}
	for (int i = 0; i < o->n_extra_roots; i++) {
		if ((r = hub_roots_add(&w->roots, o->extra_roots[i])) < 0) {
			fprintf(stderr, "wfs: -o root=%s: %s\n", o->extra_roots[i], strerror(-r));
			return -1;
		}
	}

	if (statx(AT_FDCWD, o->mnt, 0, STATX_TYPE, &stx) < 0) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: %s\n", o->mnt, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(stx.stx_mode)) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: not a directory\n", o->mnt);
		return -1;
	}
	if (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT &&
	    stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: already a mount point (unmount it first)\n",
			o->mnt);
		return -1;
	}

	if ((r = mkdir_p(o->local)) < 0) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: cannot create: %s\n", o->local, strerror(-r));
		return -1;
	}
	if (stat(o->local, &st) < 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: not a directory\n", o->local);
		return -1;
	}
	/* The daemon leaves its working directory ("/") when it detaches:
	 * relative paths must be made absolute now. */
	if (!realpath(o->local, w->local_abs) || !realpath(o->mnt, w->mnt_abs)) {
		fprintf(stderr, "wfs: %s: %s\n", o->local, strerror(errno));
		return -1;
	}
	o->local = w->local_abs;
	o->mnt = w->mnt_abs;
	return 0;
}

/* One daemon per LOCAL_STORE: an flock held for the daemon's life. */
static int take_lock(struct wfs *w)
{
	char path[PATH_MAX], pid[32];
	int fd;

	snprintf(path, sizeof(path), "%s/wfs.lock", w->opt.local);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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

/* The bytes of a blob may have changed: the kernel must forget its pages. */
/* The store calls this holding its lock, and the kernel's invalidation
 * waits for pages that a read in flight holds -- a read that may need the
 * store lock.  So the node id goes through a pipe to a thread of its own. */
static void store_changed(void *arg, uint64_t ino)
{
	struct wfs *w = arg;

	if (w->inval_pipe[1] > 0 && write(w->inval_pipe[1], &ino, sizeof(ino)) != sizeof(ino))
		wfs_log(w, LOG_WARNING, "cannot queue cache invalidation of inode %llu",
			(unsigned long long)ino);
}

static void *invalidator(void *arg)
{
	struct wfs *w = arg;
	uint64_t ino;

	while (read(w->inval_pipe[0], &ino, sizeof(ino)) == sizeof(ino))
		fuse_lowlevel_notify_inval_inode(w->se, (fuse_ino_t)ino, 0, 0);
	return NULL;
}

/* The kernel caps a FUSE mount's read-ahead at 128 KiB during INIT; large
 * sequential reads of weights want more.  Raised through sysfs once the
 * mount answers (stat blocks until INIT is done), from a thread because the
 * answer comes from our own loop. */
static void *raise_readahead(void *arg)
{
	struct wfs *w = arg;
	unsigned maj = 0, min = 0;
	char line[4096], path[128], mnt[PATH_MAX];
	struct stat st;
	FILE *f;
	int found = 0;

	if (stat(w->opt.mnt, &st) < 0 || !realpath(w->opt.mnt, mnt))
		return NULL;
	f = fopen("/proc/self/mountinfo", "r");
	while (f && fgets(line, sizeof(line), f)) {
		char point[PATH_MAX];

		if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &maj, &min, point) == 3 &&
		    !strcmp(point, mnt) && makedev(maj, min) == st.st_dev)
			found = 1;
		if (found)
			break;
	}
	if (f)
		fclose(f);
	if (!found)
		return NULL;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	f = fopen(path, "w");
	if (!f || fprintf(f, "%u\n", w->opt.readahead_kb) < 0 || fclose(f) != 0)
		wfs_log(w, LOG_INFO, "cannot set read-ahead of %s via %s: %s", w->opt.mnt, path,
			strerror(errno));
	else
		wfs_log(w, LOG_DEBUG, "read-ahead of %s set to %u KiB", w->opt.mnt,
			w->opt.readahead_kb);
	return NULL;
}

static void write_pid(struct wfs *w)
{
	char pid[32];
	int n = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());

	if (ftruncate(w->lock_fd, 0) == 0 && pwrite(w->lock_fd, pid, (size_t)n, 0) < 0)
		wfs_log(w, LOG_WARNING, "cannot write pid to %s/wfs.lock", w->opt.local);
}

int main(int argc, char **argv)
{
	struct wfs w = {0};
	struct arglist fa = {0};
	struct fuse_args args;
	struct fuse_loop_config *cfg;
	struct ns_entry *root;
	char fsname[PATH_MAX + 16];
	int r, ret = 1;

	/* Each NAS read is answered from a 1 MiB buffer (libfuse copies the
	 * reply through one: a 1 MiB reply does not fit a default-sized pipe,
	 * so it is never spliced).  From mmap'ed chunks every buffer would be
	 * fresh pages to fault in, clear and unmap again -- 40% of the daemon's
	 * CPU per read; from the heap they are reused. */
	mallopt(M_MMAP_THRESHOLD, 16 << 20);
	mallopt(M_TRIM_THRESHOLD, 64 << 20);

	w.opt.entry_timeout = 1.0;
	w.opt.attr_timeout = 1.0;
	w.opt.negative_timeout = 1.0;
	w.opt.blob_timeout = 60.0;
	w.opt.max_threads = 16;
	w.opt.copy_workers = 2;
	w.opt.readahead_kb = 4096;
	w.opt.metrics_interval = 15;
	w.opt.passthrough = 1;
	policy_opts_init(&w.opt.policy);
	w.lock_fd = -1;
	if (arg_add(&fa, argv[0]))
		goto out_args;
	if (parse_args(argc, argv, &w.opt, &fa)) {
		ret = 2;
		goto out_args;
	}
	if (!w.opt.log_set)
		w.opt.log = w.opt.foreground ? WFS_LOG_STDERR : WFS_LOG_SYSLOG;
	if (check_paths(&w) || take_lock(&w))
		goto out_args;

	root = calloc(1, sizeof(*root));
	r = root ? ns_classify(&w.roots, "", root) : -ENOMEM;
	if (r == 0)
		r = node_table_init(&w.nodes, w.roots.path[0], root);
	free(root);
	if (r < 0) {
		fprintf(stderr, "wfs: NAS_HUB %s: cannot read the root: %s\n", w.opt.nas,
			strerror(-r));
		goto out_nodes;
	}
	{
		struct store_opts so = { .workers = w.opt.copy_workers,
					 .bw_limit = w.opt.promote_bw,
					 .policy = &w.opt.policy, .roots = &w.roots };
		struct store_hooks hooks = { .arg = &w, .log = store_log,
					     .changed = store_changed };

		r = store_open(&w.store, w.opt.local, &so, &hooks);
		w.store_open = 1;
		if (r < 0) {
			fprintf(stderr, "wfs: LOCAL_STORE %s: %s\n", w.opt.local, strerror(-r));
			goto out_nodes;
		}
	}
	if (w.opt.metrics_file && (r = metrics_write_file(&w.store, w.opt.metrics_file)) < 0) {
		fprintf(stderr, "wfs: -o metrics_file=%s: cannot write: %s\n", w.opt.metrics_file,
			strerror(-r));
		goto out_nodes;
	}
	w.ctl.roots = &w.roots;
	w.ctl.store = &w.store;
	w.ctl.mount = w.opt.mnt;
	w.ctl.local = w.opt.local;
	w.ctl.owner = getuid();

	snprintf(fsname, sizeof(fsname), "fsname=%s", w.roots.path[0]);
	if (arg_add(&fa, "-o") || arg_add(&fa, fsname) || arg_add(&fa, "-o") ||
	    arg_add(&fa, "subtype=wfs") || arg_add(&fa, "-o") ||
	    arg_add(&fa, "default_permissions"))
		goto out_nodes;
	args.argc = fa.n;
	args.argv = fa.v;
	args.allocated = 0;

	wfs_log_open(&w);
	w.se = fuse_session_new(&args, &wfs_ops, sizeof(wfs_ops), &w);
	if (!w.se) {
		fprintf(stderr, "wfs: cannot start a FUSE session (bad -o option?)\n");
		goto out;
	}
	if (fuse_set_signal_handlers(w.se) != 0)
		goto out_session;
	/* Bound before we detach, so wfsctl works on the line after wfs. */
	if ((r = control_bind(&w.ctl)) < 0) {
		fprintf(stderr, "wfs: LOCAL_STORE %s: cannot create the control socket: %s\n",
			w.opt.local, strerror(-r));
		goto out_signals;
	}
	if (fuse_session_mount(w.se, w.opt.mnt) != 0) {
		fprintf(stderr, "wfs: MOUNTPOINT %s: mount failed (is /dev/fuse there? root or "
			"fusermount3 needed)\n", w.opt.mnt);
		goto out_signals;
	}
	if ((r = passthrough_install(&w.pt, w.se, w.opt.passthrough, fh_backing_id)) < 0) {
		fprintf(stderr, "wfs: cannot install the passthrough hooks: %s\n", strerror(-r));
		goto out_unmount;
	}
	if (fuse_daemonize(w.opt.foreground) != 0)
		goto out_unmount;
	write_pid(&w);
	/* Threads only now: fuse_daemonize() forks. */
	if (w.opt.readahead_kb && pthread_create(&w.ra_thread, NULL, raise_readahead, &w) == 0)
		w.ra_started = 1;
	if (pipe2(w.inval_pipe, O_CLOEXEC) == 0 &&
	    pthread_create(&w.inval_thread, NULL, invalidator, &w) == 0)
		w.inval_started = 1;
	if ((r = store_start(&w.store)) < 0 || (r = control_start(&w.ctl)) < 0) {
		wfs_log(&w, LOG_ERR, "cannot start promotion or control socket in %s: %s",
			w.opt.local, strerror(-r));
		goto out_unmount;
	}
	if (w.opt.metrics_file &&
	    (r = metrics_writer_start(&w.metrics, w.opt.metrics_file, w.opt.metrics_interval,
				      &w.store)) < 0)
		wfs_log(&w, LOG_ERR, "cannot start the metrics writer for %s: %s",
			w.opt.metrics_file, strerror(-r));

	if (w.opt.single_thread) {
		ret = fuse_session_loop(w.se) ? 1 : 0;
	} else {
		cfg = fuse_loop_cfg_create();
		fuse_loop_cfg_set_max_threads(cfg, w.opt.max_threads);
		ret = fuse_session_loop_mt(w.se, cfg) ? 1 : 0;
		fuse_loop_cfg_destroy(cfg);
	}
	wfs_log(&w, LOG_INFO, "unmounting %s", w.opt.mnt);
	/* First: closing the device ends every request still waiting for an
	 * answer we will not give.  Our read-ahead thread may be in a stat()
	 * of the mount (a SIGTERM right after start-up), and anyone else's
	 * stat would hang until then too. */
	fuse_session_unmount(w.se);
	control_stop(&w.ctl);
	if (w.ra_started)
		pthread_join(w.ra_thread, NULL);
	metrics_writer_stop(&w.metrics); /* reads the store; removes the file */
	/* Before the session goes: the invalidator still talks to it (with
	 * the device closed its notices fail at once instead of waiting). */
	store_close(&w.store); /* cancels copies, writes the index */
	w.store_open = 0;
	if (w.inval_started) {
		close(w.inval_pipe[1]); /* the thread sees end of file */
		w.inval_pipe[1] = -1;
		pthread_join(w.inval_thread, NULL);
		close(w.inval_pipe[0]);
		w.inval_started = 0;
	}

out_unmount:
	fuse_session_unmount(w.se);
out_signals:
	fuse_remove_signal_handlers(w.se);
out_session:
	fuse_session_destroy(w.se);
out:
out_nodes:
	control_stop(&w.ctl);
	metrics_writer_stop(&w.metrics); /* removes the file */
	if (w.opt.metrics_file)
		unlink(w.opt.metrics_file); /* the start-up check may have written it */
	if (w.store_open)
		store_close(&w.store);
	node_table_destroy(&w.nodes);
out_args:
	for (int i = 0; i < fa.n; i++)
		free(fa.v[i]);
	free(fa.v);
	free((char *)w.opt.local_owned);
	policy_opts_free(&w.opt.policy);
	free(w.opt.metrics_file);
	for (int i = 0; i < w.opt.n_extra_roots; i++)
		free(w.opt.extra_roots[i]);
	if (w.lock_fd >= 0)
		close(w.lock_fd);
	return ret;
}
