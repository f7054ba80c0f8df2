/* record_file.c - record.json: its text, and reading it back.
 *
 * Format (version 2; version 1 is read too: record.h RECORD_VERSION):
 *   {"built":<unix seconds>,"nas":"<NAS_HUB>","version":2,"entries":[
 *   {"blob_id":"<id>","kind":"link","link_state":"resolved","mode":41471,
 *    "path":"models--o--n/snapshots/<rev>/x","target":"../../blobs/<id>",...},
 *   ...]}
 * An entry a line, compact, sorted by path (parents first); it is JSON,
 * and the reader takes any layout of it (earlier builds indented it).
 * NAS names are bytes and JSON strings UTF-8: a path, name or text that is
 * not UTF-8 is written as "<field>_hex" (two lower-case hex digits a
 * byte), as index.json does; a refs file's, marker's or file list's bytes
 * as "data", or "data_hex" when not UTF-8 or holding NUL: at most
 * RECORD_MAX_DATA bytes, RECORD_MAX_TREE for a file list
 * (trees/<rev>.json).  File lists came later with no new
 * field, only a larger bound for that one kind of path: a file an older wfs
 * wrote loads as it is, so the version stays 1.  A refs file held back
 * (record_refs.c) has "data" as it is shown while the NAS is down and
 * "nas_data" (or "nas_data_hex") as the NAS had it: an optional field an
 * older wfs ignores (it serves "data", which a build read from the NAS
 * too), so the version stays 1 again.
 *
 * Nothing read is trusted beyond what it can be checked for: a path must
 * be relative and normalised (no "..", ".", "//"), its kind one of three
 * with the mode's type matching it, the numbers in range; an entry that
 * fails is skipped, a file that does not parse is set aside.
 */
#include "record_int.h"
#include "jbytes.h"
#include "jline.h"
#include "jtext.h"
#include "durable.h"
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>
#include <xxhash.h>

static const char *const kind_names[] = { [NS_DIR] = "dir", [NS_FILE] = "file",
					  [NS_LINK] = "link" };

/* ---- writing ---- */

static void put_name(struct jline *l, const char *field, const char *s)
{
	jbytes_put(l, field, s, s ? strlen(s) : 0);
}

/* One entry, its members put in about the order they are written
 * (jline sorts them). */
static void put_node(struct jline *l, const struct rnode *n)
{
	const struct stat *st = &n->st;

	jline_int(l, "atime_ns", st->st_atim.tv_nsec);
	jline_int(l, "atime_s", st->st_atim.tv_sec);
	put_name(l, "backing", n->backing);
	jline_int(l, "blksize", st->st_blksize);
	put_name(l, "blob_id", n->blob_id);
	jline_int(l, "blocks", st->st_blocks);
	jline_int(l, "ctime_ns", st->st_ctim.tv_nsec);
	jline_int(l, "ctime_s", st->st_ctim.tv_sec);
	if (n->has_data)
		jbytes_put(l, "data", n->data, n->data_len);
	/* the NAS file's device: with the inode, what the daemon keys a
	 * file's node by, so a name answered from the record is the node it
	 * had */
	jline_int(l, "dev", (int64_t)st->st_dev);
	jline_int(l, "gid", st->st_gid);
	jline_int(l, "ino", (int64_t)st->st_ino);
	jline_str(l, "kind", kind_names[n->kind]);
	if (n->kind == NS_LINK)
		jline_str(l, "link_state", ns_link_state_name(n->link_state));
	jline_int(l, "mode", st->st_mode);
	jline_int(l, "mtime_ns", st->st_mtim.tv_nsec);
	jline_int(l, "mtime_s", st->st_mtim.tv_sec);
	if (n->has_data && n->nas_data)
		jbytes_put(l, "nas_data", n->nas_data, n->nas_data_len);
	jline_int(l, "nlink", (int64_t)st->st_nlink);
	put_name(l, "path", n->path);
	jline_int(l, "size", st->st_size);
	put_name(l, "target", n->target);
	jline_int(l, "uid", st->st_uid);
}

/* The text of record.json onto @x; no more lines once it is past @max
 * bytes. */
