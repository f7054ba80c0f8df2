/* wfsctl.c - command-line client of the wfs daemon: finds the daemon from a
 * path in the mount, sends one JSON request per command over its unix socket
 * and prints the reply as a table (or as JSON for scripts).
 *
 * Exit status: 0 done, 1 failed (reason on stderr), 2 usage error, 3 the
 * daemon did not answer in time.
 */
#include "ctl_cmds.h"
#include "ctl_conn.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef WFS_VERSION
#define WFS_VERSION "unknown"
#endif

enum {
	F_WAIT = 1 << 0,
	F_PIN = 1 << 1,
	F_DRY_RUN = 1 << 2,
	F_FORCE = 1 << 3,
	F_FULL = 1 << 4,
	F_PROMETHEUS = 1 << 5,
	F_REF = 1 << 6,           /* --ref REF (takes a value) */
	F_RANGE = 1 << 7,         /* --range OFF:LEN, --part K/N (take a value) */
};

struct cmd {
	const char *name;
	int (*run)(const struct ctl_opts *o);
	unsigned flags;            /* which F_* options it takes */
	size_t min_paths, max_paths;
	const char *synopsis;      /* after "wfsctl NAME " */
	const char *help;
};

#define COMMON_OPTS \
"  --json          print the daemon's reply (one JSON object) on stdout\n" \
"  --socket PATH   the daemon's control socket (LOCAL_STORE/wfs.sock)\n" \
"  --timeout SECONDS  give up (exit 3) when the daemon does not answer in\n" \
"                  this time (default 120; 0: wait for ever)\n" \
"  -h, --help      this text\n"

