/* policy.h - what wfs copies to local disk by itself, and how much room it
 * may take there: the options (-o ...) and the decisions made from them.
 *
 * Everything here is pure or reads only what it is given (a glob file, a
 * checkpoint index): the store asks, the policy answers.  Functions that
 * fail return -errno and never exit.
 */
#ifndef WFS_POLICY_H
#define WFS_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Defaults, as documented in wfs --help and README.md. */
#define POLICY_AUTO_BYTES ((uint64_t)256 << 20) /* NAS bytes served that make a blob hot */
#define POLICY_AUTO_OPENS 4u                    /* or NAS opens */
#define POLICY_AUTO_BW ((uint64_t)200000000)    /* 200 MB/s for all automatic copies */
#define POLICY_MIN_FREE_PCT 10u                 /* free-space floor of LOCAL_STORE's fs */
#define POLICY_REF_POLL 5.0                     /* seconds between reads of pinned refs */

struct policy_opts {
	int auto_on;          /* auto_promote=on|off */
	uint64_t auto_bytes;  /* hot after this many bytes from the NAS (capped at the
			       * blob's size); 0: bytes do not count */
	unsigned auto_opens;  /* hot after this many opens served from the NAS; 0: no */
	uint64_t auto_bw;     /* bytes/s for all automatic copies together; 0: no cap */
	int siblings;         /* auto_siblings=on|off: a hot shard queues its siblings */
	uint64_t store_max;   /* bytes the copies may take; 0: no limit */
	uint64_t min_free;    /* free-space floor in bytes, or ... */
	unsigned min_free_pct; /* ... in percent of the filesystem, when min_free is 0 */
	double ref_poll;      /* seconds */
	char **exclude;       /* globs; see policy_excluded() */
	size_t nexclude;
};

void policy_opts_init(struct policy_opts *o);
void policy_opts_free(struct policy_opts *o);

/* ---- -o options: one row each, one syntax per kind of value ----
 *
 * A row names an option, the kind of value it takes, where the value goes
 * (an offset into the options struct its table is for) and the range it
 * must lie in.  The policy options' rows are policy_opt_rows (into struct
 * policy_opts); the daemon's own are in fs/opts.c, which parses both with
 * opt_row_set(), so the same kind takes the same spellings in every option:
 *   OPT_BOOL     on, yes, true, 1 / off, no, false, 0; the bare name is on
 *   OPT_UINT     decimal digits only, within [min, max]
 *   OPT_SECONDS  decimal digits with at most one '.', within [min, max]
 *   OPT_MBPS     the same, in MB/s (10^6 bytes), stored as bytes/s (uint64_t)
 *   OPT_SIZE     bytes: digits with an optional '.' fraction and K, M, G or T
 *                suffix (powers of 1024, any case, "iB" or "B" may follow:
 *                256M, 1.5G, 2GiB); a fraction needs a suffix
 *   OPT_STRING   any text (a malloc'ed char *, replaced when given again)
 *   OPT_CUSTOM   parsed by the row's set() (globs, a size or a percentage)
 * Never accepted: an empty value, a bare name (but a boolean's), signs,
 * exponents, hex, spaces, "inf", trailing characters. */
enum opt_kind { OPT_BOOL, OPT_UINT, OPT_SECONDS, OPT_MBPS, OPT_SIZE, OPT_STRING, OPT_CUSTOM };

struct opt_row {
	const char *name;
	enum opt_kind kind;
	size_t off;            /* offsetof() the field (not OPT_CUSTOM) */
	double min, max;       /* OPT_UINT, OPT_SECONDS, OPT_MBPS */
	const char *unit;      /* OPT_UINT: what it counts, for messages ("KiB") */
	const char *arg;       /* --help: the value's name when not the kind's */
	const char *expects;   /* OPT_STRING, OPT_CUSTOM: what the value must be */
	const char *dflt;      /* --help: the default, when not read from the field */
	const char *help;      /* --help: '\n' starts another line */
	/* OPT_CUSTOM: take @val (non-empty) into @base.  Returns 0 or -errno,
	 * with -EINVAL for a value that is not what the row expects; may say
	 * why in @err (without the option's name). */
	int (*set)(void *base, const char *val, char *err, size_t errsz);
	/* OPT_CUSTOM: the default, read from @base (else dflt, else "none"). */
	void (*show)(const void *base, char *buf, size_t sz);
};