static void put_text(struct jtext *x, const struct record_table *t, const char *nas,
		     int64_t built, size_t max)
{
	json_t *head = json_pack("{s:i, s:I}", "version", RECORD_VERSION, "built",
				 (json_int_t)built);
	struct jline l = { 0 };

	/* {"built":..,"nas":..,"version":1,"entries":[ then an entry a line */
	if (head && jbytes_set(head, "nas", nas, nas ? strlen(nas) : 0)) {
		json_decref(head);
		head = NULL;
	}
	jtext_open_new(x, head);
	jtext_str(x, "\"entries\":[\n");
	for (size_t i = 0; !x->err && x->out + x->n <= max && t && i < t->n; i++) {
		put_node(&l, t->v[i]);
		jline_write(&l, x);
		jtext_str(x, i + 1 < t->n ? ",\n" : "\n");
	}
	jline_free(&l);
	jtext_str(x, "]}\n");
}

char *record_text(const struct record_table *t, const char *nas, int64_t built, size_t *len)
{
	struct jtext x = { 0 };

	put_text(&x, t, nas, built, SIZE_MAX);
	return jtext_take(&x, len);
}

int record_write(const char *path, const struct record_table *t, const char *nas, int64_t built)
{
	struct jtext x = { 0 };
	size_t len;
	int fd = durable_begin(path, 0600), r;

	if (fd < 0)
		return fd;
	jtext_stream(&x, fd);
	put_text(&x, t, nas, built, (size_t)RECORD_MAX_BYTES);
	r = jtext_end(&x, &len);
	if (!r && len > (size_t)RECORD_MAX_BYTES)
		r = -EFBIG;
	return durable_end(path, fd, r, 1);
}

/* ---- the content signature ---- */

static void sig_bytes(XXH3_state_t *x, const char *p, size_t n)
{
	/* the length first, -1 for none: NULL and "", "ab"+"c" and "a"+"bc"
	 * differ */
	int64_t len = p ? (int64_t)n : -1;

	XXH3_64bits_update(x, &len, sizeof(len));
	if (p)
		XXH3_64bits_update(x, p, n);
}

static void sig_name(XXH3_state_t *x, const char *s)
{
	sig_bytes(x, s, s ? strlen(s) : 0);
}

int record_sig(const struct record_table *t, const char *nas, uint64_t *sig)
{
	XXH3_state_t *x = XXH3_createState();

	if (!x)
		return -ENOMEM;
	XXH3_64bits_reset(x);
	sig_name(x, nas);
	for (size_t i = 0; t && i < t->n; i++) {
		const struct rnode *n = t->v[i];
		const struct stat *st = &n->st;
		/* what record_text writes of a node but the access time */
		const int64_t v[] = { n->kind, n->kind == NS_LINK ? (int64_t)n->link_state : -1,
			st->st_mode, st->st_uid, st->st_gid, st->st_size, (int64_t)st->st_nlink,
			(int64_t)st->st_ino, st->st_blksize, st->st_blocks, st->st_mtim.tv_sec,
			st->st_mtim.tv_nsec, st->st_ctim.tv_sec, st->st_ctim.tv_nsec,
			(int64_t)st->st_dev, n->has_data, n->has_data && n->nas_data };

		XXH3_64bits_update(x, v, sizeof(v));
		sig_name(x, n->path);
		sig_name(x, n->backing);
		sig_name(x, n->target);
		sig_name(x, n->blob_id);
		if (n->has_data)
			sig_bytes(x, n->data, n->data_len);
		if (n->has_data && n->nas_data)
			sig_bytes(x, n->nas_data, n->nas_data_len);
	}
	*sig = XXH3_64bits_digest(x);
	XXH3_freeState(x);
	return 0;
}

/* ---- reading ---- */

/* A name: bytes without NUL, at most @max long.  @need: it must be there. */
static int get_name(const struct jflat *o, const char *field, size_t max, int need,
		    char **out)
{
	size_t len;
	int r = jbytes_get(o, field, out, &len);

	if (r == -ENOENT)
		return need ? -EINVAL : 0;
	if (r == 0 && (strlen(*out) != len || len > max)) {
		free(*out);
		*out = NULL;
		r = -EINVAL;
	}
	return r;
}

