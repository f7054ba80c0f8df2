/* opts.c - the wfs command line; see opts.h. */
#include "opts.h"
#include "passthrough.h"
#include "wfs.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the daemon's own -o options (the policy options: core/policy.c) ---- */

static int set_root(void *base, const char *val, char *why, size_t whysz)
{
	struct wfs_opts *o = base;
	char *copy;

	if (o->n_extra_roots >= HUB_MAX_ROOTS - 1) {
		snprintf(why, whysz, "at most %d root= options", HUB_MAX_ROOTS - 1);
		return -E2BIG;
	}
	copy = strdup(val);
	if (!copy)
		return -ENOMEM;
	o->extra_roots[o->n_extra_roots++] = copy;
	return 0;
}

static int set_log(void *base, const char *val, char *why, size_t whysz)
{
	static const struct {
		const char *word;
		enum wfs_log_target target;
	} targets[] = {
		{ "stderr", WFS_LOG_STDERR },
		{ "syslog", WFS_LOG_SYSLOG },
	};
	struct wfs_opts *o = base;

	(void)why;
	(void)whysz;
	for (size_t i = 0; i < sizeof(targets) / sizeof(targets[0]); i++) {
		if (!strcmp(val, targets[i].word)) {
			o->log = targets[i].target;
			o->log_set = 1;
			return 0;
		}
	}
	return -EINVAL;
}

/* Absolute: the daemon leaves its working directory when it detaches. */
static int set_metrics_file(void *base, const char *val, char *why, size_t whysz)
{
	struct wfs_opts *o = base;
	char *copy;

	(void)why;
	(void)whysz;
	if (val[0] != '/')
		return -EINVAL;
	copy = strdup(val);
	if (!copy)
		return -ENOMEM;
	free(o->metrics_file);
	o->metrics_file = copy;
	return 0;
}

#define OFF(field) offsetof(struct wfs_opts, field)

