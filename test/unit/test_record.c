/* test_record.c - the store's record of its local revisions, without
 * mounting: what a build keeps of a hub tree (local files, the links and
 * directories that reach them, refs with their bytes, the local revision's
 * .no_exist markers and its file list trees/<rev>.json with their bytes,
 * a file list over RECORD_MAX_TREE left out and logged once; nothing
 * else), that
 * record.json brings the same answers back after a restart, that a damaged
 * file is set aside and a newer one left alone, that hostile entries are
 * refused, that record_sync waits for a build of the thread, and that
 * the thread builds (walks the NAS) when an open names a repo, not for the
 * first open of a local copy by a name in its own. */
#include "check.h"
#include "collect.h"
#include "record.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/* sha256("hello\n") and git's blob SHA-1 of it: both content addresses hold */
#define H256 "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
#define H1 "ce013625030ba8dba906f756967f9e9ca394464a"
#define OTHER "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define REV "0123456789abcdef0123456789abcdef01234567"
#define REPO "models--o--n"
#define SNAP REPO "/snapshots/" REV
#define GONE "fedcba9876543210fedcba9876543210fedcba98" /* a revision not in snapshots/ */
#define ODD "odd\xff\x01name"

/* --wrap=durable_read: with read_fails set, the next read of a file
 * whole (record.json's load) fails with that errno, once. */
static _Atomic int read_fails;
int __real_durable_read(const char *path, size_t max, char **out, size_t *len);
int __wrap_durable_read(const char *path, size_t max, char **out, size_t *len);

int __wrap_durable_read(const char *path, size_t max, char **out, size_t *len)
{
	int e = atomic_exchange(&read_fails, 0);

	return e ? -e : __real_durable_read(path, max, out, len);
}

static char top[PATH_MAX], nas[PATH_MAX];
/* REV's file list: more than a refs file's RECORD_MAX_DATA, so its own bound counts */
static char tree_text[6000];

struct logs {
	pthread_mutex_t lock;
	int n;
	char all[16384];
};

static void log_line(void *arg, int prio, const char *msg)
{
	struct logs *l = arg;

	(void)prio;
	pthread_mutex_lock(&l->lock);
	l->n++;
	if (strlen(l->all) + strlen(msg) + 2 < sizeof(l->all)) {
		strcat(l->all, msg);
		strcat(l->all, "\n");
	}
	pthread_mutex_unlock(&l->lock);
}

static int logged(struct logs *l, const char *what)
{
	int yes;

	pthread_mutex_lock(&l->lock);
	yes = strstr(l->all, what) != NULL;
	pthread_mutex_unlock(&l->lock);
	return yes;
}

static void hub(void)
{
	static const char *const dirs[] = { REPO, REPO "/blobs", REPO "/snapshots", SNAP,
		SNAP "/sub", SNAP "/sub/dir", REPO "/refs", REPO "/.no_exist",
		REPO "/.no_exist/" REV, REPO "/.no_exist/" REV "/sub", REPO "/.no_exist/" GONE,
		"models--x--y", "models--x--y/blobs",
		"models--x--y/snapshots", "models--x--y/snapshots/" REV, "models--x--y/refs",
		"hubstore", "models--h--s", "models--h--s/blobs", "models--h--s/snapshots",
		"models--h--s/snapshots/" REV, REPO "/trees", "models--h--s/trees",
		"models--h--t", "models--h--t/blobs", "models--h--t/snapshots",
		"models--h--t/snapshots/" REV };
	size_t len = 0;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		check_mk(nas, dirs[i]);
	check_put(nas, REPO "/blobs/" H256, "hello\n");
	check_put(nas, REPO "/blobs/" H1, "hello\n");
	check_put(nas, REPO "/blobs/" OTHER, "other");
	check_ln(nas, "../../blobs/" H256, SNAP "/config.json");
	check_ln(nas, "../../../../blobs/" H1, SNAP "/sub/dir/file");
	check_ln(nas, "../../blobs/" OTHER, SNAP "/other.bin");
	check_ln(nas, "../../blobs/" H256, SNAP "/" ODD);
	/* links to directories: one in the revision (kept, its files are),
	 * one out of it (never) */
	check_ln(nas, "sub", SNAP "/latest");
	check_ln(nas, "../../blobs", SNAP "/blobs-dir");
	check_put(nas, REPO "/refs/main", REV);
	check_put(nas, REPO "/.no_exist/" REV "/missing.txt", "");
	check_put(nas, REPO "/.no_exist/" REV "/sub/missing.json", "");
	check_put(nas, REPO "/.no_exist/" GONE "/other.txt", "");
	/* the file lists of recent clients: the local revision's (kept with
	 * its bytes), another revision's and a file that is no list (not) */
	len += (size_t)snprintf(tree_text, sizeof(tree_text), "{\"files\": {");
	for (int i = 0; len + 80 < sizeof(tree_text); i++)
		len += (size_t)snprintf(tree_text + len, sizeof(tree_text) - len,
					"\"shard-%05d.safetensors\": {\"size\": %d}, ", i, i * 7919);
	snprintf(tree_text + len, sizeof(tree_text) - len, "\"x\": {}}}");
	check_put(nas, REPO "/trees/" REV ".json", tree_text);
	check_put(nas, REPO "/trees/" GONE ".json", "{\"files\": {}}");
	check_put(nas, REPO "/trees/notes.txt", "not a list");
	/* over RECORD_MAX_TREE: left out, said once */
	check_put_pattern(nas, "models--h--s/trees/" REV ".json", RECORD_MAX_TREE + 1, 3);
	check_put(nas, "models--x--y/blobs/" OTHER, "other too");
	check_ln(nas, "../../blobs/" OTHER, "models--x--y/snapshots/" REV "/w");
	check_put(nas, "models--x--y/refs/main", REV);
	/* a repo whose blob lives in a hub-level store outside the repos */
	check_put(nas, "hubstore/blob1", "hub level\n");
	check_ln(nas, "../../hubstore/blob1", "models--h--s/blobs/hid");
	check_ln(nas, "../../blobs/hid", "models--h--s/snapshots/" REV "/f");
	/* another, promoted by its revision and never opened */
	check_put(nas, "hubstore/blob2", "hub level too\n");
	check_ln(nas, "../../hubstore/blob2", "models--h--t/blobs/tid");
	check_ln(nas, "../../blobs/tid", "models--h--t/snapshots/" REV "/g");
}