/* An integer in [@lo, @hi]; a missing one is 0 unless @need. */
static int get_int(const struct jflat *o, const char *k, int64_t lo, int64_t hi, int need,
		   int64_t *v)
{
	const struct jflat_member *j = jflat_get(o, k);

	*v = 0;
	if (!j)
		return need ? -EINVAL : 0;
	if (j->type != JFLAT_INT)
		return -EINVAL;
	*v = j->i;
	return *v < lo || *v > hi ? -EINVAL : 0;
}

/* Relative, normalised, every component a name: what a hostile file must
 * not get past (a ".." would show a name escaping the mount). */
static int good_path(const char *p)
{
	char norm[PATH_MAX];

	if (p[0] == '/' || path_normalize(p, norm, sizeof(norm)) < 0 || strcmp(norm, p))
		return 0;
	for (const char *c = p; *c;) {
		size_t n = strcspn(c, "/");

		if (n > NAME_MAX)
			return 0;
		c += n + (c[n] == '/');
	}
	return 1;
}

static int get_kind(const struct jflat *o, struct rnode *n)
{
	const char *k = jflat_str(o, "kind");
	const char *ls = jflat_str(o, "link_state");
	static const mode_t type[] = { [NS_DIR] = S_IFDIR, [NS_FILE] = S_IFREG,
				       [NS_LINK] = S_IFLNK };

	for (int i = NS_DIR; k && i <= NS_LINK; i++)
		if (!strcmp(k, kind_names[i]))
			n->kind = (enum ns_kind)i;
	if (!n->kind || (n->st.st_mode & S_IFMT) != type[n->kind])
		return -EINVAL;
	if (n->kind != NS_LINK)
		return 0;
	for (int i = NS_LINK_RESOLVED; ls && i <= NS_LINK_FOREIGN; i++)
		if (!strcmp(ls, ns_link_state_name((enum ns_link_state)i))) {
			n->link_state = (enum ns_link_state)i;
			return 0;
		}
	return -EINVAL;
}

static int get_stat(const struct jflat *o, struct stat *st)
{
	static const char *const f[] = { "mode", "uid", "gid", "size", "nlink", "ino", "blksize",
		"blocks", "atime_s", "atime_ns", "mtime_s", "mtime_ns", "ctime_s", "ctime_ns",
		"dev" };
	const int64_t big = INT64_MAX, ns = 999999999, id = UINT32_MAX;
	/* (ino and dev are written as the int64 of their 64 bits: a NAS
	 * file id with the top bit set is negative there) */
	const int64_t lo[] = { 0, 0, 0, 0, 0, -big - 1, 0, 0, -big, 0, -big, 0, -big, 0,
			       -big - 1 };
	const int64_t hi[] = { 0177777, id, id, big, id, big, id, big, big, ns, big, ns,
				  big, ns, big };
	int64_t v[15];

	for (size_t i = 0; i < 15; i++)
		if (get_int(o, f[i], lo[i], hi[i], i == 0 || i == 3 || i == 5, &v[i]))
			return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->st_mode = (mode_t)v[0];
	st->st_uid = (uid_t)v[1];
	st->st_gid = (gid_t)v[2];
	st->st_size = (off_t)v[3];
	st->st_nlink = (nlink_t)v[4];
	st->st_ino = (ino_t)v[5];
	st->st_blksize = (blksize_t)v[6];
	st->st_blocks = (blkcnt_t)v[7];
	st->st_atim = (struct timespec){ (time_t)v[8], (long)v[9] };
	st->st_mtim = (struct timespec){ (time_t)v[10], (long)v[11] };
	st->st_ctim = (struct timespec){ (time_t)v[12], (long)v[13] };
	st->st_dev = (dev_t)v[14];
	return 0;
}