static const struct opt_row daemon_rows[] = {
	{ .name = "local", .kind = OPT_STRING, .off = OFF(local_owned), .arg = "DIR",
	  .expects = "a directory",
	  .help = "LOCAL_STORE, for the two-argument (fstab) form" },
	{ .name = "root", .kind = OPT_CUSTOM, .arg = "DIR", .expects = "a directory",
	  .set = set_root,
	  .help = "a further read-only root that NAS links may resolve\n"
		  "into (repeatable); other links leaving NAS_HUB are\n"
		  "shown as links and never followed" },
	{ .name = "entry_timeout", .kind = OPT_SECONDS, .off = OFF(entry_timeout), .max = 86400,
	  .help = "kernel cache time of names" },
	{ .name = "attr_timeout", .kind = OPT_SECONDS, .off = OFF(attr_timeout), .max = 86400,
	  .help = "kernel cache time of attributes" },
	{ .name = "negative_timeout", .kind = OPT_SECONDS, .off = OFF(negative_timeout),
	  .max = 86400, .help = "kernel cache time of missing names" },
	{ .name = "blob_timeout", .kind = OPT_SECONDS, .off = OFF(blob_timeout), .max = 86400,
	  .help = "name and attribute cache time of content-addressed\n"
		  "blobs, whose content never changes, and of names\n"
		  "and links inside a snapshot" },
	{ .name = "nas_timeout", .kind = OPT_UINT, .off = OFF(nas_timeout_ms), .min = 50,
	  .max = NAS_GATE_TIMEOUT_MAX_MS, .unit = "ms", .arg = "MS",
	  .help = "the longest a request waits on the NAS without\n"
		  "an answer; past it the NAS is taken as down\n"
		  "(local revisions are served from the local\n"
		  "record, the rest gets EIO)" },
	{ .name = "log", .kind = OPT_CUSTOM, .arg = "stderr|syslog", .expects = "stderr or syslog",
	  .set = set_log, .dflt = "stderr with -f, else syslog",
	  .help = "where log lines go" },
	{ .name = "max_threads", .kind = OPT_UINT, .off = OFF(max_threads), .min = 1,
	  .max = PT_MAX_PENDING, .unit = "threads", .help = "FUSE worker threads" },
	{ .name = "copy_workers", .kind = OPT_UINT, .off = OFF(copy_workers), .min = 1,
	  .max = 64, .unit = "workers",
	  .help = "concurrent promotions; by default one per online\n"
		  "CPU, at least 2: a copy's SHA-256 keeps about one\n"
		  "core busy, so one copy per core keeps every core\n"
		  "hashing, and with 2 or more an automatic copy never\n"
		  "holds up a wfsctl promote" },
	{ .name = "passthrough", .kind = OPT_BOOL, .off = OFF(passthrough),
	  .help = "let the kernel read local copies itself (FUSE\n"
		  "passthrough, kernel >= 6.9; falls back to daemon-\n"
		  "served reads when the kernel refuses)" },
	{ .name = "nas_passthrough", .kind = OPT_BOOL, .off = OFF(nas_passthrough),
	  .help = "let the kernel read blobs on the NAS itself too\n"
		  "(passthrough to the NAS file: its speed, one page\n"
		  "cache copy); a NAS that hangs then hangs such a\n"
		  "reader, and an open file moves to its local copy\n"
		  "only when reopened" },
	{ .name = "fuse_uring", .kind = OPT_BOOL, .off = OFF(fuse_uring),
	  .help = "take requests through io_uring, a queue a CPU\n"
		  "(FUSE over io_uring, kernel >= 6.14, with\n"
		  "/sys/module/fuse/parameters/enable_uring set;\n"
		  "without it, through /dev/fuse as before)" },
	{ .name = "nas_read_ring", .kind = OPT_BOOL, .off = OFF(nas_read_ring),
	  .help = "read the NAS on the FUSE worker's own io_uring,\n"
		  "waited for with the deadline (off: each read is\n"
		  "handed to a NAS thread and back; also the way\n"
		  "where io_uring is disabled)" },
	{ .name = "readahead_kb", .kind = OPT_UINT, .off = OFF(readahead_kb), .max = 1048576,
	  .unit = "KiB",
	  .help = "kernel read-ahead of the mount, KiB (0 leaves the\n"
		  "kernel's 128)" },
	{ .name = "promote_mbps", .kind = OPT_MBPS, .off = OFF(promote_bw), .max = 1000000,
	  .help = "cap on promotion reads from the NAS, MB/s, all copies\n"
		  "together (0: no cap)" },
	{ .name = "metrics_file", .kind = OPT_CUSTOM, .arg = "PATH",
	  .expects = "an absolute path", .set = set_metrics_file,
	  .help = "write Prometheus metrics to PATH (absolute; e.g. a\n"
		  "node-exporter textfile directory's wfs.prom),\n"
		  "replaced atomically; removed at exit" },
	{ .name = "metrics_interval", .kind = OPT_UINT, .off = OFF(metrics_interval), .min = 1,
	  .max = 86400, .unit = "seconds", .arg = "S",
	  .help = "how often metrics_file is rewritten" },
	{ .name = NULL },
};

void opts_init(struct wfs_opts *o)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	memset(o, 0, sizeof(*o));
	o->entry_timeout = 1.0;
	o->attr_timeout = 1.0;
	o->negative_timeout = 1.0;
	o->blob_timeout = 60.0;
	o->max_threads = 16;
	o->nas_timeout_ms = NAS_GATE_TIMEOUT_MS;
	o->copy_workers = (unsigned)(ncpu < 2 ? 2 : ncpu > 64 ? 64 : ncpu);
	o->readahead_kb = 4096;
	o->metrics_interval = 15;
	o->passthrough = 1;
	o->nas_read_ring = 1;
	policy_opts_init(&o->policy);
}

void opts_free(struct wfs_opts *o)
{
	free(o->local_owned);
	o->local_owned = NULL;
	free(o->metrics_file);
	o->metrics_file = NULL;
	for (int i = 0; i < o->n_extra_roots; i++)
		free(o->extra_roots[i]);
	o->n_extra_roots = 0;
	policy_opts_free(&o->policy);
}