static struct blob *promote(struct store *s, const char *rel, const char *id)
{
	char p[PATH_MAX * 2];
	struct stat st;
	struct blob *b;

	check_path(p, sizeof(p), nas, rel);
	if (stat(p, &st) < 0 || !(b = store_blob(s, p, &st, id)))
		return NULL;
	store_promote(s, b, 0, 1);
	return store_wait_settled(s, b, 30000) == BLOB_LOCAL ? b : NULL;
}

/* The children of @rel, joined by '|'; "ENOENT" if not a recorded dir. */
static const char *list(struct record *r, const char *rel)
{
	static char out[4096];
	char **names;
	size_t n;

	out[0] = '\0';
	if (record_list(r, rel, &names, &n) < 0)
		return "ENOENT";
	for (size_t i = 0; i < n; i++) {
		if (i)
			strcat(out, "|");
		strncat(out, names[i], sizeof(out) - strlen(out) - 2);
		free(names[i]);
	}
	free(names);
	return out;
}

static struct record_entry ent;

static int look(struct record *r, const char *rel)
{
	return record_lookup(r, rel, &ent);
}

/* Are the bytes kept for @rel @want (and its entry's size their length)? */
static int bytes_are(struct record *r, const char *rel, const char *want)
{
	char *data;
	int same;

	if (record_lookup_data(r, rel, &ent, &data) < 0 || !data)
		return 0;
	same = ent.has_data && ent.data_len == strlen(want) &&
	       ent.e.st.st_size == (off_t)ent.data_len && !memcmp(data, want, ent.data_len);
	free(data);
	return same;
}

/* How many log lines hold @what. */
static int times_logged(struct logs *l, const char *what)
{
	int n = 0;

	pthread_mutex_lock(&l->lock);
	for (const char *p = l->all; (p = strstr(p, what)); p += strlen(what))
		n++;
	pthread_mutex_unlock(&l->lock);
	return n;
}

/* What a build of the tree with H256 and H1 local must answer. */
static void answers(struct check_count *c, struct record *r, const char *when)
{
	char p[PATH_MAX * 2], got[PATH_MAX];
	struct stat st;

	CHECK(c, look(r, SNAP "/config.json") == 0 && ent.e.kind == NS_LINK &&
	      ent.e.link_state == NS_LINK_RESOLVED && !strcmp(ent.e.target, "../../blobs/" H256) &&
	      !strcmp(ent.e.blob_id, H256), "%s: snapshot link: kind %d target %s", when,
	      ent.e.kind, ent.e.target);
	CHECK(c, look(r, SNAP "/sub/dir/file") == 0 && ent.e.kind == NS_LINK &&
	      !strcmp(ent.e.target, "../../../../blobs/" H1), "%s: nested link %s", when,
	      ent.e.target);
	CHECK(c, look(r, SNAP "/" ODD) == 0 && ent.e.kind == NS_LINK,
	      "%s: a name that is not UTF-8", when);
	check_path(p, sizeof(p), nas, REPO "/blobs/" H256);
	stat(p, &st);
	CHECK(c, look(r, REPO "/blobs/" H256) == 0 && ent.e.kind == NS_FILE &&
	      ent.e.st.st_size == 6 && ent.e.st.st_ino == st.st_ino &&
	      ent.e.st.st_mtim.tv_nsec == st.st_mtim.tv_nsec && !strcmp(ent.e.backing, p) &&
	      !(ent.e.st.st_mode & 0222), "%s: blob file: kind %d size %lld", when, ent.e.kind,
	      (long long)ent.e.st.st_size);
	CHECK(c, look(r, SNAP "/latest") == 0 && ent.e.kind == NS_LINK &&
	      !strcmp(ent.e.target, "sub"), "%s: a link to a directory of the revision", when);
	CHECK(c, look(r, SNAP "/blobs-dir") == -ENOENT, "%s: a link out of the revision", when);
	CHECK(c, !strcmp(list(r, SNAP), "config.json|latest|" ODD "|sub"),
	      "%s: snapshot lists %s", when, list(r, SNAP));
	CHECK(c, !strcmp(list(r, REPO "/blobs"), H256 "|" H1), "%s: blobs list %s", when,
	      list(r, REPO "/blobs"));
	CHECK(c, !strcmp(list(r, REPO), ".no_exist|blobs|refs|snapshots|trees"),
	      "%s: repo lists %s", when, list(r, REPO));
	CHECK(c, !strcmp(list(r, ""), REPO), "%s: root lists %s", when, list(r, ""));
	CHECK(c, look(r, "") == 0 && ent.e.kind == NS_DIR, "%s: the root", when);
	CHECK(c, bytes_are(r, REPO "/refs/main", REV), "%s: refs/main bytes", when);
	CHECK(c, look(r, SNAP "/other.bin") == -ENOENT && look(r, REPO "/blobs/" OTHER) == -ENOENT,
	      "%s: a file that is not local is absent", when);
	CHECK(c, look(r, "models--x--y") == -ENOENT && !strcmp(list(r, "models--x--y"), "ENOENT"),
	      "%s: a repo with nothing local is absent", when);
	/* offline loading (huggingface_hub's try_to_load_from_cache) asks
	 * .no_exist/<rev>/<path> before the snapshot: a local revision's
	 * markers are kept, another's not */
	CHECK(c, look(r, REPO "/.no_exist/" REV "/missing.txt") == 0 && ent.e.kind == NS_FILE &&
	      ent.has_data && ent.data_len == 0 && ent.e.st.st_size == 0,
	      "%s: a marker of the local revision", when);
	CHECK(c, look(r, REPO "/.no_exist/" REV "/sub/missing.json") == 0 &&
	      !strcmp(list(r, REPO "/.no_exist/" REV), "missing.txt|sub"),
	      "%s: markers list %s", when, list(r, REPO "/.no_exist/" REV));
	CHECK(c, !strcmp(list(r, REPO "/.no_exist"), REV), "%s: another revision's markers: %s",
	      when, list(r, REPO "/.no_exist"));
	/* recent clients read trees/<rev>.json offline to tell a complete
	 * snapshot from an incomplete one: the local revision's, byte-equal */
	CHECK(c, look(r, REPO "/trees/" REV ".json") == 0 && ent.e.kind == NS_FILE &&
	      ent.data_len > RECORD_MAX_DATA && bytes_are(r, REPO "/trees/" REV ".json", tree_text),
	      "%s: the revision's file list (%zu bytes)", when, ent.data_len);
	CHECK(c, !strcmp(list(r, REPO "/trees"), REV ".json"), "%s: trees lists %s", when,
	      list(r, REPO "/trees"));
	CHECK(c, record_has_any(r), "%s: has any", when);
	record_nas(r, got, sizeof(got));
	CHECK(c, !strcmp(got, nas), "%s: nas %s", when, got);
}

