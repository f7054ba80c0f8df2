/* store_index.c - what the store keeps on disk: LOCAL_STORE's directories
 * and their modes (store_layout), the index (index.c's format) loaded at
 * start-up -- each record checked by store_verify.c -- and written when
 * dirty (store.h says when); tmp/ emptied and unreferenced copies removed
 * at start-up.  Linear in the number of blobs and files.
 *
 * Modes: the daemon (root) reads NAS files other users may not, so the
 * store must not hand their bytes out: LOCAL_STORE 0711 (its control
 * socket stays reachable by everyone), data/ and tmp/ 0700, copies 0400,
 * index.json 0600 (it names what is local).  A store an earlier version
 * made (0755, copies 0444) is tightened at start-up, never widened.
 *
 * Damage: nothing found on disk is trusted beyond what it proves.  An
 * index that cannot be read is moved aside and the store starts without
 * records, data/ kept (never served, not removed either: only an index read
 * whole says what is an orphan) -- or, when nothing says the index is
 * damaged (a later wfs's version, a read error), it is left in place and
 * never replaced (index_left); a record whose copy is not the file
 * verified is re-hashed before it serves (store_verify.c).
 */
#include "store.h"
#include "store_int.h"
#include "durable.h"
#include "fmt.h"
#include "hash.h"
#include "index.h"
#include "trim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <syslog.h>
#include <unistd.h>

/* ---- LOCAL_STORE's directories and modes ---- */

/* Clear the bits @drop of @path's mode.  Logged when it changes the mode
 * of a store that was there before (@known): one an earlier version made;
 * a new LOCAL_STORE directory is only the mount's mkdir. */
static void tighten(struct store *s, const char *path, mode_t drop, int known)
{
	struct stat st;
	mode_t now, want;

	/* a link is never followed: its target is not ours (a link as the
	 * index is damage, set aside by index_load) */
	if (lstat(path, &st) < 0 || S_ISLNK(st.st_mode))
		return;
	now = st.st_mode & 07777;
	want = now & ~drop;
	if (want == now)
		return;
	if (fchmodat(AT_FDCWD, path, want, AT_SYMLINK_NOFOLLOW) < 0)
		store_log_msg(s, LOG_WARNING, "start-up: cannot tighten the mode of %s from %04o to "
			      "%04o: %s", path, (unsigned)now, (unsigned)want, strerror(errno));
	else if (known)
		store_log_msg(s, LOG_NOTICE, "start-up: tightened the mode of %s from %04o to %04o "
			      "(made by an earlier version: other users must not read copies)",
			      path, (unsigned)now, (unsigned)want);
}

/* @path a directory of ours; @known: the store existed before (its index
 * did), so a missing directory is damage, not a first start. */
static void make_dir(struct store *s, const char *path, int known)
{
	struct stat st;

	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return;
	if (mkdir(path, 0700) == 0) {
		if (known)
			store_log_msg(s, LOG_WARNING, "start-up: %s was missing: created again", path);
		return;
	}
	store_log_msg(s, LOG_ERR, "start-up: cannot create %s: %s; no copy can be made, reads "
		      "are served from the NAS", path, strerror(errno));
}