static const struct cmd cmds[] = {
	{ "status", cmd_status, 0, 0, 1, "[PATH]",
"Show what the mount serves from where: per repo the files and bytes, how\n"
"many are local, and the count of blobs in each state; then the copies in\n"
"flight, bytes served from local disk vs the NAS, the local store's usage,\n"
"and every flagged blob (MISMATCH: the NAS holds other bytes than the blob's\n"
"content-address name says; FAILED: the copy failed) with the reason.\n"
"With PATH, only the repos under it, or the whole repo it is in (every\n"
"revision, a line each).\n"
"\n"
"First: whether the NAS is up, or DOWN since when and why (with the calls\n"
"that timed out, the requests answered from the local record, the calls\n"
"refused), and the local record: the files with a local copy the mount\n"
"still shows while the NAS is down.  While it is down status does not touch\n"
"it: the figures are then what the local record and the store know.\n"
"\n"
"options:\n" COMMON_OPTS },
	{ "promote", cmd_promote, F_WAIT | F_PIN | F_DRY_RUN | F_FORCE | F_RANGE, 1, SIZE_MAX,
	  "[--wait] [--pin] [--dry-run] [--force] PATH...\n"
	  "       wfsctl promote [--wait] [--pin] [--dry-run] [--force] (--range OFF:LEN... | --part K/N) FILE",
"Copy every blob under each PATH (a repo, a revision, a directory, a file or\n"
"a glob) to the local store, verified, so reads stop going to the NAS.\n"
"Only a repo's blobs/ and snapshots/ are copied: refs, .no_exist, trees/,\n"
".locks and top-level files are always read from the NAS (named, refused).\n"
"Prints how many blobs and bytes were queued.\n"
"\n"
"options:\n"
"  --wait          wait until every blob is local, with a progress bar on\n"
"                  stderr; exit 1 listing each blob that failed, mismatched\n"
"                  or was dropped (it stays on the NAS), with the reason.\n"
"                  Then the daemon refreshes its local record, so that a\n"
"                  NAS outage from then on still shows what was promoted\n"
"                  (if it cannot, a warning; the exit status stays).\n"
"                  Interrupting the wait does not cancel the copies.\n"
"  --pin           keep the copies: never evict them to make room\n"
"  --dry-run       change nothing; list each blob (id, size, state) and the\n"
"                  bytes to copy against the space available\n"
"  --force         promote paths an exclusion glob (wfs -o exclude=) keeps\n"
"                  on the NAS too.  Without it, a PATH that is all excluded\n"
"                  is refused (nothing to promote, exit 1, --wait or not)\n"
"                  and excluded blobs under a larger\n"
"                  PATH are skipped and counted; so are ranges of an\n"
"                  excluded FILE (--range, --part)\n"
"  --range OFF:LEN copy only bytes [OFF, OFF+LEN) of FILE (sizes in bytes or\n"
"                  with K, M, G, T: powers of 1024); repeatable.  Reads of\n"
"                  FILE take those bytes from the local store and the rest\n"
"                  from the NAS (daemon-served: no passthrough for it)\n"
"  --part K/N      FILE is a safetensors file: copy its header and part K\n"
"                  (1-based) of N of every tensor, split along its first\n"
"                  dimension into N contiguous parts (a scalar whole);\n"
"                  the ranges come from the file's own header\n"
COMMON_OPTS
"\n"
"With --wait --json the final progress reply is printed.  Ranges are kept\n"
"apart, each verified alone; a range that overlaps local ones copies only\n"
"what is missing; once they cover the whole file it becomes a whole copy.\n"
"evict FILE drops them all.\n" },
	{ "evict", cmd_evict, F_FORCE, 1, SIZE_MAX, "[--force] PATH...",
"Drop the local copies of the blobs under each PATH, and cancel their\n"
"queued or running copies; reads go to the NAS again.  Pinned copies are\n"
"skipped unless --force: each is listed with the reason, and the exit\n"
"status is 1.\n"
"\n"
"options:\n"
"  --force         evict pinned copies too (and unpin them); not those a\n"
"                  ref pin (pin --ref) holds, which it would copy back:\n"
"                  they are skipped and listed, unpin --ref drops the pin\n"
COMMON_OPTS },
	{ "pin", cmd_pin, F_REF, 1, SIZE_MAX, "PATH... | --ref REF REPO",
"Pin the blobs under each PATH: their local copies are never evicted to make\n"
"room, and wfsctl evict skips them unless --force.  PATH is not promoted:\n"
"use promote --pin for that.\n"
"\n"
"With --ref REF REPO, pin a ref instead: the revision REPO/refs/REF names is\n"
"promoted and pinned now, and whenever the ref moves on the NAS the new\n"
"revision is promoted and pinned, and the old one's blobs are unpinned once\n"
"the new one is fully local.  Kept across restarts; see wfsctl status.\n"
"A pin by hand (PATH) and a ref pin are kept apart: a ref pin moving on or\n"
"dropped leaves what is pinned by hand pinned, and unpin PATH leaves what a\n"
"ref pin holds pinned.\n"
"\n"
"options:\n"
"  --ref REF       pin the ref REF (main, refs/pr/1, ...) of the repo REPO\n"
COMMON_OPTS },
	{ "unpin", cmd_unpin, F_REF, 1, SIZE_MAX, "PATH... | --ref REF REPO",
"Unpin the blobs under each PATH: their local copies may be evicted again\n"
"(those a ref pin holds stay pinned until unpin --ref; they are counted).\n"
"With --ref REF REPO, drop that ref pin and unpin its revision's blobs\n"
"(unless another ref pin keeps them, or they are pinned by hand too).\n"
"\n"
"options:\n"
"  --ref REF       drop the pin of the ref REF of the repo REPO\n"
COMMON_OPTS },
	{ "verify", cmd_verify, F_FULL, 0, SIZE_MAX, "[--full] [PATH...]",
"Re-check that each local copy under PATH (default: the whole mount) still\n"
"matches its NAS source (size and sampled hash) and is still the file that\n"
"was verified (inode, size, mtime, ctime: one written to or touched since\n"
"is not served); a copy that does not is demoted and read from the NAS\n"
"again.  Prints how many were checked, and each demoted blob with the\n"
"reason; exit 1 if any was demoted.\n"
"\n"
"options:\n"
"  --full          re-hash every local copy in full instead of looking at\n"
"                  its identity (a scrub; reads all of it): right bytes keep\n"
"                  serving, touched or not;\n"
"                  the --timeout default is then no limit\n"
COMMON_OPTS },
	{ "doctor", cmd_doctor, 0, 0, 1, "[PATH]",
"Check the tree under PATH (default: the whole mount) for links the mount\n"
"shows as they are because wfs will not follow them -- they dangle, loop, or\n"
"lead outside NAS_HUB -- and list blobs verification flagged: mismatch (the\n"
"NAS holds bytes that do not match the blob's content address) or failed\n"
"copies, with the reason (with PATH, the blobs its files name; without, every\n"
"one).  Exit 1 when anything is listed.\n"
"\n"
"options:\n"
COMMON_OPTS },
	{ "stats", cmd_stats, F_PROMETHEUS, 0, 1, "[--prometheus] [PATH]",
"Print the daemon's counters (since it started) and gauges: bytes served\n"
"from local disk and from the NAS, opens (and passthrough opens), NAS\n"
"reads by route (on the reading thread's io_uring, or handed to a NAS\n"
"thread), the routes in use (passthrough, io_uring, fuse_uring; why one\n"
"is not), the mount's read-ahead (why it is not what was asked),\n"
"promotions started, verified, failed (by reason) and cancelled,\n"
"the queue, content-address mismatches, demotions, evictions, the local\n"
"store's blobs, bytes and free space, blobs per state, whether the NAS is\n"
"up (outages, calls timed out, requests answered from the local record)\n"
"and the local record's size.  PATH (default: the current directory) only\n"
"says which mount's daemon to ask; it must exist.\n"
"\n"
"options:\n"
"  --prometheus    print Prometheus text exposition format instead (metric\n"
"                  names wfs_*; see wfs(1) METRICS); for periodic files, prefer\n"
"                  wfs -o metrics_file=PATH\n"
COMMON_OPTS },
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static void usage(FILE *f)
{
	size_t i;

	fprintf(f, "usage: wfsctl [--socket PATH] [--json] [--timeout SECONDS] COMMAND [OPTIONS] "
		"[PATH...]\n"
		"\n"
		"Control a running wfs daemon (a FUSE overlay of a Hugging Face hub cache).\n"
		"\n"
		"commands:\n");
	for (i = 0; i < NCMDS; i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].synopsis);
	fprintf(f,
"\n"
"options:\n"
"  --socket PATH   the daemon's control socket, LOCAL_STORE/wfs.sock (default:\n"
"                  the one named by the user.wfs.socket attribute of the mount\n"
"                  root above PATH, or above the current directory)\n"
"  --json          print the daemon's reply as one JSON object (for scripts);\n"
"                  nothing on stdout when no reply comes (see exit status)\n"
"  --timeout SECONDS  how long to wait for the daemon (finding the mount,\n"
"                  connecting, each request and its reply) before giving up\n"
"                  with exit 3: default 120, verify --full none; 0: no limit.\n"
"                  promote --wait waits for ever; each of its polls is timed\n"
"  -h, --help      this text; wfsctl COMMAND --help for a command\n"
"  -V, --version   print the version\n"
"\n"
"PATH is a path in the mount, absolute or relative to the current directory:\n"
"a repo (models--org--name), a revision (.../snapshots/REV), any directory\n"
"(meaning every blob under it) or file.  A snapshot entry names the blob it\n"
"links to; a link to a directory is followed only as PATH/ (as the kernel\n"
"does); promote, evict, pin, unpin and verify refuse a link that leads to\n"
"no file, saying why; a link outside the mount that leads into it is\n"
"followed.  A PATH with * ? or [ that is not a file's name is\n"
"expanded as a glob (quote it so the shell leaves it).  With --socket and\n"
"no wfs mount above a PATH, the PATH is taken as relative to the mount root,\n"
"and a glob that matches nothing here is sent as it is.\n"
"An empty PATH ('') is refused: name the mount root as '.' or its path.\n"
"\n"
"Commands that change state (promote without --dry-run, evict, pin, unpin,\n"
"verify) need root or the user that mounted wfs; so does promote --part,\n"
"a dry run too (it reads the file's own header).\n"
"\n"
"exit status: 0 done, 1 failed (reason on stderr), 2 usage error, 3 the\n"
"daemon did not answer within --timeout\n");
}