static void write_record(const char *dir, const char *text)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
	check_write_file(p, text, strlen(text));
}

static int exists(const char *dir, const char *name)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

static char *slurp(const char *dir)
{
	char p[PATH_MAX * 2], *buf = calloc(1, 1 << 20);
	FILE *f;

	snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
	f = fopen(p, "r");
	if (f) {
		if (fread(buf, 1, (1 << 20) - 1, f) == 0)
			buf[0] = '\0';
		fclose(f);
	}
	return buf;
}

/* @text is JSON: version 1, a "built" time, @entries entries, an entry
 * a line (a head line, the entries, the closing line). */
static int file_is(const char *text, size_t entries)
{
	json_t *o = json_loads(text, 0, NULL);
	size_t lines = 0;
	int ok;

	for (const char *c = text; *c; c++)
		lines += *c == '\n';
	ok = o && json_integer_value(json_object_get(o, "version")) == 1 &&
	     json_is_integer(json_object_get(o, "built")) &&
	     json_array_size(json_object_get(o, "entries")) == entries && lines == entries + 2;
	json_decref(o);
	return ok;
}

/* Write @text's JSON to @path again, indented. */
static int relayout(const char *path, const char *text)
{
	json_t *o = json_loads(text, 0, NULL);
	int e = o ? json_dump_file(o, path, JSON_INDENT(1) | JSON_SORT_KEYS) : -1;

	json_decref(o);
	return e;
}

#define MV "models--m--v"
#define R1 "1111111111111111111111111111111111111111"
#define R2 "2222222222222222222222222222222222222222"

static int held_is(struct record *r, const char *shows, const char *nas_rev)
{
	struct record_held *v;
	size_t n;
	int ok = record_held_refs(r, &v, &n) == 0 &&
		 (shows ? n == 1 && !strcmp(v[0].path, MV "/refs/main") &&
		  !strcmp(v[0].shows, shows) && !strcmp(v[0].nas, nas_rev) : n == 0);

	free(v);
	return ok;
}

/* The thread's builds so far; its looks in *@looks. */
static uint64_t builds(struct record *r, uint64_t *looks)
{
	uint64_t n;

	pthread_mutex_lock(&r->lock);
	n = r->built_gen;
	*looks = r->looks;
	pthread_mutex_unlock(&r->lock);
	return n;
}

/* Until the thread has looked at the local copies after this call (its
 * second look from now: the first may have begun before), or it has built
 * past @gen, at most 30 s.  Its builds then. */
static uint64_t after_a_look(struct record *r, uint64_t gen)
{
	const struct timespec tick = { 0, 10 * 1000 * 1000 };
	uint64_t looks, from, n = builds(r, &from);

	for (int i = 0; i < 3000 && n <= gen && (n = builds(r, &looks), looks < from + 2); i++)
		nanosleep(&tick, NULL);
	return n;
}

/* An open sets the blob's name: one in the blob's own repo changes no
 * walk, and the thread builds nothing for it (a NAS walk of the repo for
 * reading local bytes); one in another repo leads a walk there. */
static void opens(struct check_count *c, struct record *r, struct store *s, struct blob *own,
		  struct blob *other)
{
	uint64_t looks, gen = builds(r, &looks);