void store_layout(struct store *s)
{
	char aside[PATH_MAX + 32];
	struct statvfs sv;
	int known = access(s->index_path, F_OK) == 0;

	make_dir(s, s->data_dir, known);
	make_dir(s, s->tmp_dir, known);
	/* not "missing" when the store is older than partial copies (an
	 * index of version 1 or 2); a partial file the index names that is
	 * gone is logged as such (store_part.c) */
	make_dir(s, s->part_dir, 0);
	snprintf(aside, sizeof(aside), "%s.damaged", s->index_path);
	tighten(s, s->dir, S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH, known);
	tighten(s, s->data_dir, S_IRWXG | S_IRWXO, known);
	tighten(s, s->tmp_dir, S_IRWXG | S_IRWXO, known);
	tighten(s, s->part_dir, S_IRWXG | S_IRWXO, known);
	tighten(s, s->index_path, S_IRWXG | S_IRWXO, known);
	tighten(s, aside, S_IRWXG | S_IRWXO, known);
	if (statvfs(s->dir, &sv) < 0)
		return;
	if (sv.f_flag & ST_RDONLY) {
		store_log_msg(s, LOG_ERR, "start-up: LOCAL_STORE %s is on a read-only filesystem: "
			      "promotions fail and reads of what is not local are served from the "
			      "NAS; the index cannot be written", s->dir);
	} else {
		uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
		uint64_t floor = policy_floor(s->opt.policy, (uint64_t)sv.f_blocks * sv.f_frsize);
		char a[32], f[32];

		if (avail <= floor + s->blk)
			store_log_msg(s, LOG_WARNING, "start-up: LOCAL_STORE %s is full (%s free, "
				      "min_free %s): nothing can be promoted until there is room; "
				      "reads of what is not local are served from the NAS", s->dir,
				      fmt_bytes(avail, a, sizeof(a)), fmt_bytes(floor, f, sizeof(f)));
	}
}

/* ---- the index ---- */

struct load {
	struct store *s;
	size_t local, rehash, dropped, bad, partial;
	size_t named, missing; /* local copies the index names; of them, not there */
	size_t pinned; /* records with "pinned" */
};

/* What a loaded record's copy became: 1 serves (counted in *@served), 2
 * re-hashed before it serves, else dropped. */
static void count_loaded(struct store *s, struct load *ld, int verdict, size_t *served)
{
	if (verdict == 1) {
		(*served)++;
	} else if (verdict == 2) {
		ld->rehash++;
	} else {
		ld->dropped++;
		s->index_dirty = 1; /* the record changed: write it at the next chance */
	}
}

static int load_rec(void *arg, const struct index_rec *r)
{
	struct load *ld = arg;
	struct store *s = ld->s;
	struct blob *b;
	int v;

	if (r->key[0] != '/') {
		ld->bad++; /* a key is a physical path: a damaged record */
		return 0;
	}
	if (store_find_locked(s, r->key))
		return 0; /* a damaged index naming a file twice: the first wins */
	b = store_insert_locked(s, r->key);
	if (!b)
		return -ENOMEM;
	blob_id_set_locked(s, b, r->id);
	b->size = r->size;
	b->nas_mtime = r->mtime;
	b->nas_ctime = r->ctime;
	b->pinned = (r->pinned ? PIN_HAND : 0) | (r->ref_pinned ? PIN_REF : 0);
	ld->pinned += r->pinned != 0;
	b->last_used = r->last_used;
	b->use_ns = r->use_ns ? r->use_ns : (uint64_t)(r->last_used > 0 ? r->last_used : 0) *
		    1000000000u;
	/* (a name is a hint -- the repo a hub-level store's blob is in: none
	 * kept for want of memory costs nothing the next open or promote does
	 * not give back) */
	if (r->name && *r->name)
		b->name = strdup(r->name);
	if (!strcmp(r->state, "mismatch")) {
		blob_state_set_locked(s, b, BLOB_MISMATCH);
		snprintf(b->reason, sizeof(b->reason), "%s", r->reason);
		return 0;
	}
	if (!strcmp(r->state, "partial")) {
		count_loaded(s, ld, part_load_locked(s, b, r), &ld->partial);
		return 0;
	}
	if (strcmp(r->state, "local"))
		return 0;
	if (!xxh128_hex_valid(r->sample)) {
		/* nothing to vouch for its source with: the copy goes with the
		 * orphans (its own hash is verify_loaded_locked's to check) */
		store_log_msg(s, LOG_WARNING, "start-up: dropped local copy of %s (its index "
			      "record holds no valid sampled hash of its source)", b->key);
		return 0;
	}
	blob_xxh_set_locked(s, b, r->xxh);
	snprintf(b->sample, sizeof(b->sample), "%s", r->sample);
	b->copy = (struct file_proof){ r->copy_ino, r->copy_mtime, r->copy_ctime };
	v = verify_loaded_locked(s, b);
	ld->named++;
	ld->missing += v == -ENOENT;
	count_loaded(s, ld, v, &ld->local);
	return 0;
}