static void print_version(void)
{
	printf("wfsctl (wfs) %s\n", WFS_VERSION);
}

static void cmd_usage(const struct cmd *c, FILE *f)
{
	fprintf(f, "usage: wfsctl %s %s\n\n%s", c->name, c->synopsis, c->help);
}

static int usage_error(const struct cmd *c, const char *fmt, const char *arg)
{
	fprintf(stderr, "wfsctl%s%s: ", c ? " " : "", c ? c->name : "");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\ntry 'wfsctl %s%s--help'\n", c ? c->name : "", c ? " " : "");
	return 2;
}

static const struct cmd *find_cmd(const char *name)
{
	size_t i;

	for (i = 0; i < NCMDS; i++)
		if (!strcmp(cmds[i].name, name))
			return &cmds[i];
	return NULL;
}

/* --NAME VALUE / --NAME=VALUE (@name without the dashes).  Returns how
 * many extra argv entries it used (0 or 1), -1 if it is not --NAME, -2 if
 * its value is missing. */
static int value_opt(const char *name, int argc, char **argv, int i, const char **out)
{
	size_t len = strlen(name);

	if (strncmp(argv[i], "--", 2) || strncmp(argv[i] + 2, name, len))
		return -1;
	if (argv[i][2 + len] == '=') {
		*out = argv[i] + 3 + len;
		return **out ? 0 : -2;
	}
	if (argv[i][2 + len])
		return -1;
	if (i + 1 >= argc || !*argv[i + 1])
		return -2;
	*out = argv[i + 1];
	return 1;
}