	store_note_open(s, own, SNAP "/config.json");
	store_note_close(s, own);
	CHECK(c, after_a_look(r, gen) == gen, "the first open of a local copy by a name in its "
	      "own repo: no build (builds %llu -> %llu)", (unsigned long long)gen,
	      (unsigned long long)builds(r, &looks));
	gen = builds(r, &looks);
	store_note_open(s, other, "models--h--s/snapshots/" REV "/g");
	store_note_close(s, other);
	CHECK(c, after_a_look(r, gen) > gen, "an open by a name in another repo: a build");
}

/* A copy evicted, made again and evicted: the thread sees each change by
 * itself (no sync asked) and builds, the answer following the copy. */
static void local_changes(struct check_count *c, struct record *r, struct store *s,
			  struct blob *b)
{
	uint64_t looks, gen = builds(r, &looks);

	CHECK(c, store_evict(s, b, 0) == 1, "evict");
	CHECK(c, after_a_look(r, gen) > gen && look(r, REPO "/blobs/" H256) == -ENOENT,
	      "an eviction: the thread builds by itself, the blob is gone");
	gen = builds(r, &looks);
	CHECK(c, promote(s, REPO "/blobs/" H256, H256) == b, "local again");
	CHECK(c, after_a_look(r, gen) > gen && look(r, REPO "/blobs/" H256) == 0,
	      "a copy made: the thread builds by itself, the blob is back");
	gen = builds(r, &looks);
	CHECK(c, store_evict(s, b, 0) == 1, "evict again");
	CHECK(c, after_a_look(r, gen) > gen && look(r, REPO "/blobs/" H256) == -ENOENT,
	      "evicted again: built, gone");
}

/* A ref moved on the NAS to a revision not all local: the record keeps
 * showing it at the one it showed, all local, until the new one is; the
 * NAS's bytes kept beside (record_held_refs), across a reopen. */
static void held(struct check_count *c, struct logs *lg, struct store *s,
		 const struct hub_roots *roots)
{
	static const char *const dirs[] = { MV, MV "/blobs", MV "/snapshots",
		MV "/snapshots/" R1, MV "/snapshots/" R2, MV "/refs" };
	char dir[PATH_MAX * 2];
	struct record r;
	struct blob *b;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		check_mk(nas, dirs[i]);
	check_put(nas, MV "/blobs/ida", "a\n");
	check_put(nas, MV "/blobs/idb", "b\n");
	check_ln(nas, "../../blobs/ida", MV "/snapshots/" R1 "/f");
	check_ln(nas, "../../blobs/ida", MV "/snapshots/" R2 "/f");
	check_ln(nas, "../../blobs/idb", MV "/snapshots/" R2 "/g");
	check_put(nas, MV "/refs/main", R1);
	snprintf(dir, sizeof(dir), "%s/held", top);
	mkdir(dir, 0700);
	CHECK(c, promote(s, MV "/blobs/ida", "ida") != NULL, "held: R1 local");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && record_rebuild(&r, roots, s) == 0 &&
	      bytes_are(&r, MV "/refs/main", R1) && held_is(&r, NULL, NULL), "held: R1 shown");
	check_put(nas, MV "/refs/main", R2);
	CHECK(c, record_rebuild(&r, roots, s) == 0 && bytes_are(&r, MV "/refs/main", R1) &&
	      held_is(&r, R1, R2), "held: the ref moved to R2, not all local: R1 still shown");
	CHECK(c, record_rebuild(&r, roots, s) == 0 && bytes_are(&r, MV "/refs/main", R1) &&
	      times_logged(lg, MV "/refs/main names " R2 ", not all local yet") == 1,
	      "held: logged once");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && bytes_are(&r, MV "/refs/main", R1) &&
	      held_is(&r, R1, R2), "held: the same after a reopen");
	b = promote(s, MV "/blobs/idb", "idb");
	CHECK(c, b && record_rebuild(&r, roots, s) == 0 && bytes_are(&r, MV "/refs/main", R2) &&
	      held_is(&r, NULL, NULL), "held: R2 all local: the NAS's ref shown");
	record_close(&r);
	/* a record that never showed the ref whole has nothing to hold it at */
	check_put(nas, MV "/refs/main", R1);
	CHECK(c, b && store_evict(s, b, 0) == 1, "held: idb evicted");
	check_put(nas, MV "/refs/main", R2);
	snprintf(dir, sizeof(dir), "%s/held2", top);
	mkdir(dir, 0700);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && record_rebuild(&r, roots, s) == 0 &&
	      bytes_are(&r, MV "/refs/main", R2) && held_is(&r, NULL, NULL),
	      "held: a first build shows the NAS's ref");
	record_close(&r);
}

/* A record over the size cap (sparse): a later wfs's (whose cap may be
 * larger) is left as it is, any other set aside. */
