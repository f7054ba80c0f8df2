/* opts.c - fuzz the daemon's command line: opts_parse() (fs/opts.c, through
 * libfuse's fuse_opt_parse; no FUSE session is needed) over an argv made
 * from the input, one argument per '\n' after "wfs" (at most 64).
 *
 * Checked after a command line is accepted: three paths, every value
 * within the range README.md documents, metrics_file absolute, every
 * exclusion glob non-empty, and none of wfs's own options passed on to
 * FUSE.  exclude_from= can only open files of the sandbox directory the
 * target runs in (fopen is wrapped: a name with '/' is refused), so no
 * input reads /dev/zero or a terminal.
 */
#include "fuzz.h"

#include "opts.h"
#include "wfs.h"

#include <math.h>

FILE *__real_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode);

static int parsing; /* inside opts_parse (libFuzzer's own fopen calls are not) */

FILE *__wrap_fopen(const char *path, const char *mode)
{
	if (parsing && strchr(path, '/')) {
		errno = EACCES;
		return NULL;
	}
	return __real_fopen(path, mode);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *base = fuzz_make_base("opts");
	static const char globs[] = "# weights kept on the NAS\n*.gguf\n\n  */original/*  \n"
				    "models--org--huge/*\n";

	(void)argc;
	(void)argv;
	FUZZ_SETUP(chdir(base) == 0, "chdir");
	fuzz_write("globs", globs, sizeof(globs) - 1);
	fuzz_write("empty", "", 0);
	fuzz_write("comments", "# only\n   # comments\n", 21);
	return 0;
}

/* The names of wfs's own -o options: none of them may reach FUSE. */
static const char *const ours[] = {
	"local", "root", "entry_timeout", "attr_timeout", "negative_timeout", "blob_timeout",
	"log", "max_threads", "copy_workers", "passthrough", "readahead_kb", "promote_mbps",
	"metrics_file", "metrics_interval", "auto_promote", "auto_bytes", "auto_opens",
	"auto_mbps", "auto_siblings", "exclude", "exclude_from", "store_max", "min_free",
	"ref_poll",
};

/* One option of a -o list passed on to FUSE (fuse_opt escapes ',' and '\'). */
static void check_fuse_opt(const char *opt, size_t n)
{
	char name[256];
	size_t k = 0;

	for (size_t i = 0; i < n && opt[i] != '=' && k + 1 < sizeof(name); i++) {
		if (opt[i] == '\\' && i + 1 < n)
			i++;
		name[k++] = opt[i];
	}
	name[k] = '\0';
	for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
		FUZZ_ASSERT(strcmp(name, ours[i]), "wfs's option %s passed on to FUSE (%.*s)", name,
			    (int)n, opt);
}

static void check_fuse_args(const struct fuse_args *a)
{
	for (int i = 1; i < a->argc; i++) {
		const char *s;

		if (strcmp(a->argv[i], "-o"))
			continue;
		FUZZ_ASSERT(i + 1 < a->argc, "-o without options passed on to FUSE");
		s = a->argv[++i];
		for (;;) {
			size_t n = 0;

			while (s[n] && s[n] != ',') {
				if (s[n] == '\\' && s[n + 1])
					n++;
				n++;
			}
			check_fuse_opt(s, n);
			if (!s[n])
				break;
			s += n + 1;
		}
	}
}

static int in(double v, double lo, double hi)
{
	return !isnan(v) && v >= lo && v <= hi;
}