/* The options both before the command and among its arguments take:
 * --socket PATH and --timeout SECONDS.  Returns as value_opt, or -3 for a
 * usage error (said). */
static int conn_opt(const struct cmd *c, int argc, char **argv, int i, struct ctl_opts *o)
{
	const char *v = NULL;
	char *end;
	int n = value_opt("socket", argc, argv, i, &o->socket);

	if (n == -2)
		return usage_error(c, "%s needs a socket path", "--socket"), -3;
	if (n != -1)
		return n;
	n = value_opt("timeout", argc, argv, i, &v);
	if (n == -2)
		return usage_error(c, "%s needs a number of seconds", "--timeout"), -3;
	if (n < 0)
		return n;
	errno = 0;
	o->timeout = strtol(v, &end, 10);
	/* a year at most: the deadline is counted in milliseconds */
	if (*end || v[0] < '0' || v[0] > '9' || errno || o->timeout > 366L * 86400)
		return usage_error(c, "--timeout takes whole seconds, at most 31622400 (366 days; 0: no "
				   "limit), not '%s'", v), -3;
	return n;
}

static const struct {
	const char *name;
	unsigned flag;
} flag_names[] = {
	{ "--wait", F_WAIT }, { "--pin", F_PIN }, { "--dry-run", F_DRY_RUN },
	{ "--force", F_FORCE }, { "--full", F_FULL }, { "--prometheus", F_PROMETHEUS },
};

/* K/N of --part, in decimal digits only: sscanf's %u alone would take
 * " 1", "+1" or "-1" (as 4294967295).  0, or -EINVAL. */
static int part_parse(const char *v, unsigned *k, unsigned *n)
{
	size_t dk = strspn(v, "0123456789"), dn = v[dk] == '/' ? strspn(v + dk + 1, "0123456789") : 0;

	if (!dk || dk > 9 || !dn || dn > 9 || v[dk + 1 + dn] ||
	    sscanf(v, "%u/%u", k, n) != 2 || !*k || *k > *n)
		return -EINVAL;
	return 0;
}