static void over_cap(struct check_count *c, struct logs *lg)
{
	static const char *const heads[] = { "{\"built\":1,\"nas\":\"/n\",\"version\":98,"
					     "\"entries\":[\n",
					     "{\"built\":1,\"nas\":\"/n\",\"version\":1,"
					     "\"entries\":[\n" };
	char dir[PATH_MAX * 2], p[PATH_MAX * 2];
	struct record r;
	struct stat st;

	for (int i = 0; i < 2; i++) {
		snprintf(dir, sizeof(dir), "%s/overcap%d", top, i);
		mkdir(dir, 0700);
		write_record(dir, heads[i]);
		snprintf(p, sizeof(p), "%s/" RECORD_FILE, dir);
		CHECK(c, truncate(p, RECORD_MAX_BYTES + 1) == 0, "over the cap: %s", strerror(errno));
		CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r),
		      "over the cap, version %s: opens empty", i ? "1" : "98");
		if (!i)
			CHECK(c, logged(lg, "is of version 98, newer than this wfs") &&
			      stat(p, &st) == 0 && st.st_size == RECORD_MAX_BYTES + 1 &&
			      !exists(dir, RECORD_FILE ".damaged"),
			      "over the cap, a later version: left as it is");
		else
			CHECK(c, !exists(dir, RECORD_FILE) && exists(dir, RECORD_FILE ".damaged"),
			      "over the cap, this version: set aside");
		record_close(&r);
	}
}

/* A damaged file, a newer version, a read-only store, hostile entries. */
static void damage(struct check_count *c, struct logs *lg, struct store *s,
		   const struct hub_roots *roots)
{
	char dir[PATH_MAX * 2], *before, *after;
	struct record r;

	snprintf(dir, sizeof(dir), "%s/damaged", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"entries\": [");
	CHECK(c, record_open(&r, dir, 1, log_line, lg) == 0 && !record_has_any(&r) &&
	      exists(dir, RECORD_FILE) && !exists(dir, RECORD_FILE ".damaged"),
	      "read-only: damaged file left in place");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      !exists(dir, RECORD_FILE) && exists(dir, RECORD_FILE ".damaged") &&
	      logged(lg, "moved aside"), "damaged: set aside and logged");
	record_close(&r);

	snprintf(dir, sizeof(dir), "%s/newer", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 99, \"entries\": [{\"path\": \"\", \"kind\": \"dir\", "
		     "\"mode\": 16877, \"size\": 0, \"ino\": 1}]}");
	before = slurp(dir);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      !exists(dir, RECORD_FILE ".damaged") && logged(lg, "version 99"),
	      "a newer version is not read");
	CHECK(c, record_rebuild(&r, roots, s) == 0 && record_has_any(&r), "newer: builds in memory");
	after = slurp(dir);
	CHECK(c, !strcmp(before, after), "a newer version is never replaced");
	free(before);
	free(after);
	record_close(&r);

	/* Names a hostile file must not make the mount show. */
	snprintf(dir, sizeof(dir), "%s/hostile", top);
	mkdir(dir, 0700);
#define D(p) "{\"path\": \"" p "\", \"kind\": \"dir\", \"mode\": 16877, \"size\": 0, \"ino\": 2}"
#define F(p) "{\"path\": \"" p "\", \"kind\": \"file\", \"mode\": 33206, \"size\": 3, " \
	     "\"ino\": 3, \"backing\": \"/x\", \"data\": \"abc\"}"
	write_record(dir, "{\"version\": 1, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", " F("models--a--b/f") ", " D("..") ", " D("../up") ", "
		     D("/abs") ", " D("models--a--b//c") ", " D("models--a--b/./d") ", "
		     D("models--a--b/e/..") ", " F("models--a--b/orphan/x") ", " D("models--a--b") ", "
		     "{\"path\": \"models--a--b/g\", \"kind\": \"file\", \"mode\": 16877, "
		     "\"size\": 0, \"ino\": 4, \"backing\": \"/x\"}, "
		     "{\"path\": \"models--a--b/h\", \"kind\": \"file\", \"mode\": 33188, "
		     "\"size\": 0, \"ino\": 5}, "
		     "{\"path_hex\": \"6d6f64656c732d2d612d2d622fff\", \"kind\": \"link\", "
		     "\"link_state\": \"resolved\", \"mode\": 41471, \"size\": 1, \"ino\": 6, "
		     "\"target\": \"f\"}]}");
	/* (the good names with them are not trusted either: a listing short
	 * of what the file lost would look whole while the NAS is down) */
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0, "hostile: opens");
	CHECK(c, !record_has_any(&r) && look(&r, "models--a--b/f") == -ENOENT &&
	      look(&r, "..") == -ENOENT && exists(dir, RECORD_FILE ".damaged") &&
	      !exists(dir, RECORD_FILE) && logged(lg, "damaged entries"),
	      "hostile: set aside whole, nothing served from it: %s", list(&r, ""));
	record_close(&r);
	/* one damaged entry among good ones is enough */
	snprintf(dir, sizeof(dir), "%s/onebad", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", " F("models--a--b/f") ", " F("models--a--b/orphan/x")
		     "]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      exists(dir, RECORD_FILE ".damaged"), "one entry with no recorded parent: the "
	      "record set aside whole: %s", list(&r, ""));
	record_close(&r);
	/* a NAS file id with its top bit set, as record_write writes it (the
	 * int64 of its bits): read back as written (it set the record aside) */
	snprintf(dir, sizeof(dir), "%s/bigino", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", {\"path\": \"models--a--b/f\", \"kind\": \"file\", "
		     "\"mode\": 33188, \"size\": 3, \"ino\": -9223372036854775803, "
		     "\"dev\": -2, \"backing\": \"/x\", \"data\": \"abc\"}]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && look(&r, "models--a--b/f") == 0 &&
	      (uint64_t)ent.e.st.st_ino == (1ULL << 63 | 5) &&
	      (uint64_t)ent.e.st.st_dev == (uint64_t)-2 && !exists(dir, RECORD_FILE ".damaged"),
	      "an inode number with the top bit set: loaded (%s)", list(&r, "models--a--b"));
	record_close(&r);
	/* a record that cannot be read (EIO) says nothing
	 * of what it holds: left in place, not set aside */
	snprintf(dir, sizeof(dir), "%s/unreadable", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"nas\": \"/n\", \"entries\": [" D("") "]}");
	atomic_store(&read_fails, EIO);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && !record_has_any(&r) &&
	      exists(dir, RECORD_FILE) && !exists(dir, RECORD_FILE ".damaged") &&
	      logged(lg, "cannot be read"), "a read error: left in place, said");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && record_has_any(&r),
	      "read at the next open");
	record_close(&r);
	/* the write bits of a good record's entry are never shown */
	snprintf(dir, sizeof(dir), "%s/modes", top);
	mkdir(dir, 0700);
	write_record(dir, "{\"version\": 1, \"nas\": \"/n\", \"entries\": [" D("") ", "
		     D("models--a--b") ", " F("models--a--b/f") "]}");
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && look(&r, "models--a--b/f") == 0 &&
	      !(ent.e.st.st_mode & 0222) && ent.has_data && ent.data_len == 3,
	      "write bits never shown");
	record_close(&r);
}