void opts_usage(FILE *f)
{
	struct wfs_opts defaults;

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
"wfs -o options:\n");
	opts_init(&defaults);
	opt_rows_usage(f, daemon_rows, &defaults);
	opts_free(&defaults);
	policy_usage(f);
	fprintf(f,
"\n"
"Values: on|off also takes yes/no, true/false, 1/0, and the bare name is on;\n"
"N is decimal digits; S and MB/s are decimals (1.5); SIZE is bytes with an\n"
"optional K, M, G or T suffix (powers of 1024: 256M, 1.5G, 2TiB).  A bad\n"
"value is refused before anything is mounted (exit status 2).\n"
"\n"
"FUSE -o options passed on: allow_other, allow_root, ro, fsname=, subtype=,\n"
"auto_unmount, nosuid, nodev, noatime, ...  fstab-only words (defaults,\n"
"nofail, noauto, auto, user, users, _netdev, x-*) are ignored.\n"
"\n"
"A revision added to the NAS shows up within max(negative_timeout,\n"
"entry_timeout, attr_timeout) seconds.  Every write gets EROFS.\n");
}

/* ---- libfuse's parser: a template per option, this file's callback ---- */

enum {
	KEY_FOREGROUND,
	KEY_DEBUG,
	KEY_SINGLE_THREAD,
	KEY_HELP,
	KEY_VERSION,
	KEY_ROW, /* KEY_ROW + i: the i-th row of parse_ctx.rows */
};