/* --range OFF:LEN and --part K/N (also as --opt=VALUE): 0 not one of
 * them, -1 a usage error (said), else the arguments taken (1 or 2). */
static int range_opt(const struct cmd *c, int argc, char **argv, int i, struct ctl_opts *o)
{
	const char *a = argv[i], *v;
	int is_part = !strncmp(a, "--part", 6), taken = 1;
	size_t len = is_part ? 6 : 7;

	if (strncmp(a, is_part ? "--part" : "--range", len) || (a[len] && a[len] != '='))
		return 0;
	v = a[len] == '=' ? a + len + 1 : (taken = 2, i + 1 < argc ? argv[i + 1] : NULL);
	if (!v || !*v)
		return usage_error(c, "%s needs a value", is_part ? "--part (K/N)" : "--range (OFF:LEN)"), -1;
	if (is_part) {
		if (part_parse(v, &o->part_k, &o->part_n) < 0)
			return usage_error(c, "--part takes K/N with 1 <= K <= N, not '%s'", v), -1;
		return taken;
	}
	if (brange_parse(v, &o->ranges[o->nranges]) < 0)
		return usage_error(c, "--range takes OFFSET:LENGTH (bytes, or with K/M/G/T or k/m/g/t), "
				   "LENGTH > 0, not '%s'", v), -1;
	/* the protocol's numbers are JSON's signed 64 bits; no file is larger */
	if (o->ranges[o->nranges].off + o->ranges[o->nranges].len > (uint64_t)INT64_MAX)
		return usage_error(c, "--range %s ends past 2^63 - 1 bytes, beyond any file", v),
		       -1;
	o->nranges++;
	return taken;
}

/* Options and PATHs after the command, in any order ("--" ends options). */
static int parse_cmd_args(const struct cmd *c, int argc, char **argv, int i,
			  struct ctl_opts *o)
{
	unsigned flags = 0;
	int only_paths = 0;

	for (; i < argc; i++) {
		const char *a = argv[i];
		size_t k;
		int n;

		if (only_paths || a[0] != '-' || !a[1]) {
			/* An unset shell variable ("$DIR"): it would name the
			 * current directory, or with --socket the whole mount */
			if (!a[0])
				return usage_error(c, "%s", "an empty PATH ('') names no file; "
						   "name the mount root as '.' or its path");
			o->paths[o->npaths++] = argv[i];
			continue;
		}
		if (!strcmp(a, "--")) {
			only_paths = 1;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			cmd_usage(c, stdout);
			return 0;
		}
		if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
			print_version();
			return 0;
		}
		if (!strcmp(a, "--json")) {
			o->json = true;
			continue;
		}
		n = conn_opt(c, argc, argv, i, o);
		if (n == -3)
			return 2;
		if (n >= 0) {
			i += n;
			continue;
		}
		if ((c->flags & F_REF) && (!strcmp(a, "--ref") || !strncmp(a, "--ref=", 6))) {
			o->ref = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
			/* (no ref name begins with '-': "--ref --json" forgot the name) */
			if (!o->ref || !*o->ref)
				return usage_error(c, "%s needs a ref name (main, refs/pr/1, ...)", "--ref");
			if (*o->ref == '-')
				return usage_error(c, "--ref needs a ref name (main, refs/pr/1, ...), "
						   "not %s", o->ref);
			continue;
		}
		if ((c->flags & F_RANGE) && (n = range_opt(c, argc, argv, i, o)) != 0) {
			if (n < 0)
				return 2;
			i += n - 1;
			continue;
		}
		for (k = 0; k < sizeof(flag_names) / sizeof(flag_names[0]); k++)
			if (!strcmp(a, flag_names[k].name) && (c->flags & flag_names[k].flag))
				break;
		if (k == sizeof(flag_names) / sizeof(flag_names[0]))
			return usage_error(c, "unknown option '%s'", a);
		flags |= flag_names[k].flag;
	}
	o->wait = flags & F_WAIT;
	o->pin = flags & F_PIN;
	o->dry_run = flags & F_DRY_RUN;
	o->force = flags & F_FORCE;
	o->full = flags & F_FULL;
	o->prometheus = flags & F_PROMETHEUS;
	if ((o->nranges || o->part_n) && o->npaths != 1)
		return usage_error(c, "%s", "--range and --part take exactly one FILE");
	if (o->nranges && o->part_n)
		return usage_error(c, "%s", "--range and --part cannot be combined");
	if (o->wait && o->dry_run)
		return usage_error(c, "%s: a dry run copies nothing to wait for",
				   "--wait with --dry-run");
	if (o->ref && o->npaths != 1)
		return usage_error(c, "%s", "--ref takes one REPO (models--org--name)");
	if (o->npaths < c->min_paths)
		return usage_error(c, "%s", "needs a PATH (a repo, revision, directory or file in the mount)");
	if (o->npaths > c->max_paths)
		return usage_error(c, "takes one PATH, not '%s' as well", o->paths[c->max_paths]);
	return -1; /* go on and run it */
}