/* A revision whose blob lives in a hub-level store (its key in no repo),
 * promoted by the revision's name and never opened: the promote's walk
 * names the blob, so the record walks its repo; the name is kept in the
 * index, so a build after a restart does too (a NAS outage after it would
 * otherwise fail what is local with EIO).  Closes and reopens *@s. */
static void hub_store_promoted(struct check_count *c, struct logs *lg, struct store *s,
			       const char *local, const struct store_opts *opt,
			       const struct hub_roots *roots)
{
	static const char *const g = "models--h--t/snapshots/" REV "/g";
	struct blob_set set = { 0 };
	struct record r;
	int local_n = 0;

	CHECK(c, collect(roots, s, NULL, "models--h--t/snapshots/" REV, &set) == 0 && set.n == 1,
	      "the revision: one blob (%zu)", set.n);
	for (size_t i = 0; i < set.n; i++) {
		store_promote(s, set.v[i], 0, 1);
		local_n += store_wait_settled(s, set.v[i], 30000) == BLOB_LOCAL;
	}
	blob_set_free(&set);
	CHECK(c, local_n == 1, "its blob local");
	CHECK(c, record_open(&r, local, 0, log_line, lg) == 0 &&
	      record_rebuild(&r, roots, s) == 0 && look(&r, g) == 0 && ent.e.kind == NS_LINK &&
	      look(&r, "models--h--t/blobs/tid") == 0 && ent.e.kind == NS_FILE,
	      "promoted, never opened: the repo is in the record (%s)", list(&r, ""));
	record_close(&r);
	CHECK(c, store_sync(s) == 0, "index written");
	store_close(s);
	CHECK(c, store_open(s, local, opt, NULL) == 0 && store_start(s) == 0, "store reopened");
	CHECK(c, record_open(&r, local, 0, log_line, lg) == 0 &&
	      record_rebuild(&r, roots, s) == 0 && look(&r, g) == 0 &&
	      look(&r, "models--h--t/blobs/tid") == 0,
	      "after a restart, built again: still there, by the name the index kept (%s)",
	      list(&r, ""));
	record_close(&r);
}

/* --wrap=durable_read_fd: when armed, the refs file rewrite_path names is
 * rewritten in place (truncated and written, as huggingface_hub does,
 * with a new mtime) just as the record's build reads it: the read gets
 * the new file's bytes from a descriptor whose attributes the walk took
 * before. */
ssize_t __real_durable_read_fd(int fd, void *buf, size_t cap);
ssize_t __wrap_durable_read_fd(int fd, void *buf, size_t cap);
static char rewrite_path[PATH_MAX * 2];
static _Atomic int rewrite_armed;

/* With vanish_armed, the first read of a marker or a file list (after the
 * walk: the build's last steps read them) takes the NAS away too, as an
 * unmount would: its directory moved aside and an empty one, the mount
 * point, in its place (what is open stays readable). */
static _Atomic int vanish_armed;

static void nas_swap(const char *from, const char *to)
{
	char a[PATH_MAX * 2], b[PATH_MAX * 2];

	snprintf(a, sizeof(a), "%s%s", nas, from);
	snprintf(b, sizeof(b), "%s%s", nas, to);
	if (rename(a, b) < 0)
		exit(2);
}

ssize_t __wrap_durable_read_fd(int fd, void *buf, size_t cap)
{
	char link[64], at[PATH_MAX];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (atomic_load(&vanish_armed) && (n = readlink(link, at, sizeof(at) - 1)) > 0 &&
	    (at[n] = '\0', strstr(at, "/.no_exist/") || strstr(at, "/trees/")) &&
	    atomic_exchange(&vanish_armed, 0)) {
		nas_swap("", ".away");
		if (mkdir(nas, 0755) < 0)
			exit(2);
	}

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (atomic_load(&rewrite_armed) && (n = readlink(link, at, sizeof(at) - 1)) > 0 &&
	    (at[n] = '\0', !strcmp(at, rewrite_path)) && atomic_exchange(&rewrite_armed, 0)) {
		struct timespec t[2] = { { 0, UTIME_OMIT }, { 1800000000, 0 } };
		int w = open(rewrite_path, O_WRONLY | O_TRUNC);

		if (w < 0 || write(w, REV, strlen(REV)) != (ssize_t)strlen(REV) ||
		    futimens(w, t) < 0)
			exit(2);
		close(w);
	}
	return __real_durable_read_fd(fd, buf, cap);
}