/* One entry: 0 with *@out, -EINVAL (skipped) or -ENOMEM. */
static int node_from(const struct jflat *o, struct rnode **out)
{
	struct rnode *n = calloc(1, sizeof(*n));
	int r;

	*out = NULL;
	if (!n)
		return -ENOMEM;
	r = o->object ? get_stat(o, &n->st) : -EINVAL;
	if (!r)
		r = get_kind(o, n);
	if (!r)
		r = get_name(o, "path", PATH_MAX - 1, 1, &n->path);
	if (!r)
		r = get_name(o, "backing", PATH_MAX - 1, n->kind == NS_FILE, &n->backing);
	if (!r)
		r = get_name(o, "target", PATH_MAX - 1, n->kind == NS_LINK, &n->target);
	if (!r)
		r = get_name(o, "blob_id", NAME_MAX, 0, &n->blob_id);
	if (!r && n->kind == NS_FILE) {
		r = jbytes_get(o, "data", &n->data, &n->data_len);
		n->has_data = r == 0;
		if (r == -ENOENT)
			r = 0;
		else if (!r && (n->data_len > record_data_max(n->path) ||
				(off_t)n->data_len != n->st.st_size))
			r = -EINVAL;
		if (!r && n->has_data) {
			r = jbytes_get(o, "nas_data", &n->nas_data, &n->nas_data_len);
			if (r == -ENOENT)
				r = 0;
			else if (!r && n->nas_data_len > RECORD_MAX_DATA)
				r = -EINVAL;
		}
	}
	/* A file's bytes come from the NAS or the local copy, named by an
	 * absolute path; a link's text is shown, never followed by us. */
	if (!r && (!good_path(n->path) || (n->backing && n->backing[0] != '/') ||
		   (n->target && !n->target[0]) || (n->blob_id && strchr(n->blob_id, '/'))))
		r = -EINVAL;
	if (r) {
		rnode_free(n);
		return r;
	}
	if (n->kind != NS_LINK)
		n->st.st_mode &= ~(mode_t)0222; /* read-only, whatever the file says */
	*out = n;
	return 0;
}

/* record.json cannot be used (@why): moved aside so that it is never read
 * again and the operator can look at it; the record starts empty. */
static void set_aside(struct record *r, const char *why)
{
	char aside[sizeof(r->path) + 16];
	int e;

	if (r->readonly) {
		record_log(r, LOG_ERR, "record %s unreadable (%s); LOCAL_STORE is read-only: left "
			   "in place, the record starts empty", r->path, why);
		return;
	}
	if ((e = durable_set_aside(r->path, aside, sizeof(aside))) == 0)
		record_log(r, LOG_ERR, "record %s unreadable (%s): moved aside to %s; the record "
			   "starts empty and is rebuilt from the NAS", r->path, why, aside);
	else
		record_log(r, LOG_ERR, "record %s unreadable (%s), cannot move it aside (%s): the "
			   "next build replaces it", r->path, why, strerror(-e));
}

/* A version-1 file entry shown through a link (its bytes not NAS_HUB
 * @nas/<path>): its way was not checked for directories a reader may not
 * search (record.h RECORD_VERSION). */
static int v1_through_link(const char *nas, const struct rnode *n)
{
	const char *rest;

	if (n->kind != NS_FILE)
		return 0;
	rest = n->backing ? path_under(nas, n->backing) : NULL;
	return !rest || strcmp(rest, n->path);
}

/* The entries of @rd into *@t (NULL, the file set aside, when any is
 * damaged): 0 or -ENOMEM.  @v1_nas: a version-1 record's NAS_HUB. */
static int load_entries(struct record *r, struct jtext_reader *rd, struct record_table **t,
			const char *v1_nas)
{
	struct rnodes l = { 0 };
	struct jflat o = { 0 };
	size_t bad = 0, dropped = 0, old = 0, i;
	int e = 0, more;

	while ((more = jtext_read_next(rd, &o)) > 0) {
		struct rnode *n;

		e = node_from(&o, &n);
		if (e == -ENOMEM)
			break;
		bad += e != 0;
		if (!e && v1_nas && v1_through_link(v1_nas, n)) {
			rnode_free(n);
			old++;
			continue;
		}
		e = e ? 0 : rnodes_push(&l, n);
		if (e)
			break;
	}
	if (old && !e && more >= 0)
		record_log(r, LOG_NOTICE, "record %s is of version 1 (an older wfs's): %zu file%s it "
			   "shows through links left out until the next build (their ways were "
			   "not checked for directories a reader may not search)", r->path, old,
			   old == 1 ? "" : "s");
	jflat_free(&o);
	if (e == -ENOMEM || more < 0) {
		for (i = 0; i < l.n; i++)
			rnode_free(l.v[i]);
		free(l.v);
		return -ENOMEM;
	}
	*t = record_table_make(&l, &dropped);
	if (!*t)
		return -ENOMEM;
	if (bad + dropped) {
		/* The file is replaced whole, never edited: an entry that does
		 * not hold is damage, and the rest is not trusted either -- a
		 * listing short of a shard would look complete while the NAS
		 * is down. */
		char why[160];

		snprintf(why, sizeof(why), "%zu damaged entries: bad fields, a path not "
			 "relative and normalised, a duplicate, or no recorded parent",
			 bad + dropped);
		record_table_free(*t);
		*t = NULL;
		set_aside(r, why);
	}
	return 0;
}