static void check_opts(const struct wfs_opts *o)
{
	const struct policy_opts *p = &o->policy;

	FUZZ_ASSERT(o->nas && o->local && o->mnt, "a path is missing");
	FUZZ_ASSERT(in(o->entry_timeout, 0, 86400) && in(o->attr_timeout, 0, 86400) &&
		    in(o->negative_timeout, 0, 86400) && in(o->blob_timeout, 0, 86400),
		    "a timeout out of range");
	FUZZ_ASSERT(o->max_threads >= 1 && o->max_threads <= 1024, "max_threads %u",
		    o->max_threads);
	FUZZ_ASSERT(o->copy_workers >= 1 && o->copy_workers <= 64, "copy_workers %u",
		    o->copy_workers);
	FUZZ_ASSERT(o->readahead_kb <= 1048576, "readahead_kb %u", o->readahead_kb);
	FUZZ_ASSERT(o->metrics_interval >= 1 && o->metrics_interval <= 86400,
		    "metrics_interval %u", o->metrics_interval);
	FUZZ_ASSERT(o->promote_bw <= 1000000000000ull, "promote_mbps %llu B/s",
		    (unsigned long long)o->promote_bw);
	FUZZ_ASSERT(o->passthrough == 0 || o->passthrough == 1, "passthrough %d", o->passthrough);
	FUZZ_ASSERT(o->log == WFS_LOG_STDERR || o->log == WFS_LOG_SYSLOG, "log %d", (int)o->log);
	FUZZ_ASSERT(!o->metrics_file || o->metrics_file[0] == '/', "metrics_file %s",
		    o->metrics_file);
	FUZZ_ASSERT(o->n_extra_roots >= 0 && o->n_extra_roots < HUB_MAX_ROOTS, "%d roots",
		    o->n_extra_roots);
	for (int i = 0; i < o->n_extra_roots; i++)
		FUZZ_ASSERT(o->extra_roots[i] && o->extra_roots[i][0], "root %d empty", i);
	FUZZ_ASSERT(p->auto_on == 0 || p->auto_on == 1, "auto_promote %d", p->auto_on);
	FUZZ_ASSERT(p->siblings == 0 || p->siblings == 1, "auto_siblings %d", p->siblings);
	FUZZ_ASSERT(p->auto_opens <= 1000000, "auto_opens %u", p->auto_opens);
	FUZZ_ASSERT(p->auto_bw <= 1000000000000ull, "auto_mbps %llu B/s",
		    (unsigned long long)p->auto_bw);
	FUZZ_ASSERT(in(p->ref_poll, 0.1, 86400), "ref_poll %g", p->ref_poll);
	FUZZ_ASSERT(p->min_free || p->min_free_pct <= 99, "min_free %u%%", p->min_free_pct);
	FUZZ_ASSERT(!p->min_free || !p->min_free_pct, "min_free both %llu and %u%%",
		    (unsigned long long)p->min_free, p->min_free_pct);
	for (size_t i = 0; i < p->nexclude; i++)
		FUZZ_ASSERT(p->exclude[i] && p->exclude[i][0], "exclusion glob %zu empty", i);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf, *argv[66], *p, *end;
	struct fuse_args args;
	struct wfs_opts o;
	int argc = 0, r;

	if (size > 4096)
		return -1;
	buf = malloc(size + 1);
	FUZZ_SETUP(buf, "malloc");
	memcpy(buf, data, size);
	buf[size] = '\0';
	argv[argc++] = (char *)"wfs";
	for (p = buf, end = buf + size; p <= end && argc < 65;) {
		char *nl = memchr(p, '\n', (size_t)(end - p));

		if (nl)
			*nl = '\0';
		argv[argc++] = p;
		if (!nl)
			break;
		p = nl + 1;
	}
	argv[argc] = NULL;
	args = (struct fuse_args)FUSE_ARGS_INIT(argc, argv);
	opts_init(&o);
	parsing = 1;
	r = opts_parse(&o, &args);
	parsing = 0;
	FUZZ_ASSERT(r == OPTS_MOUNT || r == OPTS_HELP || r == OPTS_VERSION || r == -EINVAL ||
		    r == -ENOMEM, "opts_parse returned %d", r);
	if (r == OPTS_MOUNT) {
		check_opts(&o);
		check_fuse_args(&args);
	}
	fuse_opt_free_args(&args);
	opts_free(&o);
	free(buf);
	return 0;
}