static int run(int argc, char **argv)
{
	struct ctl_conn conn = { .timeout_s = CTL_TIMEOUT_DEFAULT_S };
	struct ctl_opts o = { .conn = &conn, .timeout = -1 };
	const struct cmd *c;
	int i, r;

	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		int n;

		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		}
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(argv[i], "-V") || !strcmp(argv[i], "--version")) {
			print_version();
			return 0;
		}
		if (!strcmp(argv[i], "--json")) {
			o.json = true;
			continue;
		}
		n = conn_opt(NULL, argc, argv, i, &o);
		if (n == -3)
			return 2;
		if (n < 0)
			return usage_error(NULL, "unknown option '%s'", argv[i]);
		i += n;
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[i], "help")) {
		const char *topic = i + 1 < argc ? argv[i + 1] : NULL;

		/* "help --help": the usage, as "help" alone */
		if (topic && (!strcmp(topic, "-h") || !strcmp(topic, "--help")))
			topic = NULL;
		c = topic ? find_cmd(topic) : NULL;
		if (topic && !c)
			return usage_error(NULL, "unknown command '%s'", argv[i + 1]);
		if (c)
			cmd_usage(c, stdout);
		else
			usage(stdout);
		return 0;
	}
	c = find_cmd(argv[i]);
	if (!c)
		return usage_error(NULL, "unknown command '%s'", argv[i]);
	o.paths = calloc((size_t)argc, sizeof(*o.paths));
	o.ranges = calloc((size_t)argc, sizeof(*o.ranges));
	if (!o.paths || !o.ranges) {
		fprintf(stderr, "wfsctl: out of memory\n");
		return 1;
	}
	r = parse_cmd_args(c, argc, argv, i + 1, &o);
	/* verify --full re-hashes every local copy before it replies: hours
	 * for a large store, so no limit unless one is asked for */
	if (o.timeout >= 0)
		conn.timeout_s = (unsigned)o.timeout;
	else if (o.full)
		conn.timeout_s = 0;
	if (r < 0)
		r = c->run(&o);
	if (r && conn.timed_out)
		r = CTL_EXIT_TIMEOUT;
	free(o.paths);
	free(o.ranges);
	return r;
}

/* Output that could not be written (a full disk) must not exit 0: a
 * script moves the file into place on success (wfsctl(1)'s node-exporter
 * example: wfsctl stats --prometheus > F.$$ && mv F.$$ F). */
static int stdout_written(int r)
{
	int bad;

	errno = 0;
	bad = fflush(stdout) != 0 || ferror(stdout);
	if (!bad)
		return r;
	fprintf(stderr, "wfsctl: cannot write the output: %s\n",
		errno ? strerror(errno) : "write error");
	return r ? r : 1;
}

int main(int argc, char **argv)
{
	return stdout_written(run(argc, argv));
}