/* A refs file rewritten in place as the build reads it: its bytes are kept
 * with the attributes of the file they came from (they were kept with the
 * walk's, the old mtime beside the new bytes: a reader that opened the old
 * file would be served them as its own). */
static void ref_rewritten(struct check_count *c, struct logs *lg, struct store *s,
			  const struct hub_roots *roots)
{
	char dir[PATH_MAX * 2];
	struct record r;
	struct stat st;

	snprintf(dir, sizeof(dir), "%s/rewritten", top);
	mkdir(dir, 0700);
	check_path(rewrite_path, sizeof(rewrite_path), nas, REPO "/refs/main");
	atomic_store(&rewrite_armed, 1);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 &&
	      record_rebuild(&r, roots, s) == 0 && !atomic_load(&rewrite_armed), "built, the ref "
	      "rewritten as it was read");
	CHECK(c, stat(rewrite_path, &st) == 0 && bytes_are(&r, REPO "/refs/main", REV) &&
	      ent.e.st.st_mtim.tv_sec == st.st_mtim.tv_sec &&
	      ent.e.st.st_mtim.tv_nsec == st.st_mtim.tv_nsec, "its bytes with the mtime of the "
	      "file they came from: %lld, the file's %lld", (long long)ent.e.st.st_mtim.tv_sec,
	      (long long)st.st_mtim.tv_sec);
	/* one empty at every read is no rewrite under way: kept as it is,
	 * not a build that fails for ever */
	check_put(nas, REPO "/refs/main", "");
	CHECK(c, record_rebuild(&r, roots, s) == 0 && bytes_are(&r, REPO "/refs/main", ""),
	      "an empty refs file: built, kept empty");
	check_put(nas, REPO "/refs/main", REV);
	record_close(&r);
}

/* The NAS unmounted in the middle of a build (after the walk, as its
 * markers and file lists are read): the build fails and the record keeps
 * its last one, markers and all.  (Those read after it were taken for
 * deleted and the record published without them: with the NAS down, a
 * loader would take a file the marker says is absent at that revision for
 * one to download.) */
static void nas_vanishes(struct check_count *c, struct logs *lg, struct store *s,
			 const struct hub_roots *roots)
{
	char dir[PATH_MAX * 2];
	struct record r;
	int e;

	snprintf(dir, sizeof(dir), "%s/vanish", top);
	mkdir(dir, 0700);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 && record_rebuild(&r, roots, s) == 0 &&
	      bytes_are(&r, REPO "/refs/main", REV) &&
	      look(&r, REPO "/.no_exist/" REV "/missing.txt") == 0, "built whole");
	atomic_store(&vanish_armed, 1);
	e = record_rebuild(&r, roots, s);
	CHECK(c, !atomic_load(&vanish_armed) && e == -ENOMEDIUM, "built with the NAS unmounted "
	      "under it: %s", strerror(-e));
	CHECK(c, bytes_are(&r, REPO "/refs/main", REV) &&
	      look(&r, REPO "/.no_exist/" REV "/missing.txt") == 0 &&
	      look(&r, REPO "/.no_exist/" REV "/sub/missing.json") == 0 &&
	      bytes_are(&r, REPO "/trees/" REV ".json", tree_text) &&
	      look(&r, SNAP "/sub/dir/file") == 0, "the last build kept (%s)", list(&r, REPO));
	CHECK(c, logged(lg, "record: reading refs and markers of"), "the failure logged");
	record_close(&r);
	CHECK(c, record_open(&r, dir, 0, log_line, lg) == 0 &&
	      bytes_are(&r, REPO "/refs/main", REV) &&
	      look(&r, REPO "/.no_exist/" REV "/missing.txt") == 0, "and on disk");
	record_close(&r);
	if (rmdir(nas) < 0)
		exit(2);
	nas_swap(".away", "");
}