/* record.json is of @version, which a later wfs wrote: it is that wfs's
 * to read, and never replaced by this run (record.c: newer). */
static void record_newer(struct record *r, long long version)
{
	r->newer = 1;
	record_log(r, LOG_WARNING, "record %s is of version %lld, newer than this wfs (%d): left "
		   "as it is, not read and never replaced; the record starts empty", r->path,
		   version, RECORD_VERSION);
}

/* The record @rd reads: its head (version, nas, built) and its entries
 * into *@t.  0 (*@t NULL: nothing usable, said) or -ENOMEM. */
static int load_read(struct record *r, struct jtext_reader *rd, struct record_table **t,
		     char *nas, size_t nsz, int64_t *built)
{
	int64_t version = jflat_int(&rd->head, "version");
	char *nas_buf = NULL;
	int e = 0;

	if (version > RECORD_VERSION) {
		record_newer(r, version);
	} else if (version < 1 || !rd->list ||
		   get_name(&rd->head, "nas", nsz - 1, 0, &nas_buf) < 0) {
		set_aside(r, "not a record of a known version");
	} else if (!(e = load_entries(r, rd, t, version == 1 ? (nas_buf ? nas_buf : "") :
				      NULL))) {
		r->file_older = version < RECORD_VERSION;
		snprintf(nas, nsz, "%s", nas_buf ? nas_buf : "");
		*built = jflat_int(&rd->head, "built");
	}
	free(nas_buf);
	return e;
}

int record_load(struct record *r, struct record_table **t, char *nas, size_t nsz,
		int64_t *built)
{
	struct jtext_reader rd;
	char *text = NULL, why[160];
	size_t len;
	int e = durable_read(r->path, RECORD_MAX_BYTES, &text, &len);

	*t = NULL;
	nas[0] = '\0';
	*built = 0;
	if (e == -ENOMEM)
		return e;
	if (e) {
		/* set aside for what it is (too large, and no later wfs's, whose
		 * cap may be larger; not a file); an error of the read (EIO,
		 * EACCES) says nothing of it: left in place */
		long long v = e == -EFBIG ? jtext_head_version(r->path, "entries") : 0;

		if (v > RECORD_VERSION) {
			record_newer(r, v);
		} else if (e == -EFBIG || e == -EINVAL || e == -ELOOP) {
			snprintf(why, sizeof(why), "%s", e == -EFBIG ? "larger than the cap" :
				 "not a regular file");
			set_aside(r, why);
		} else if (e < 0) {
			record_log(r, LOG_WARNING, "record %s cannot be read: %s; left as it is, "
				   "the record starts empty", r->path, strerror(-e));
		}
		*t = record_table_make(&(struct rnodes){ 0 }, &len);
		return *t ? 0 : -ENOMEM;
	}
	/* (laid out as record_text writes it, it is read a line at a time;
	 * any other layout is parsed whole: jtext.h) */
	e = jtext_read_open(&rd, text, len, "entries", why, sizeof(why));
	if (e == -EINVAL) {
		set_aside(r, why);
		e = 0;
	} else if (!e) {
		e = load_read(r, &rd, t, nas, nsz, built);
		jtext_read_close(&rd);
	}
	free(text);
	if (!*t && !e)
		*t = record_table_make(&(struct rnodes){ 0 }, &len);
	return e ? e : *t ? 0 : -ENOMEM;
}
