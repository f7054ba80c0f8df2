/* policy.c - automatic promotion and capacity options; see policy.h. */
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
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

/* "256M", "1.5G", "4096", "2GiB": powers of 1024.  Returns 0 or -EINVAL. */
static int parse_size(const char *val, uint64_t *out)
{
	static const char units[] = "KMGTP";
	char *end;
	double v, mul = 1;
	const char *u;

	if (!*val || !(isdigit((unsigned char)*val) || *val == '.'))
		return -EINVAL;
	v = strtod(val, &end);
	if (end == val || v < 0 || !isfinite(v))
		return -EINVAL;
	if (*end && (u = strchr(units, toupper((unsigned char)*end)))) {
		for (const char *k = units; k <= u; k++)
			mul *= 1024.0;
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v * mul >= 18446744073709551615.0)
		return -EINVAL;
	*out = (uint64_t)(v * mul);
	return 0;
}

static int parse_onoff(const char *val, int *out)
{
	if (!*val || !strcmp(val, "on") || !strcmp(val, "1") || !strcmp(val, "yes"))
		*out = 1;
	else if (!strcmp(val, "off") || !strcmp(val, "0") || !strcmp(val, "no"))
		*out = 0;
	else
		return -EINVAL;
	return 0;
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
	char line[4096];
	int r = 0;

	if (!f) {
		r = -errno;
		bad(err, errsz, "exclude_from=%s: %s", path, strerror(-r));
		return r;
	}
	while (r == 0 && fgets(line, sizeof(line), f)) {
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
		r = -EIO;
	fclose(f);
	if (r < 0)
		bad(err, errsz, "exclude_from=%s: %s", path, strerror(-r));
	return r;
}

int policy_parse_opt(struct policy_opts *o, const char *key, const char *val, char *err,
		     size_t errsz)
{
	char *end;

	if (!strcmp(key, "auto_promote")) {
		if (parse_onoff(val, &o->auto_on))
			return bad(err, errsz, "-o auto_promote=%s: expected on or off", val);
	} else if (!strcmp(key, "auto_bytes")) {
		if (parse_size(val, &o->auto_bytes))
			return bad(err, errsz, "-o auto_bytes=%s: expected a size (256M, 1G, ...; "
				   "0: bytes do not count)", val);
	} else if (!strcmp(key, "auto_opens")) {
		unsigned long n = strtoul(val, &end, 10);

		if (!*val || *end || n > 1000000)
			return bad(err, errsz, "-o auto_opens=%s: expected a count (0: opens do "
				   "not count)", val);
		o->auto_opens = (unsigned)n;
	} else if (!strcmp(key, "auto_mbps")) {
		double mb = strtod(val, &end);

		if (!*val || *end || !(mb >= 0) || mb > 1e9)
			return bad(err, errsz, "-o auto_mbps=%s: expected MB/s (0: no cap)", val);
		o->auto_bw = (uint64_t)(mb * 1e6);
	} else if (!strcmp(key, "auto_siblings")) {
		if (parse_onoff(val, &o->siblings))
			return bad(err, errsz, "-o auto_siblings=%s: expected on or off", val);
	} else if (!strcmp(key, "exclude")) {
		int r = policy_add_exclude(o, val);

		if (r < 0)
			return bad(err, errsz, "-o exclude=%s: %s", val,
				   r == -EINVAL ? "expected a glob" : strerror(-r));
	} else if (!strcmp(key, "exclude_from")) {
		if (policy_read_excludes(o, val, err, errsz) < 0)
			return -1;
	} else if (!strcmp(key, "store_max")) {
		if (parse_size(val, &o->store_max))
			return bad(err, errsz, "-o store_max=%s: expected a size (500G, 2T, ...; "
				   "0: no limit)", val);
	} else if (!strcmp(key, "min_free")) {
		size_t n = strlen(val);

		if (n > 1 && val[n - 1] == '%') {
			unsigned long pct = strtoul(val, &end, 10);

			if (end != val + n - 1 || pct > 99)
				return bad(err, errsz, "-o min_free=%s: expected 0%%..99%%", val);
			o->min_free = 0;
			o->min_free_pct = (unsigned)pct;
		} else {
			if (parse_size(val, &o->min_free))
				return bad(err, errsz, "-o min_free=%s: expected a size (20G) or a "
					   "percentage (10%%)", val);
			o->min_free_pct = 0;
		}
	} else if (!strcmp(key, "ref_poll")) {
		double s = strtod(val, &end);

		if (!*val || *end || !(s >= 0.1) || s > 86400)
			return bad(err, errsz, "-o ref_poll=%s: expected seconds (0.1 .. 86400)", val);
		o->ref_poll = s;
	} else {
		return 0;
	}
	return 1;
}

void policy_usage(FILE *f)
{
	fprintf(f,
"  auto_promote=on|off  copy what is read from the NAS to local disk by itself\n"
"                       (default on)\n"
"  auto_bytes=SIZE      a blob is hot once this much of it was read from the\n"
"                       NAS (a smaller blob: once read in full); default 256M,\n"
"                       0: bytes do not count\n"
"  auto_opens=N         ... or once opened N times from the NAS (default 4;\n"
"                       0: opens do not count)\n"
"  auto_mbps=N          cap on NAS reads of all automatic copies together, MB/s\n"
"                       (default 200; 0: no cap); explicit promotes go first\n"
"                       and one copy worker is kept for them\n"
"  auto_siblings=on|off a hot shard (model-00003-of-00042.*, or a file named in\n"
"                       a *.index.json weight_map) queues the other shards of\n"
"                       its revision (default on)\n"
"  exclude=GLOB         keep matching paths on the NAS: never promoted by\n"
"                       themselves, and wfsctl promote needs --force\n"
"                       (repeatable; '*.gguf' matches names, 'a/b*' mount\n"
"                       paths, where '*' also matches '/')\n"
"  exclude_from=FILE    exclusion globs from FILE, one a line, # comments\n"
"  store_max=SIZE       the most the local copies may take (default 0: no\n"
"                       limit); SIZE: 500G, 1.5T, ... (powers of 1024)\n"
"  min_free=SIZE|N%%     free space always left on LOCAL_STORE's filesystem\n"
"                       (default %u%%)\n"
"  ref_poll=S           how often pinned refs (wfsctl pin --ref) are read on\n"
"                       the NAS (default %g)\n",
		POLICY_MIN_FREE_PCT, POLICY_REF_POLL);
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