/* The rows of the policy options (into struct policy_opts); the table ends
 * with a row whose name is NULL. */
extern const struct opt_row policy_opt_rows[];

/* The row named @name in @rows, or NULL. */
const struct opt_row *opt_row_find(const struct opt_row *rows, const char *name);

/* Take one value into @base (the struct the row's table is for).  @val
 * NULL is the bare name ("-o passthrough").  Returns 0, or -errno (-EINVAL
 * for a bad value) with the message in @err: "-o NAME=VAL: expects ...". */
int opt_row_set(const struct opt_row *row, void *base, const char *val, char *err,
		size_t errsz);

/* --help lines for @rows, with the defaults read from @defaults. */
void opt_rows_usage(FILE *f, const struct opt_row *rows, const void *defaults);

/* One -o KEY=VAL of a policy option (an empty @val is the bare KEY).
 * Returns 1 when the key is a policy option and @val was taken, 0 when the
 * key is not ours, -1 for a bad value (the reason, naming the option, in
 * @err). */
int policy_parse_opt(struct policy_opts *o, const char *key, const char *val, char *err,
		     size_t errsz);

/* The --help lines of the policy options, in the daemon's format. */
void policy_usage(FILE *f);

/* Add one exclusion glob; add every glob of a file (one a line, '#'
 * comments, blank lines ignored). */
int policy_add_exclude(struct policy_opts *o, const char *glob);
int policy_read_excludes(struct policy_opts *o, const char *path, char *err, size_t errsz);

/* The glob that keeps the mount-relative path @rel on the NAS, or NULL.
 * A glob without '/' is matched against the last component of @rel (as in
 * .gitignore: "*.gguf"); one with '/' against the whole path, where '*'
 * also matches '/' (README.md has examples). */
const char *policy_excluded(const struct policy_opts *o, const char *rel);

/* Has a blob of @size bytes become hot after @nas_bytes and @nas_opens
 * served from the NAS? */
int policy_is_hot(const struct policy_opts *o, uint64_t size, uint64_t nas_bytes,
		  uint64_t nas_opens);

/* The free-space floor in bytes on a filesystem of @fs_bytes. */
uint64_t policy_floor(const struct policy_opts *o, uint64_t fs_bytes);

/* The rate each copy may read at, so that @ncopies copies at once never pass
 * @total bytes/s together (0: no cap). */
uint64_t policy_share(uint64_t total, unsigned ncopies);

/* Sharded checkpoints: "model-00003-of-00042.safetensors" is shard 3 of 42
 * with stem "model" and tail ".safetensors".  Returns 1 and fills @sh when
 * @name (a file name, no '/') has that form. */
struct policy_shard {
	size_t stem_len;      /* length of the part before "-NNNNN-of-" */
	unsigned long index, total;
	const char *tail;     /* what follows the total: ".safetensors" */
};
int policy_shard_parse(const char *name, struct policy_shard *sh);

/* Are @a and @b (file names) shards of one checkpoint (same stem, total and
 * tail, other index)? */
int policy_shard_siblings(const char *a, const char *b);

/* A checkpoint index ("*.safetensors.index.json", "*.bin.index.json")? */
int policy_is_ckpt_index(const char *name);

/* Call @fn for every distinct file its weight_map names (the values), as
 * written (relative to the index's directory), until @fn returns non-zero.
 * Returns 0 when every file was passed, else what @fn returned; -errno, or
 * -EINVAL for a file that is not such an index. */
int policy_weight_map(const char *index_path, int (*fn)(void *arg, const char *file),
		      void *arg);

#endif
