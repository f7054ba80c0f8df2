/* test_record.c - the store's record of its local revisions, without
 * mounting: what a build keeps of a hub tree (local files, the links and
 * directories that reach them, refs with their bytes, the local revision's
 * .no_exist markers and its file list trees/<rev>.json with their bytes,
 * a file list over RECORD_MAX_TREE left out and logged once; nothing
 * else), that
 * record.json brings the same answers back after a restart, that a ref
 * moved to a revision not all local is held where it was, that
 * record_sync waits for a build of the thread, and that
 * the thread builds (walks the NAS) when an open names a repo, not for the
 * first open of a local copy by a name in its own.  A damaged, newer or
 * hostile record.json, and builds the NAS fails: test_recfaults.c. */
#include "check_record.h"
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

/* @text is JSON: version 1, a "built" time, @entries entries, an entry
 * a line (a head line, the entries, the closing line). */
static int file_is(const char *text, size_t entries)
{
	json_t *o = json_loads(text, 0, NULL);
	size_t lines = 0;
	int ok;

	for (const char *c = text; *c; c++)
		lines += *c == '\n';
	ok = o && json_integer_value(json_object_get(o, "version")) == RECORD_VERSION &&
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

	if (record_fixture("record", &roots, local, sizeof(local)) < 0)
		return 2;
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
	hub_store_promoted(&c, &lg, &s, local, &opt, &roots);
	store_close(&s);
	snprintf(p, sizeof(p), "rm -rf %s", top);
	if (system(p) != 0)
		fprintf(stderr, "could not remove %s\n", top);
	printf("record: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