int main(void)
{
	struct check_count c = {0};
	struct store_opts opt = { .workers = 2 };
	struct logs lg = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct hub_roots roots = {0};
	char local[PATH_MAX * 2], p[PATH_MAX * 2], *text;
	struct blob *b256, *b1, *hb;
	struct record r;
	struct store s;
	struct stat st, st2;

	snprintf(top, sizeof(top), "/var/tmp/wfs-record-XXXXXX");
	if (!mkdtemp(top) || !realpath(top, p))
		return 2;
	snprintf(top, sizeof(top), "%s", p); /* roots are canonical: so are blob keys */
	snprintf(nas, sizeof(nas), "%s/nas", top);
	mkdir(nas, 0755);
	hub();
	hub_roots_add(&roots, nas);
	snprintf(local, sizeof(local), "%s/local", top);
	mkdir(local, 0700);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "store");
	b256 = promote(&s, REPO "/blobs/" H256, H256);
	b1 = promote(&s, REPO "/blobs/" H1, H1);
	CHECK(&c, b256 && b1, "two blobs local");

	/* A build, then the same answers from the file after a restart. */
	CHECK(&c, record_open(&r, local, 0, log_line, &lg) == 0 && !record_has_any(&r),
	      "no file: an empty record");
	CHECK(&c, record_sync(&r, 1000) == -ESRCH, "no thread: nothing to ask");
	CHECK(&c, record_rebuild(&r, &roots, &s) == 0, "rebuild");
	answers(&c, &r, "built");
	snprintf(p, sizeof(p), "%s/" RECORD_FILE, local);
	CHECK(&c, stat(p, &st) == 0 && (st.st_mode & 07777) == 0600, "record.json, mode 0600");
	text = slurp(local);
	CHECK(&c, strstr(text, "\"path_hex\"") && file_is(text, r.entries),
	      "the file: %.200s", text);
	CHECK(&c, record_rebuild(&r, &roots, &s) == 0 && stat(p, &st2) == 0 &&
	      st2.st_ino == st.st_ino, "the same content is not written again");
	record_close(&r);
	CHECK(&c, record_open(&r, local, 0, log_line, &lg) == 0, "reopen");
	answers(&c, &r, "reopened");
	CHECK(&c, record_rebuild(&r, &roots, &s) == 0 && stat(p, &st2) == 0 &&
	      st2.st_ino == st.st_ino, "nor after a reopen (the loaded record's signature)");
	record_close(&r);
	/* the same JSON laid out as earlier builds wrote it (indented) */
	CHECK(&c, relayout(p, text) == 0 && stat(p, &st) == 0, "record.json indented");
	free(text);
	CHECK(&c, record_open(&r, local, 0, log_line, &lg) == 0, "reopen, indented");
	answers(&c, &r, "reopened, indented");
	CHECK(&c, record_rebuild(&r, &roots, &s) == 0 && stat(p, &st2) == 0 &&
	      st2.st_ino == st.st_ino, "an indented file of the same content is not rewritten");

	/* The thread: a repo reached only by the name its blob was opened by
	 * (its bytes live in a hub-level store), then an eviction. */
	CHECK(&c, record_start(&r, &roots, &s, NULL) == 0, "start");
	hb = promote(&s, "hubstore/blob1", "hid");
	CHECK(&c, hb != NULL, "hub-level blob local");
	if (hb) {
		store_note_open(&s, hb, "models--h--s/snapshots/" REV "/f");
		store_note_close(&s, hb);
	}
	CHECK(&c, record_sync(&r, 30000) == 0, "sync");
	if (b256 && b1)
		opens(&c, &r, &s, b256, b1);
	check_path(p, sizeof(p), nas, "hubstore/blob1");
	CHECK(&c, look(&r, "models--h--s/snapshots/" REV "/f") == 0 && ent.e.kind == NS_LINK &&
	      !strcmp(ent.e.target, "../../blobs/hid"), "a repo by name: link %s", ent.e.target);
	CHECK(&c, look(&r, "models--h--s/blobs/hid") == 0 && ent.e.kind == NS_FILE &&
	      !strcmp(ent.e.backing, p) && ent.e.st.st_size == 10, "a repo by name: its blob");
	CHECK(&c, !strcmp(list(&r, ""), "models--h--s|" REPO), "root lists %s", list(&r, ""));
	CHECK(&c, look(&r, "models--h--s/trees/" REV ".json") == -ENOENT &&
	      !strcmp(list(&r, "models--h--s"), "blobs|snapshots"),
	      "a file list over RECORD_MAX_TREE is not kept (%s)", list(&r, "models--h--s"));
	CHECK(&c, times_logged(&lg, "models--h--s/trees/" REV ".json not kept (a file list over "
			       "1048576 bytes)") == 1, "a file list left out: logged once, with "
	      "its path and why");
	local_changes(&c, &r, &s, b256);
	CHECK(&c, record_sync(&r, 30000) == 0 && look(&r, SNAP "/config.json") == -ENOENT &&
	      look(&r, REPO "/blobs/" H256) == -ENOENT && look(&r, SNAP "/sub/dir/file") == 0 &&
	      !strcmp(list(&r, SNAP), "latest|sub"), "evicted: gone after a sync (%s)",
	      list(&r, SNAP));
	CHECK(&c, bytes_are(&r, REPO "/trees/" REV ".json", tree_text) &&
	      times_logged(&lg, "models--h--s/trees/" REV ".json not kept") == 1,
	      "another build: the file list stays, the one left out is not said again");
	record_close(&r);

	/* The NAS down: nothing is walked, the record from disk answers. */
	{
		struct nas_gate g;

		CHECK(&c, nas_gate_init(&g, nas, 0, NULL, NULL) == 0, "gate");
		nas_gate_set_down(&g, "a test");
		CHECK(&c, record_open(&r, local, 0, log_line, &lg) == 0 &&
		      record_start(&r, &roots, &s, &g) == 0, "start with the NAS down");
		CHECK(&c, promote(&s, REPO "/blobs/" H256, H256) != NULL, "local again");
		CHECK(&c, record_sync(&r, 30000) == -EHOSTDOWN, "sync: the NAS is down");
		CHECK(&c, look(&r, SNAP "/sub/dir/file") == 0 && look(&r, SNAP "/config.json") ==
		      -ENOENT, "the last record stays");
		record_close(&r);
		nas_gate_destroy(&g);
	}

	held(&c, &lg, &s, &roots);
	damage(&c, &lg, &s, &roots);
	over_cap(&c, &lg);
	hub_store_promoted(&c, &lg, &s, local, &opt, &roots);
	ref_rewritten(&c, &lg, &s, &roots);
	nas_vanishes(&c, &lg, &s, &roots);
	store_close(&s);
	snprintf(p, sizeof(p), "rm -rf %s", top);
	if (system(p) != 0)
		fprintf(stderr, "could not remove %s\n", top);
	printf("record: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