static int load_ref(void *arg, const struct index_ref *r)
{
	struct store *s = ((struct load *)arg)->s;
	struct store_ref_rec *v;

	/* no pin is made with a name longer than a file name's (pins.c): a
	 * longer one is damage, and one cut short (mid-character, perhaps)
	 * would name another ref */
	if (strlen(r->repo) > NAME_MAX || strlen(r->ref) > NAME_MAX ||
	    strlen(r->commit) > NAME_MAX || strlen(r->pending) > NAME_MAX) {
		store_log_msg(s, LOG_WARNING, "start-up: dropped the pin of ref %.64s of %.64s "
			      "(a name in its index record is longer than %d bytes)", r->ref,
			      r->repo, NAME_MAX);
		return 0;
	}
	v = realloc(s->refs, (s->nrefs + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->refs = v;
	v += s->nrefs++;
	memset(v, 0, sizeof(*v));
	snprintf(v->repo, sizeof(v->repo), "%s", r->repo);
	snprintf(v->ref, sizeof(v->ref), "%s", r->ref);
	snprintf(v->commit, sizeof(v->commit), "%s", r->commit);
	snprintf(v->pending, sizeof(v->pending), "%s", r->pending);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* @path, a directory of the store's, for a walk that removes what it
 * finds: opened without following a link, in its last component (one
 * there is not ours: a data/<xx> linked elsewhere would have the files of
 * that directory removed).  NULL with errno set. */
static DIR *opendir_own(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);

	if (fd >= 0 && !d)
		close(fd);
	return d;
}

/* Remove the files of @dir that no name of @used (sorted) is: leftovers,
 * logged as "unreferenced @what".  A partial file the index no longer
 * names may be a second name of the copy its ranges became (a crash came
 * before it went: part_retire_locked): the copy, its ctime moved, is
 * proven again. */
static void drop_unnamed(struct store *s, const char *dir, const char **used, size_t n,
			 const char *what)
{
	DIR *d = opendir_own(dir);
	struct dirent *fe;

	if (!d) {
		if (errno == ELOOP || errno == ENOTDIR)
			store_log_msg(s, LOG_WARNING, "start-up: %s is not a directory of the "
				      "store (a link?): nothing in it removed", dir);
		return;
	}
	while ((fe = readdir(d))) {
		const char *name = fe->d_name;
		struct stat st;
		int linked;

		if (name[0] == '.' || bsearch(&name, used, n, sizeof(*used), cmp_str))
			continue;
		linked = fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			 S_ISREG(st.st_mode) && st.st_nlink > 1;
		if (unlinkat(dirfd(d), name, 0) < 0)
			continue;
		store_log_msg(s, LOG_NOTICE, "start-up: removed unreferenced %s %s/%s", what, dir,
			      name);
		if (linked)
			store_reprove_locked(s, (uint64_t)st.st_ino);
	}
	closedir(d);
}

/* Is a damaged index set aside (index.json.damaged, .damaged.1 ...) still
 * there?  The copies it names are no LOCAL blob's now, and would be
 * removed as leftovers at this start or the next -- before the operator
 * could put it back: kept until it is gone (said). */
static int index_set_aside(struct store *s)
{
	char aside[PATH_MAX + 32];

	if (!durable_aside_found(s->index_path, aside, sizeof(aside)))
		return 0;
	store_log_msg(s, LOG_WARNING, "start-up: %s is there: files in data/ and parts/ that the "
		      "index does not name are kept (it may name them); put it back as %s, or "
		      "remove it", aside, s->index_path);
	return 1;
}

/* Local files no LOCAL blob names are leftovers: remove them, and partial
 * files no blob's ranges are in.  The names in use are sorted once, each
 * file looked up by bisection: O((blobs + files) log blobs), not one table
 * scan per file. */
static void drop_orphans(struct store *s)
{
	size_t cap = s->blobs.count ? s->blobs.count : 1, n = 0, np = 0, nparts = 1;
	const char **used, **pused;
	char (*pnames)[33];
	DIR *top = NULL;
	struct dirent *de;

	STORE_EACH(s, b)
		nparts += b->part != NULL;
	used = malloc(cap * sizeof(*used));
	pused = malloc(nparts * sizeof(*pused));
	pnames = malloc(nparts * sizeof(*pnames));
	if (index_set_aside(s))
		goto out;
	if (used && pused && pnames)
		top = opendir_own(s->data_dir);
	if (!top)
		goto out; /* nothing removed: leftovers only cost space */
	STORE_EACH(s, b) {
		if (b->state == BLOB_LOCAL || b->reverify)
			used[n++] = b->xxh;
		if (b->part && (b->part->n || b->part->unproven)) {
			part_name(b, pnames[np]);
			pused[np] = pnames[np];
			np++;
		}
	}
	qsort(used, n, sizeof(*used), cmp_str);
	qsort(pused, np, sizeof(*pused), cmp_str);
	while ((de = readdir(top))) {
		char sub[PATH_MAX + 300];

		if (de->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", s->data_dir, de->d_name);
		drop_unnamed(s, sub, used, n, "copy");
	}
	closedir(top);
	drop_unnamed(s, s->part_dir, pused, np, "partial copy");
out:
	free(used);
	free(pused);
	free(pnames);
}

/* @fn(@arg, name) for each regular file directly in @dir, until it
 * returns non-zero (returned).  A directory that cannot be opened has
 * none. */
static int each_file_in(const char *dir, int (*fn)(void *arg, const char *name), void *arg)
{
	DIR *d = opendir_own(dir);
	struct dirent *de;
	int r = 0;

	while (!r && d && (de = readdir(d)))
		if (de->d_type == DT_REG)
			r = fn(arg, de->d_name);
	if (d)
		closedir(d);
	return r;
}

/* The same for each file under data/<xx>/. */
static int each_copy(const char *data_dir, int (*fn)(void *arg, const char *name), void *arg)
{
	DIR *top = opendir_own(data_dir);
	struct dirent *de;
	int r = 0;

	while (!r && top && (de = readdir(top))) {
		char sub[PATH_MAX + 300];

		if (de->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", data_dir, de->d_name);
		r = each_file_in(sub, fn, arg);
	}
	if (top)
		closedir(top);
	return r;
}

static int count_one(void *arg, const char *name)
{
	(void)name;
	++*(size_t *)arg;
	return 0;
}

/* Regular files under data/<xx>/ (for the log). */
static size_t count_copies(const char *data_dir)
{
	size_t n = 0;

	each_copy(data_dir, count_one, &n);
	return n;
}

/* The index could not be read (@err, index.h): kept for the operator as
 * index.json.damaged (.1, .2 ... beside an earlier one), never parsed
 * again; the store starts without records. */
static void index_damaged(struct store *s, int err)
{
	char aside[PATH_MAX + 32], why[128], moved[PATH_MAX + 96];
	size_t copies = count_copies(s->data_dir);
	int r;

	if (err == -EFBIG)
		snprintf(why, sizeof(why), "larger than %lld MiB: not read",
			 INDEX_MAX_BYTES >> 20);
	else if (err == -EINVAL)
		snprintf(why, sizeof(why), "truncated, not JSON, or not an index of a known version");
	else
		snprintf(why, sizeof(why), "%s", strerror(-err));
	if ((r = durable_set_aside(s->index_path, aside, sizeof(aside))) == 0)
		snprintf(moved, sizeof(moved), "moved aside to %s", aside);
	else
		snprintf(moved, sizeof(moved), "cannot move it aside (%s): the next index write "
			 "replaces it", strerror(-r));
	store_log_msg(s, LOG_ERR, "start-up: index %s unreadable (%s); %s.  Starting with no "
		      "records: what was local is served from the NAS until promoted again; the %zu "
		      "files in %s are kept but never served (to use them again stop wfs, put the "
		      "index back, start it; the next start-up with a readable index removes them)",
		      s->index_path, why, moved, copies, s->data_dir);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

static int keep_one(void *arg, const char *name)
{
	struct kept_names *k = arg;

	if (strlen(name) != 32)
		return 0; /* (not a copy's name: nothing it could be asked to remove) */
	if (k->n == k->cap) {
		size_t cap = k->cap ? 2 * k->cap : 256;
		char (*v)[33] = realloc(k->v, cap * 33);

		if (!v)
			return -ENOMEM;
		k->v = v;
		k->cap = cap;
	}
	memcpy(k->v[k->n++], name, 33);
	return 0;
}

static void kept_sort(struct kept_names *k)
{
	if (k->n > 1)
		qsort(k->v, k->n, 33, by_name);
}

/* The copies in data/ and the partial files in parts/ now, into s->kept
 * and s->kept_parts (sorted): the index left as it is names them, and
 * this run removes and writes none of them (store_kept_copy,
 * store_kept_part).  No memory for a whole list: logged, and those listed
 * before are kept. */
static void kept_files_read(struct store *s)
{
	if (each_copy(s->data_dir, keep_one, &s->kept) < 0 ||
	    each_file_in(s->part_dir, keep_one, &s->kept_parts) < 0)
		store_log_msg(s, LOG_ERR, "start-up: no memory to list the files in %s and %s: "
			      "this run may remove some", s->data_dir, s->part_dir);
	kept_sort(&s->kept);
	kept_sort(&s->kept_parts);
}

static int kept_has(const struct kept_names *k, const char *name)
{
	return k->n && bsearch(name, k->v, k->n, 33, by_name) != NULL;
}

int store_kept_copy(const struct store *s, const char *xxh)
{
	return kept_has(&s->kept, xxh);
}

int store_kept_part(const struct store *s, const char *name)
{
	return kept_has(&s->kept_parts, name);
}

/* The index could not be read (@r: a version newer than this wfs's, or a
 * read error), yet nothing says it is damaged: a later wfs wrote it (a
 * downgrade), or the disk failed a read it may not fail again.  Moved
 * aside, it would be replaced by an index naming none of its copies, and
 * the start-up after that would remove them all: it is left as it is,
 * unread, never written over, and data/ is left alone. */
static void index_left(struct store *s, int r)
{
	char why[128];

	s->index_kept = 1;
	kept_files_read(s);
	if (r > INDEX_VERSION)
		snprintf(why, sizeof(why), "is of version %d, newer than this wfs (%d)", r,
			 INDEX_VERSION);
	else
		snprintf(why, sizeof(why), "cannot be read (%s)", strerror(-r));
	store_log_msg(s, LOG_ERR, "start-up: index %s %s: left as it is, not read and never "
		      "replaced.  Starting with no records: what was local is served from the NAS, "
		      "copies made meanwhile are not recorded; the %zu files in %s are kept, never "
		      "served and never removed by this run (%s to use them)", s->index_path, why,
		      count_copies(s->data_dir), s->data_dir, r > INDEX_VERSION ?
		      "run the wfs that wrote the index" : "restart once the index reads");
}

/* Not one of the @n local copies the index names is there, nor any other
 * file in data/: data/ is most likely out of reach (a disk not mounted
 * yet, a link that dangles), not emptied.  Written as it is now, the index
 * would name none of them, and the start after the disk is back would
 * remove them all: it is left as it is, never replaced, and nothing is
 * removed by this run (as index_left). */
static void copies_out_of_reach(struct store *s, size_t n)
{
	s->index_kept = 1;
	store_log_msg(s, LOG_ERR, "start-up: not one of the %zu local copies index %s names is in "
		      "%s (not mounted, or moved?): the index is left as it is, never replaced, "
		      "and nothing in it or in %s removed by this run; what was local is served "
		      "from the NAS, copies made meanwhile are not recorded.  Restart once the "
		      "copies are there (or remove the index to start afresh)", n, s->index_path,
		      s->data_dir, s->data_dir);
}

int index_load(struct store *s)
{
	struct load ld = { .s = s };
	struct index_cb cb = { .arg = &ld, .blob = load_rec, .ref = load_ref };
	int r;

	pthread_mutex_lock(&s->lock);
	r = index_read(s->index_path, &cb);
	if (r == -ENOMEM) {
		pthread_mutex_unlock(&s->lock);
		return r;
	}
	/* Damage is what the file holds (not JSON, not an index, too large, a
	 * link or not a file): any other error says nothing of it. */
	if (r > INDEX_VERSION || (r < 0 && r != -EINVAL && r != -EFBIG && r != -ELOOP)) {
		index_left(s, r);
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (r < 0) {
		/* Nothing was loaded (index_read calls back only once the
		 * whole file parsed): no record, and no orphan either. */
		index_damaged(s, r);
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	/* The sources, without the lock (NAS I/O; store.h); a copy dropped
	 * for its source is an orphan below. */
	pthread_mutex_unlock(&s->lock);
	ld.dropped += verify_sources_loaded(s);
	pthread_mutex_lock(&s->lock);
	ld.local = ld.rehash = 0;
	STORE_EACH(s, b) {
		ld.local += b->state == BLOB_LOCAL;
		ld.rehash += b->reverify || (b->part && b->part->unproven);
		ld.partial += b->part && b->part->n && !b->part->unproven;
	}
	if (r == 1 && ld.local + ld.rehash + ld.dropped)
		store_log_msg(s, LOG_NOTICE, "start-up: index %s was written by an earlier version "
			      "(1, no proof of the copies): its %zu local copies are re-hashed in "
			      "the background before they serve", s->index_path, ld.rehash);
	if (r < 4 && ld.pinned)
		store_log_msg(s, LOG_NOTICE, "start-up: index %s was written by an earlier version "
			      "(%d, one pin for both reasons): its %zu pinned blobs are read as pinned "
			      "by hand, which no ref pin undoes (wfsctl unpin PATH does)",
			      s->index_path, r, ld.pinned);
	if (ld.bad)
		store_log_msg(s, LOG_WARNING, "start-up: index %s: %zu damaged records skipped",
			      s->index_path, ld.bad);
	if (r > 0)
		store_log_msg(s, LOG_INFO, "start-up: index %s (version %d): %zu local copies "
			      "and %zu partial copies served, %zu re-hashed before they serve, %zu "
			      "dropped", s->index_path, r, ld.local, ld.partial, ld.rehash, ld.dropped);
	/* (one copy missing is one removed; all of several, with nothing
	 * in data/ at all, is data/ not there) */
	if (ld.named >= 2 && ld.missing == ld.named && count_copies(s->data_dir) == 0)
		copies_out_of_reach(s, ld.named);
	else
		drop_orphans(s);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Write the index; with @if_dirty only if it is behind the table.  The
 * dirty flag is looked at under index_lock: a write in flight (a worker's)
 * has cleared it already, and the caller must not return before that
 * write is on disk (or has failed, which sets the flag again). */
static int write_index(struct store *s, int if_dirty, int held)
{
	struct index_snapshot sn = { 0 };
	int64_t t0 = store_now_ms();
	int r;

	if (!held) {
		pthread_mutex_lock(&s->index_lock);
		/* (the snapshot's memory made before s->lock is taken; what
		 * could not be, it makes under the lock) */
		if (!s->index_kept)
			(void)snapshot_prepare(s, &sn);
		pthread_mutex_lock(&s->lock);
	}
	/* An index left as it was (index_left) is never replaced: the table
	 * is as written as it will be, or the workers would try again and
	 * again. */
	r = (if_dirty && !s->index_dirty) || s->index_kept ? 1 : snapshot_take_locked(s, &sn);
	if (r == 0 || s->index_kept) { /* what changes from here on is in the next write */
		s->index_dirty = 0;
		s->copies_unrecorded = 0;
	}
	if (r == 0)
		part_retire_snapshot_locked(s);
	if (!held)
		pthread_mutex_unlock(&s->lock);
	if (r == 0) {
		r = index_write(s->index_path, sn.recs, sn.n, sn.refs, sn.nrefs);
		s->index_writes++;
		s->index_snap_bytes = sn.bytes;
		atomic_store_explicit(&s->index_write_ms, store_now_ms() - t0, memory_order_relaxed);
		if (!held)
			pthread_mutex_lock(&s->lock);
		/* the partial files whose ranges it no longer names */
		part_retire_written_locked(s, r == 0);
		/* Still behind: a worker tries again in index_flush_ms (not at
		 * once -- copies_unrecorded stays clear, or an idle worker would
		 * spin on a full disk), and store_sync at once. */
		if (r < 0)
			store_dirty_locked(s);
		if (!held)
			pthread_mutex_unlock(&s->lock);
	}
	/* A store that cannot be written (read-only, full) fails every
	 * write: said once, and again once it worked in between. */
	if (r < 0 && -r != s->index_err)
		store_log_msg(s, LOG_ERR, "cannot write index %s: %s%s", s->index_path,
			      strerror(-r), r == -EFBIG ? " (over the size cap; the last index "
			      "written stays)" : "");
	if (r <= 0)
		s->index_err = r < 0 ? -r : 0;
	if (!held)
		pthread_mutex_unlock(&s->index_lock);
	snapshot_free(&sn);
	if (r == 0)
		heap_give_back(); /* the snapshot and the text: glibc would keep them */
	return r < 0 ? r : 0;
}

int store_write_index(struct store *s)
{
	return write_index(s, 0, 0);
}

int store_write_index_if_dirty(struct store *s)
{
	return write_index(s, 1, 0);
}

int store_write_index_held(struct store *s)
{
	return write_index(s, 0, 1);
}

/* Is @name what durable_replace writes before its rename, for one of the
 * store's own files ("index.json.<pid>.tmp", "record.json.<pid>.tmp")?
 * A crash between its write and its rename leaves one; the next start,
 * holding the store's lock, is the only writer. */
static int stale_replace_tmp(const char *name)
{
	static const char *const own[] = { "index.json.", "record.json." };

	for (size_t i = 0; i < sizeof(own) / sizeof(*own); i++) {
		size_t n = strlen(own[i]), d;

		if (strncmp(name, own[i], n))
			continue;
		d = strspn(name + n, "0123456789");
		return d > 0 && !strcmp(name + n + d, ".tmp");
	}
	return 0;
}

/* Unlink every entry of @dir that @pick(name) picks; how many went. */
static int unlink_picked(const char *dir, int (*pick)(const char *name))
{
	DIR *d = opendir_own(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (pick(de->d_name) && unlinkat(dirfd(d), de->d_name, 0) == 0)
			n++;
	closedir(d);
	return n;
}

static int not_dot(const char *name)
{
	return name[0] != '.';
}

void store_empty_tmp(struct store *s)
{
	int n = unlink_picked(s->tmp_dir, not_dot);

	if (n)
		store_log_msg(s, LOG_NOTICE, "start-up: discarded %d unverified copies in %s", n,
			      s->tmp_dir);
	if ((n = unlink_picked(s->dir, stale_replace_tmp)))
		store_log_msg(s, LOG_NOTICE, "start-up: removed %d temporary files in %s left by "
			      "an index or record write that did not finish", n, s->dir);
}