static const struct fuse_opt fixed_opts[] = {
	FUSE_OPT_KEY("-f", KEY_FOREGROUND),
	FUSE_OPT_KEY("-d", KEY_DEBUG),
	FUSE_OPT_KEY("-s", KEY_SINGLE_THREAD),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	/* fstab words, for mount(8) and systemd: nothing for FUSE (x-* too) */
	FUSE_OPT_KEY("defaults", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("nofail", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("noauto", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("auto", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("user", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("users", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("nouser", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("_netdev", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("rw", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_KEY("comment=", FUSE_OPT_KEY_DISCARD),
	FUSE_OPT_END
};

#define NFIXED (sizeof(fixed_opts) / sizeof(fixed_opts[0]) - 1)

/* Where each row's value goes: the daemon's rows into struct wfs_opts,
 * the policy's into its struct policy_opts. */
static const struct {
	const struct opt_row *rows;
	size_t base_off;
} tables[] = {
	{ daemon_rows, 0 },
	{ policy_opt_rows, offsetof(struct wfs_opts, policy) },
};

struct parse_ctx {
	struct wfs_opts *o;
	const struct opt_row **rows; /* every row of every table */
	void **bases;                /* ... and the struct it writes into */
	size_t nrows;
	const char *pos[3];          /* NAS_HUB [LOCAL_STORE] MOUNTPOINT */
	int npos;
	int action;                  /* enum opts_action */
};

static int take_row(struct parse_ctx *c, size_t i, const char *arg)
{
	const char *eq = strchr(arg, '=');
	char err[PATH_MAX + 256];

	if (opt_row_set(c->rows[i], c->bases[i], eq ? eq + 1 : NULL, err, sizeof(err)) < 0) {
		fprintf(stderr, "wfs: %s\n", err);
		return -1;
	}
	return 0;
}

/* libfuse's callback: -1 refuses the command line, 0 drops @arg, 1 keeps
 * it for FUSE. */
static int on_arg(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct parse_ctx *c = data;

	(void)outargs;
	switch (key) {
	case FUSE_OPT_KEY_NONOPT:
		if (c->npos == 3) {
			fprintf(stderr, "wfs: too many arguments: %s (see wfs --help)\n", arg);
			return -1;
		}
		c->pos[c->npos++] = arg;
		return 0;
	case FUSE_OPT_KEY_OPT:
		/* "-x" is a command-line flag; a word of -o comes without '-'. */
		if (arg[0] == '-') {
			fprintf(stderr, "wfs: unknown option %s (see wfs --help)\n", arg);
			return -1;
		}
		/* "a,,b" has an empty word; "x-*" are fstab's (systemd's). */
		return *arg && strncmp(arg, "x-", 2) ? 1 : 0;
	case KEY_DEBUG:
		c->o->debug = c->o->foreground = 1; /* -d implies -f */
		return 0;
	case KEY_FOREGROUND:
		c->o->foreground = 1;
		return 0;
	case KEY_SINGLE_THREAD:
		c->o->single_thread = 1;
		return 0;
	case KEY_HELP:
		c->action = OPTS_HELP;
		return 0;
	case KEY_VERSION:
		if (c->action != OPTS_HELP)
			c->action = OPTS_VERSION;
		return 0;
	}
	if (key >= KEY_ROW && (size_t)(key - KEY_ROW) < c->nrows)
		return take_row(c, (size_t)(key - KEY_ROW), arg) ? -1 : 0;
	return 1;
}

/* NAS_HUB LOCAL_STORE MOUNTPOINT, or NAS_HUB MOUNTPOINT with -o local=. */
static int take_positionals(struct parse_ctx *c)
{
	struct wfs_opts *o = c->o;

	if (c->npos == 3 && o->local_owned) {
		fprintf(stderr, "wfs: LOCAL_STORE given twice (argument and -o local=)\n");
		return -EINVAL;
	}
	if (c->npos == 3) {
		o->nas = c->pos[0];
		o->local = c->pos[1];
		o->mnt = c->pos[2];
	} else if (c->npos == 2 && o->local_owned) {
		o->nas = c->pos[0];
		o->local = o->local_owned;
		o->mnt = c->pos[1];
	} else {
		fprintf(stderr, "wfs: expected NAS_HUB LOCAL_STORE MOUNTPOINT, or NAS_HUB MOUNTPOINT "
			"with -o local=LOCAL_STORE (see wfs --help)\n");
		return -EINVAL;
	}
	return 0;
}

int opts_parse(struct wfs_opts *o, struct fuse_args *args)
{
	struct parse_ctx c = { .o = o, .action = OPTS_MOUNT };
	struct fuse_opt *templates = NULL;
	char **names = NULL; /* the "NAME=" templates */
	size_t n = 0, k = NFIXED;
	int r = -ENOMEM;

	for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++)
		for (const struct opt_row *row = tables[t].rows; row->name; row++)
			n++;
	c.rows = calloc(n, sizeof(*c.rows));
	c.bases = calloc(n, sizeof(*c.bases));
	names = calloc(n, sizeof(*names));
	/* Each row twice: "NAME=VALUE", and the bare "NAME" (on, for a
	 * boolean; refused with the row's message otherwise). */
	templates = calloc(NFIXED + 2 * n + 1, sizeof(*templates));
	if (!c.rows || !c.bases || !names || !templates)
		goto out;
	memcpy(templates, fixed_opts, NFIXED * sizeof(*templates));
	for (size_t t = 0; t < sizeof(tables) / sizeof(tables[0]); t++) {
		for (const struct opt_row *row = tables[t].rows; row->name; row++) {
			size_t len = strlen(row->name);

			names[c.nrows] = malloc(len + 2);
			if (!names[c.nrows])
				goto out;
			memcpy(names[c.nrows], row->name, len);
			memcpy(names[c.nrows] + len, "=", 2);
			c.rows[c.nrows] = row;
			c.bases[c.nrows] = (char *)o + tables[t].base_off;
			templates[k++] = (struct fuse_opt)FUSE_OPT_KEY(names[c.nrows],
								       KEY_ROW + (int)c.nrows);
			templates[k++] = (struct fuse_opt)FUSE_OPT_KEY(row->name,
								       KEY_ROW + (int)c.nrows);
			c.nrows++;
		}
	}
	/* templates[k] is FUSE_OPT_END (calloc). */
	if (fuse_opt_parse(args, &c, templates, on_arg) != 0)
		r = -EINVAL;
	else if (c.action != OPTS_MOUNT)
		r = c.action;
	else
		r = take_positionals(&c);
out:
	if (r == -ENOMEM)
		fprintf(stderr, "wfs: %s\n", strerror(ENOMEM));
	for (size_t i = 0; names && i < c.nrows; i++)
		free(names[i]);
	free(names);
	free(templates);
	free(c.rows);
	free(c.bases);
	return r;
}
