/* policy.c - automatic promotion and capacity options; see policy.h. */
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void policy_opts_init(struct policy_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->auto_on = 1;
	o->auto_bytes = POLICY_AUTO_BYTES;
	o->auto_opens = POLICY_AUTO_OPENS;
	o->auto_bw = POLICY_AUTO_BW;
	o->siblings = 1;
	o->min_free_pct = POLICY_MIN_FREE_PCT;
	o->ref_poll = POLICY_REF_POLL;
}

void policy_opts_free(struct policy_opts *o)
{
	for (size_t i = 0; i < o->nexclude; i++)
		free(o->exclude[i]);
	free(o->exclude);
	o->exclude = NULL;
	o->nexclude = 0;
}

static int __attribute__((format(printf, 3, 4)))
bad(char *err, size_t errsz, const char *fmt, ...)
{
	va_list ap;

	if (err && errsz) {
		va_start(ap, fmt);
		vsnprintf(err, errsz, fmt, ap);
		va_end(ap);
	}
	return -1;
}

int policy_add_exclude(struct policy_opts *o, const char *glob)
{
	char **v, *g;

	if (!*glob)
		return -EINVAL;
	v = realloc(o->exclude, (o->nexclude + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	o->exclude = v;
	g = strdup(glob);
	if (!g)
		return -ENOMEM;
	o->exclude[o->nexclude++] = g;
	return 0;
}

int policy_read_excludes(struct policy_opts *o, const char *path, char *err, size_t errsz)
{
	FILE *f = fopen(path, "re");
	char *line = NULL;
	size_t cap = 0;
	int r = 0;

	if (!f) {
		r = -errno;
		bad(err, errsz, "exclude_from=%s: %s", path, strerror(-r));
		return r;
	}
	/* getline, not a fixed buffer: a long line cut in two made two globs,
	 * and its tail alone could match far more than the line */
	while (r == 0 && getline(&line, &cap, f) >= 0) {
		char *p = line, *e;

		while (isspace((unsigned char)*p))
			p++;
		e = p + strlen(p);
		while (e > p && isspace((unsigned char)e[-1]))
			*--e = '\0';
		if (*p && *p != '#')
			r = policy_add_exclude(o, p);
	}
	if (r == 0 && ferror(f))
		r = errno == ENOMEM ? -ENOMEM : -EIO;
	free(line);
	fclose(f);
	if (r < 0)
		bad(err, errsz, "exclude_from=%s: %s", path, strerror(-r));
	return r;
}

/* ---- -o options (see policy.h for the syntax of each kind) ---- */

/* Digits with at most one '.' and at least one digit: what strtod takes
 * without signs, exponents, hex, "inf", "nan" or spaces.  Returns the end
 * (@s itself when there is no number). */
static const char *scan_decimal(const char *s)
{
	const char *p = s;
	int digits = 0, dot = 0;

	for (;; p++) {
		if (isdigit((unsigned char)*p))
			digits = 1;
		else if (*p == '.' && !dot)
			dot = 1;
		else
			break;
	}
	return digits ? p : s;
}

/* A decimal number (scan_decimal) and nothing after it, within the row's
 * range. */
static int take_decimal(const struct opt_row *r, const char *val, double *out)
{
	const char *end = scan_decimal(val);
	double d;

	if (end == val || *end)
		return -EINVAL;
	d = strtod(val, NULL);
	if (d < r->min || d > r->max)
		return -ERANGE;
	*out = d;
	return 0;
}

static int take_bool(const struct opt_row *r, void *field, const char *val)
{
	static const struct {
		const char *word;
		int on;
	} words[] = {
		{ "on", 1 }, { "yes", 1 }, { "true", 1 }, { "1", 1 },
		{ "off", 0 }, { "no", 0 }, { "false", 0 }, { "0", 0 },
	};

	(void)r;
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		if (!strcmp(val, words[i].word)) {
			*(int *)field = words[i].on;
			return 0;
		}
	}
	return -EINVAL;
}

static int take_uint(const struct opt_row *r, void *field, const char *val)
{
	unsigned long long n;

	if (!*val)
		return -EINVAL;
	for (const char *p = val; *p; p++)
		if (!isdigit((unsigned char)*p))
			return -EINVAL;
	errno = 0;
	n = strtoull(val, NULL, 10);
	if (errno == ERANGE || (double)n < r->min || (double)n > r->max)
		return -ERANGE;
	*(unsigned *)field = (unsigned)n;
	return 0;
}

static int take_seconds(const struct opt_row *r, void *field, const char *val)
{
	return take_decimal(r, val, (double *)field);
}

static int take_mbps(const struct opt_row *r, void *field, const char *val)
{
	double mb;
	int e = take_decimal(r, val, &mb);

	if (e == 0 && mb > 0 && mb * 1e6 < 1)
		return -ERANGE; /* would round to 0 bytes/s: no cap at all */
	if (e == 0)
		*(uint64_t *)field = (uint64_t)(mb * 1e6 + 0.5);
	return e;
}

static int take_size(const struct opt_row *r, void *field, const char *val)
{
	static const char units[] = "KMGT";
	const char *end = scan_decimal(val), *u;
	double v, mul = 1;

	(void)r;
	if (end == val)
		return -EINVAL;
	v = strtod(val, NULL);
	if (*end && (u = strchr(units, toupper((unsigned char)*end)))) {
		for (const char *k = units; k <= u; k++)
			mul *= 1024.0;
		end++;
		if ((end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b'))
			end++;
	} else if (memchr(val, '.', (size_t)(end - val))) {
		return -EINVAL; /* bytes are whole */
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return -EINVAL;
	/* At most 4 EiB (no disk is near it): the room checks add a floor, the
	 * copies in flight and a copy's size, and JSON's numbers are signed;
	 * past 2^62 they wrapped and status showed negative sizes. */
	if (v * mul > 4611686018427387904.0)
		return -ERANGE;
	*(uint64_t *)field = (uint64_t)(v * mul);
	return 0;
}

static int take_string(const struct opt_row *r, void *field, const char *val)
{
	char *copy = strdup(val);

	(void)r;
	if (!copy)
		return -ENOMEM;
	free(*(char **)field);
	*(char **)field = copy;
	return 0;
}

/* A number as a person writes it: "1048576", not "1.04858e+06". */
static void fmt_number(double d, char *buf, size_t sz)
{
	if (d == floor(d) && fabs(d) < 1e15)
		snprintf(buf, sz, "%.0f", d);
	else
		snprintf(buf, sz, "%g", d);
}

static void expects_range(const struct opt_row *r, const char *what, char *buf, size_t sz)
{
	char lo[32], hi[32];

	fmt_number(r->min, lo, sizeof(lo));
	fmt_number(r->max, hi, sizeof(hi));
	snprintf(buf, sz, "%s (%s-%s)", what, lo, hi);
}

static void expects_bool(const struct opt_row *r, char *buf, size_t sz)
{
	(void)r;
	snprintf(buf, sz, "on or off (or yes/no, true/false, 1/0)");
}

static void expects_uint(const struct opt_row *r, char *buf, size_t sz)
{
	char what[64];

	snprintf(what, sizeof(what), "a whole number of %s", r->unit ? r->unit : "units");
	expects_range(r, what, buf, sz);
}

static void expects_seconds(const struct opt_row *r, char *buf, size_t sz)
{
	expects_range(r, "a number of seconds", buf, sz);
}

static void expects_mbps(const struct opt_row *r, char *buf, size_t sz)
{
	char hi[32];

	fmt_number(r->max, hi, sizeof(hi));
	snprintf(buf, sz, "a number of MB/s (0: no cap; else 0.000001-%s)", hi);
}

static void expects_size(const struct opt_row *r, char *buf, size_t sz)
{
	(void)r;
	snprintf(buf, sz, "a size in bytes, optionally with a K, M, G or T suffix "
		 "(256M, 1.5G, 2TiB), at most 4 EiB");
}

static void expects_text(const struct opt_row *r, char *buf, size_t sz)
{
	snprintf(buf, sz, "%s", r->expects ? r->expects : "a value");
}

static void show_bool(const void *field, char *buf, size_t sz)
{
	snprintf(buf, sz, "%s", *(const int *)field ? "on" : "off");
}

static void show_uint(const void *field, char *buf, size_t sz)
{
	snprintf(buf, sz, "%u", *(const unsigned *)field);
}

static void show_seconds(const void *field, char *buf, size_t sz)
{
	fmt_number(*(const double *)field, buf, sz);
}

static void show_mbps(const void *field, char *buf, size_t sz)
{
	fmt_number((double)*(const uint64_t *)field / 1e6, buf, sz);
}

/* The largest unit that divides the size: 256M, not 268435456. */
static void show_size(const void *field, char *buf, size_t sz)
{
	static const char units[] = "KMGT";
	uint64_t v = *(const uint64_t *)field;
	int u = -1;

	while (v && v % 1024 == 0 && u + 1 < (int)sizeof(units) - 1) {
		v /= 1024;
		u++;
	}
	if (u < 0)
		snprintf(buf, sz, "%llu", (unsigned long long)v);
	else
		snprintf(buf, sz, "%llu%c", (unsigned long long)v, units[u]);
}

static void show_string(const void *field, char *buf, size_t sz)
{
	const char *s = *(char *const *)field;

	snprintf(buf, sz, "%s", s ? s : "none");
}

/* What each kind of value means: how it is taken, what a bad one should
 * have been, how its default is shown. */
static const struct {
	const char *arg; /* --help: the value's name */
	int (*take)(const struct opt_row *r, void *field, const char *val);
	void (*expects)(const struct opt_row *r, char *buf, size_t sz);
	void (*show)(const void *field, char *buf, size_t sz);
} kinds[] = {
	[OPT_BOOL] = { "on|off", take_bool, expects_bool, show_bool },
	[OPT_UINT] = { "N", take_uint, expects_uint, show_uint },
	[OPT_SECONDS] = { "S", take_seconds, expects_seconds, show_seconds },
	[OPT_MBPS] = { "N", take_mbps, expects_mbps, show_mbps },
	[OPT_SIZE] = { "SIZE", take_size, expects_size, show_size },
	[OPT_STRING] = { "VALUE", take_string, expects_text, show_string },
	[OPT_CUSTOM] = { "VALUE", NULL, expects_text, NULL },
};

const struct opt_row *opt_row_find(const struct opt_row *rows, const char *name)
{
	for (const struct opt_row *r = rows; r->name; r++)
		if (!strcmp(r->name, name))
			return r;
	return NULL;
}

int opt_row_set(const struct opt_row *row, void *base, const char *val, char *err,
		size_t errsz)
{
	char why[512] = "";
	int r;

	if (!val && row->kind == OPT_BOOL)
		val = "on";
	if (!val || !*val)
		r = -EINVAL;
	else if (row->kind == OPT_CUSTOM)
		r = row->set(base, val, why, sizeof(why));
	else
		r = kinds[row->kind].take(row, (char *)base + row->off, val);
	if (r == 0)
		return 0;
	if (!*why && (r == -EINVAL || r == -ERANGE)) {
		memcpy(why, "expects ", 8);
		kinds[row->kind].expects(row, why + 8, sizeof(why) - 8);
	} else if (!*why) {
		snprintf(why, sizeof(why), "%s", strerror(-r));
	}
	bad(err, errsz, "-o %s%s%s: %s", row->name, val ? "=" : "", val ? val : "", why);
	return r;
}

/* The default of @r, read from @defaults, and its range if it has one:
 * "4096; 0-1048576". */
static void show_default(const struct opt_row *r, const void *defaults, char *buf, size_t sz)
{
	size_t n;

	if (r->dflt)
		snprintf(buf, sz, "%s", r->dflt);
	else if (r->kind == OPT_CUSTOM && r->show)
		r->show(defaults, buf, sz);
	else if (kinds[r->kind].show)
		kinds[r->kind].show((const char *)defaults + r->off, buf, sz);
	else
		snprintf(buf, sz, "none");
	n = strlen(buf);
	if (r->kind == OPT_UINT || r->kind == OPT_SECONDS || r->kind == OPT_MBPS) {
		char lo[32], hi[32];

		fmt_number(r->min, lo, sizeof(lo));
		fmt_number(r->max, hi, sizeof(hi));
		snprintf(buf + n, sz - n, "; %s-%s", lo, hi);
	}
}

#define USAGE_INDENT 23 /* where the help text starts */
#define USAGE_WIDTH 79

void opt_rows_usage(FILE *f, const struct opt_row *rows, const void *defaults)
{
	for (const struct opt_row *r = rows; r->name; r++) {
		char left[64], dflt[128];
		const char *line = r->help ? r->help : "";
		int col;

		snprintf(left, sizeof(left), "%s=%s", r->name, r->arg ? r->arg : kinds[r->kind].arg);
		show_default(r, defaults, dflt, sizeof(dflt));
		col = fprintf(f, "  %-*s", USAGE_INDENT - 3, left);
		if (col > USAGE_INDENT - 1)
			col = fprintf(f, "\n%*s", USAGE_INDENT - 1, "") - 1;
		for (;;) {
			size_t len = strcspn(line, "\n");

			col += fprintf(f, " %.*s", (int)len, line);
			if (!line[len])
				break;
			line += len + 1;
			col = fprintf(f, "\n%*s", USAGE_INDENT - 1, "") - 1;
		}
		if (col + (int)strlen(dflt) + 11 > USAGE_WIDTH)
			fprintf(f, "\n%*s(default %s)\n", USAGE_INDENT, "", dflt);
		else
			fprintf(f, " (default %s)\n", dflt);
	}
}

static int set_exclude(void *base, const char *val, char *why, size_t whysz)
{
	(void)why;
	(void)whysz;
	return policy_add_exclude(base, val);
}

static int set_exclude_from(void *base, const char *val, char *why, size_t whysz)
{
	(void)why;
	(void)whysz;
	return policy_read_excludes(base, val, NULL, 0);
}

/* SIZE, or N% of LOCAL_STORE's filesystem: one replaces the other. */
static int set_min_free(void *base, const char *val, char *why, size_t whysz)
{
	static const struct opt_row pct = { .name = "min_free", .kind = OPT_UINT, .max = 99 };
	struct policy_opts *o = base;
	size_t n = strlen(val);
	char digits[16];
	unsigned p;
	uint64_t sz;

	(void)why;
	(void)whysz;
	if (val[n - 1] == '%') {
		if (n - 1 == 0 || n - 1 >= sizeof(digits))
			return -EINVAL;
		memcpy(digits, val, n - 1);
		digits[n - 1] = '\0';
		if (take_uint(&pct, &p, digits))
			return -EINVAL;
		o->min_free = 0;
		o->min_free_pct = p;
		return 0;
	}
	if (take_size(NULL, &sz, val))
		return -EINVAL;
	o->min_free = sz;
	o->min_free_pct = 0;
	return 0;
}

static void show_min_free(const void *base, char *buf, size_t sz)
{
	const struct policy_opts *o = base;

	if (o->min_free)
		show_size(&o->min_free, buf, sz);
	else
		snprintf(buf, sz, "%u%%", o->min_free_pct);
}

#define POLICY_OFF(field) offsetof(struct policy_opts, field)

const struct opt_row policy_opt_rows[] = {
	{ .name = "auto_promote", .kind = OPT_BOOL, .off = POLICY_OFF(auto_on),
	  .help = "copy what is read from the NAS to local disk by itself" },
	{ .name = "auto_bytes", .kind = OPT_SIZE, .off = POLICY_OFF(auto_bytes),
	  .help = "a blob is hot once this much of it was read from the\n"
		  "NAS (a smaller blob: once read in full); 0: bytes do\n"
		  "not count" },
	{ .name = "auto_opens", .kind = OPT_UINT, .off = POLICY_OFF(auto_opens),
	  .max = 1000000, .unit = "opens",
	  .help = "... or once opened N times from the NAS (0: opens do\n"
		  "not count)" },
	{ .name = "auto_mbps", .kind = OPT_MBPS, .off = POLICY_OFF(auto_bw), .max = 1000000,
	  .help = "cap on NAS reads of all automatic copies together, MB/s\n"
		  "(0: no cap); explicit promotes go first and one copy\n"
		  "worker is kept for them" },
	{ .name = "auto_siblings", .kind = OPT_BOOL, .off = POLICY_OFF(siblings),
	  .help = "a hot shard (model-00003-of-00042.*, or a file named in\n"
		  "a *.index.json weight_map) queues the other shards of\n"
		  "its revision" },
	{ .name = "exclude", .kind = OPT_CUSTOM, .arg = "GLOB", .expects = "a glob",
	  .set = set_exclude,
	  .help = "keep matching paths on the NAS: never promoted by\n"
		  "themselves, and wfsctl promote needs --force\n"
		  "(repeatable; '*.gguf' matches names, 'a/b*' mount\n"
		  "paths, where '*' also matches '/')" },
	{ .name = "exclude_from", .kind = OPT_CUSTOM, .arg = "FILE",
	  .expects = "a readable file of globs", .set = set_exclude_from,
	  .help = "exclusion globs from FILE, one a line, # comments" },
	{ .name = "store_max", .kind = OPT_SIZE, .off = POLICY_OFF(store_max),
	  .help = "the most the local copies may take (0: no limit)" },
	{ .name = "min_free", .kind = OPT_CUSTOM, .arg = "SIZE|N%",
	  .expects = "a size (20G) or a percentage of the filesystem (0%-99%)",
	  .set = set_min_free, .show = show_min_free,
	  .help = "free space always left on LOCAL_STORE's filesystem" },
	{ .name = "ref_poll", .kind = OPT_SECONDS, .off = POLICY_OFF(ref_poll),
	  .min = 0.1, .max = 86400,
	  .help = "how often pinned refs (wfsctl pin --ref) are read on\n"
		  "the NAS" },
	{ .name = NULL },
};

int policy_parse_opt(struct policy_opts *o, const char *key, const char *val, char *err,
		     size_t errsz)
{
	const struct opt_row *row = opt_row_find(policy_opt_rows, key);

	if (!row)
		return 0;
	return opt_row_set(row, o, *val ? val : NULL, err, errsz) < 0 ? -1 : 1;
}

void policy_usage(FILE *f)
{
	struct policy_opts defaults;

	policy_opts_init(&defaults);
	opt_rows_usage(f, policy_opt_rows, &defaults);
	policy_opts_free(&defaults);
}

const char *policy_excluded(const struct policy_opts *o, const char *rel)
{
	const char *base = strrchr(rel, '/');

	base = base ? base + 1 : rel;
	for (size_t i = 0; o && i < o->nexclude; i++) {
		const char *g = o->exclude[i];

		if (strchr(g, '/') ? fnmatch(g, rel, 0) == 0 : fnmatch(g, base, 0) == 0)
			return g;
	}
	return NULL;
}

int policy_is_hot(const struct policy_opts *o, uint64_t size, uint64_t nas_bytes,
		  uint64_t nas_opens)
{
	uint64_t want;

	if (!o || !o->auto_on)
		return 0;
	if (o->auto_opens && nas_opens >= o->auto_opens)
		return 1;
	if (!o->auto_bytes)
		return 0;
	want = o->auto_bytes < size ? o->auto_bytes : size;
	return nas_bytes >= (want ? want : 1);
}

uint64_t policy_floor(const struct policy_opts *o, uint64_t fs_bytes)
{
	if (!o)
		return 0;
	if (o->min_free)
		return o->min_free;
	return fs_bytes / 100 * o->min_free_pct;
}

uint64_t policy_share(uint64_t total, unsigned ncopies)
{
	uint64_t r;

	if (!total)
		return 0;
	r = total / (ncopies ? ncopies : 1);
	return r ? r : 1;
}

/* ---- sharded checkpoints ---- */

int policy_shard_parse(const char *name, struct policy_shard *sh)
{
	/* The last "-<digits>-of-<digits>" in the name. */
	for (const char *p = name + strlen(name); p > name; p--) {
		const char *d = p - 1, *q;
		char *end;

		if (*d != '-')
			continue;
		q = d + 1;
		if (!isdigit((unsigned char)*q))
			continue;
		sh->index = strtoul(q, &end, 10);
		if (strncmp(end, "-of-", 4) || !isdigit((unsigned char)end[4]))
			continue;
		sh->total = strtoul(end + 4, &end, 10);
		if (sh->total < 2 || sh->index > sh->total || strchr(end, '/'))
			continue;
		sh->stem_len = (size_t)(d - name);
		sh->tail = end;
		return 1;
	}
	return 0;
}

int policy_shard_siblings(const char *a, const char *b)
{
	struct policy_shard x, y;

	if (!policy_shard_parse(a, &x) || !policy_shard_parse(b, &y))
		return 0;
	return x.stem_len == y.stem_len && !strncmp(a, b, x.stem_len) && x.total == y.total &&
	       !strcmp(x.tail, y.tail) && x.index != y.index;
}

int policy_is_ckpt_index(const char *name)
{
	size_t n = strlen(name), k = strlen(".index.json");

	return n > k && !strcmp(name + n - k, ".index.json");
}

/* Checkpoint indexes are small; anything this big is something else. */
#define INDEX_MAX ((size_t)64 << 20)

int policy_weight_map(const char *index_path, int (*fn)(void *arg, const char *file),
		      void *arg)
{
	json_error_t jerr;
	json_t *root, *map, *v, *seen;
	struct stat st;
	const char *k;
	int r = 0;

	if (stat(index_path, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > INDEX_MAX)
		return -EINVAL;
	root = json_load_file(index_path, 0, &jerr);
	if (!root)
		return -EINVAL;
	map = json_object_get(root, "weight_map");
	seen = json_object();
	if (!json_is_object(map) || !seen) {
		json_decref(root);
		json_decref(seen);
		return seen ? -EINVAL : -ENOMEM;
	}
	json_object_foreach(map, k, v) {
		const char *file = json_string_value(v);

		if (!file || json_object_get(seen, file))
			continue;
		json_object_set_new(seen, file, json_true());
		r = fn(arg, file);
		if (r)
			break;
	}
	json_decref(seen);
	json_decref(root);
	return r;
}
