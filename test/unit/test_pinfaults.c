/* test_pinfaults.c - ref pins and automatic promotion when a NAS listing
 * fails once, and a ref pin following a revision still being downloaded.
 *
 * A listing that breaks off (--wrap=readdir64: EIO from one chosen
 * directory, once) must never be taken for what the NAS holds: a settle
 * that cannot list what another pin keeps unpins nothing, an unpin --ref
 * that cannot list its revisions keeps the pin, and a hot blob whose
 * snapshot names cannot be listed is not promoted past an exclusion glob.
 * And a ref that moved to a revision whose files are still arriving
 * (blobs/<id>.incomplete on the NAS) is not settled on until they are in;
 * and a stop in the middle of pin --ref or unpin --ref (--wrap=
 * store_pin_why) leaves no blob pinned by no pin, nor a pin unpinned.
 */
#include "auto.h"
#include "check_store.h"
#include "nasgate.h"
#include "pins.h"
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB 1024u

static char top[PATH_MAX];
static struct check_count c;

/* A listing of the directory (fail_dev, fail_ino) fails with EIO, once. */
struct dirent *__real_readdir64(DIR *d);
struct dirent *__wrap_readdir64(DIR *d);
static dev_t fail_dev;
static ino_t fail_ino;
static atomic_int fail_armed;

/* With hold_armed, that listing hangs instead (a NAS listing has no
 * deadline), once, until hold_released: held says it hangs now. */
static atomic_int hold_armed, held, hold_released;

struct dirent *__wrap_readdir64(DIR *d)
{
	struct stat st;

	if ((atomic_load(&fail_armed) || atomic_load(&hold_armed)) && fstat(dirfd(d), &st) == 0 &&
	    st.st_dev == fail_dev && st.st_ino == fail_ino) {
		if (atomic_exchange(&hold_armed, 0)) {
			atomic_store(&held, 1);
			while (!atomic_load(&hold_released))
				usleep(1000);
		} else if (atomic_exchange(&fail_armed, 0)) {
			errno = EIO;
			return NULL;
		}
	}
	return __real_readdir64(d);
}

/* A look at the entry (fail_dev, fail_ino)/fail_name fails with EIO, once:
 * a NAS failing on one entry while its directory lists. */
int __real_fstatat64(int fd, const char *name, struct stat64 *st, int flags);
int __wrap_fstatat64(int fd, const char *name, struct stat64 *st, int flags);
static char fail_name[NAME_MAX + 1];
static atomic_int entry_armed;

int __wrap_fstatat64(int fd, const char *name, struct stat64 *st, int flags)
{
	struct stat dst;

	if (atomic_load(&entry_armed) && fd >= 0 && !strcmp(name, fail_name) &&
	    fstat(fd, &dst) == 0 && dst.st_dev == fail_dev && dst.st_ino == fail_ino &&
	    atomic_exchange(&entry_armed, 0)) {
		errno = EIO;
		return -1;
	}
	return __real_fstatat64(fd, name, st, flags);
}

/* The index write fails with ENOSPC, once (LOCAL_STORE full). */
int __real_store_sync(struct store *s);
int __wrap_store_sync(struct store *s);
static atomic_int sync_armed;

int __wrap_store_sync(struct store *s)
{
	if (atomic_exchange(&sync_armed, 0))
		return -ENOSPC;
	return __real_store_sync(s);
}

/* The process stops at the first ref-pin reason set or cleared
 * (CRASH_BEFORE the change, CRASH_AFTER it), the index written just
 * then, as a copy worker may write it between any two of a pin's steps. */
int __real_store_pin_why(struct store *s, struct blob *b, int why, int pin);
int __wrap_store_pin_why(struct store *s, struct blob *b, int why, int pin);
enum { CRASH_NONE, CRASH_BEFORE, CRASH_AFTER };
static atomic_int crash_at;

int __wrap_store_pin_why(struct store *s, struct blob *b, int why, int pin)
{
	int at = atomic_exchange(&crash_at, CRASH_NONE), r = 0;

	if (at == CRASH_NONE || at == CRASH_AFTER)
		r = __real_store_pin_why(s, b, why, pin);
	if (at != CRASH_NONE) {
		__real_store_sync(s);
		_exit(0);
	}
	return r;
}

/* The next listing of hub/@rel fails once. */
static void fail_listing_of(const char *rel)
{
	char p[PATH_MAX * 2];
	struct stat st;

	snprintf(p, sizeof(p), "%s/hub/%s", top, rel);
	if (stat(p, &st) < 0) {
		perror(p);
		exit(2);
	}
	fail_dev = st.st_dev;
	fail_ino = st.st_ino;
	atomic_store(&fail_armed, 1);
}

/* hub/@repo/snapshots/@rev/@name -> ../../blobs/@blob (one level deeper:
 * ../../../blobs) */
static void snap_link(const char *repo, const char *rev, const char *name, const char *blob)
{
	char dir[PATH_MAX], p[PATH_MAX * 2], t[PATH_MAX];
	const char *slash = strrchr(name, '/');

	snprintf(dir, sizeof(dir), "hub/%s/snapshots/%s%s%.*s", repo, rev, slash ? "/" : "",
		 slash ? (int)(slash - name) : 0, name);
	check_mkdirs(top, dir);
	snprintf(t, sizeof(t), "%s../../blobs/%s", slash ? "../" : "", blob);
	snprintf(p, sizeof(p), "%s/hub/%s/snapshots/%s/%s", top, repo, rev, name);
	if (symlink(t, p) < 0) {
		perror(p);
		exit(2);
	}
}

/* refs/@ref of @repo names @rev (written and renamed, as clients do). */
static void set_ref(const char *repo, const char *ref, const char *rev)
{
	char rel[PATH_MAX], p[PATH_MAX * 2], q[PATH_MAX * 2];

	snprintf(rel, sizeof(rel), "hub/%s/refs", repo);
	check_mkdirs(top, rel);
	snprintf(p, sizeof(p), "%s/%s/%s.new", top, rel, ref);
	snprintf(q, sizeof(q), "%s/%s/%s", top, rel, ref);
	check_write_file(p, rev, strlen(rev));
	if (rename(p, q) < 0) {
		perror(q);
		exit(2);
	}
}

/* @repo with the one blob @blob (@n bytes of @seed's pattern), linked as
 * @blob.bin in revision rev1, which refs/main names. */
static void one_blob_repo(const char *repo, const char *blob, size_t n, unsigned seed)
{
	char rel[PATH_MAX], name[NAME_MAX + 1];

	snprintf(rel, sizeof(rel), "hub/%s/blobs", repo);
	check_mkdirs(top, rel);
	snprintf(rel, sizeof(rel), "hub/%s/blobs/%s", repo, blob);
	check_put_pattern(top, rel, n, seed);
	snprintf(name, sizeof(name), "%s.bin", blob);
	snap_link(repo, "rev1", name, blob);
	set_ref(repo, "main", "rev1");
}

static struct blob *blob_at(struct store *s, const char *repo, const char *id)
{
	char rel[PATH_MAX];

	snprintf(rel, sizeof(rel), "hub/%s/blobs/%s", repo, id);
	return check_blob(s, top, rel, NULL, 1);
}

static int ref_pinned(struct store *s, struct blob *b)
{
	struct blob_info in;

	blob_info(s, b, &in);
	return (in.pin_why & PIN_REF) != 0;
}

/* The pin (@repo, @ref): its kept and pending revisions, "" if none. */
static void pin_of(struct pins *p, const char *ref, char *commit, char *pending)
{
	size_t n;
	struct pin *v = pins_list(p, &n);

	*commit = *pending = '\0';
	for (size_t i = 0; v && i < n; i++)
		if (!strcmp(v[i].ref, ref)) {
			strcpy(commit, v[i].commit);
			strcpy(pending, v[i].pending);
		}
	free(v);
}

/* Polls until the pin @ref keeps @rev with nothing pending (10 s at most,
 * the copies landing meanwhile). */
static int settled_on(struct pins *p, const char *ref, const char *rev)
{
	char commit[NAME_MAX + 1], pending[NAME_MAX + 1];

	for (int64_t end = store_now_ms() + 10000; store_now_ms() < end; usleep(10000)) {
		pins_poll(p);
		pin_of(p, ref, commit, pending);
		if (!strcmp(commit, rev) && !*pending)
			return 1;
	}
	return 0;
}

/* Polls until the reason of the pin @ref holds @what (10 s at most). */
static int pin_says(struct pins *p, const char *ref, const char *what)
{
	for (int64_t end = store_now_ms() + 10000; store_now_ms() < end; usleep(10000)) {
		size_t n;
		struct pin *v;
		int found = 0;

		pins_poll(p);
		v = pins_list(p, &n);
		for (size_t i = 0; v && i < n; i++)
			found |= !strcmp(v[i].ref, ref) && strstr(v[i].reason, what) != NULL;
		free(v);
		if (found)
			return 1;
	}
	return 0;
}

struct rig {
	struct policy_opts pol;
	struct hub_roots roots;
	struct store s;
	struct pins pins;
};

static void rig_open_gated(struct rig *g, const char *name, struct nas_gate *gate)
{
	struct store_opts opt = { .workers = 2, .policy = &g->pol, .gate = gate };
	char local[PATH_MAX * 2];

	memset(&g->roots, 0, sizeof(g->roots));
	snprintf(local, sizeof(local), "%s/hub", top);
	hub_roots_add(&g->roots, local);
	check_policy_manual(&g->pol);
	check_store_dir(top, name, local, sizeof(local));
	CHECK(&c, store_open(&g->s, local, &opt, NULL) == 0 && store_start(&g->s) == 0 &&
	      pins_open(&g->pins, &g->s, &g->roots, &g->pol) == 0, "%s: store and pins", name);
}

static void rig_open(struct rig *g, const char *name)
{
	rig_open_gated(g, name, NULL);
}

static void rig_close(struct rig *g)
{
	pins_close(&g->pins);
	store_close(&g->s);
	policy_opts_free(&g->pol);
}

/* refs/main and refs/v1 pin rev1 of @R (its blob a); main moves to rev2
 * (blob b), which is copied; then the settle's walk of rev1 -- what v1
 * keeps -- meets a fault: its listing fails (@entry 0), or only the look
 * at its one entry does (@entry 1; the walk skipped the entry).  rev1's
 * blob stays ref-pinned (v1 holds it), and the settle is made at a later
 * look. */
static void keep_walk_fails(const char *R, unsigned seed, int entry)
{
	char commit[NAME_MAX + 1], rel[PATH_MAX], p[PATH_MAX * 2];
	struct rig g;
	struct blob *a, *b;
	struct stat st;

	snprintf(rel, sizeof(rel), "hub/%s/blobs", R);
	check_mkdirs(top, rel);
	snprintf(rel, sizeof(rel), "hub/%s/blobs/a", R);
	check_put_pattern(top, rel, 64 * KiB, seed);
	snprintf(rel, sizeof(rel), "hub/%s/blobs/b", R);
	check_put_pattern(top, rel, 64 * KiB, seed + 1);
	snap_link(R, "rev1", "a.bin", "a");
	set_ref(R, "main", "rev1");
	set_ref(R, "v1", "rev1");
	rig_open(&g, R);
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == 1 &&
	      pins_pin(&g.pins, R, "v1", commit, sizeof(commit)) == 1 &&
	      settled_on(&g.pins, "main", "rev1") && settled_on(&g.pins, "v1", "rev1"),
	      "main and v1 pin rev1");
	a = blob_at(&g.s, R, "a");
	snap_link(R, "rev2", "b.bin", "b");
	set_ref(R, "main", "rev2");
	pins_poll(&g.pins); /* rev2 pinned and queued */
	b = blob_at(&g.s, R, "b");
	CHECK(&c, store_wait_settled(&g.s, b, 30000) == BLOB_LOCAL, "rev2 local");
	snprintf(rel, sizeof(rel), "%s/snapshots/rev1", R);
	if (!entry) {
		fail_listing_of(rel);
	} else {
		snprintf(p, sizeof(p), "%s/hub/%s", top, rel);
		CHECK(&c, stat(p, &st) == 0, "rev1");
		fail_dev = st.st_dev;
		fail_ino = st.st_ino;
		snprintf(fail_name, sizeof(fail_name), "a.bin");
		atomic_store(&entry_armed, 1);
	}
	pins_poll(&g.pins);
	CHECK(&c, !atomic_load(entry ? &entry_armed : &fail_armed) && ref_pinned(&g.s, a),
	      "%s: the walk of what v1 keeps failed: rev1's blob still ref-pinned", R);
	CHECK(&c, settled_on(&g.pins, "main", "rev2") && ref_pinned(&g.s, a) &&
	      ref_pinned(&g.s, b), "%s: main settles on rev2 at a later look; v1 keeps rev1's "
	      "blob", R);
	rig_close(&g);
}

/* The revision a pin lets go is deleted from the NAS first (a cache
 * cleaner): its blobs cannot be listed.  The pin moves on and what only
 * that revision held is unpinned; unpin --ref of a pin whose revision is
 * gone drops it and its blobs' pin (both stuck for good before). */
static void test_revision_deleted(void)
{
	const char *R = "models--t--del", *U = "models--t--delun";
	char commit[NAME_MAX + 1], pending[NAME_MAX + 1], p[PATH_MAX * 2];
	struct rig g;
	struct blob *a, *b, *u;

	one_blob_repo(R, "a", 64 * KiB, 13);
	check_put_pattern(top, "hub/models--t--del/blobs/b", 64 * KiB, 14);
	one_blob_repo(U, "u", 64 * KiB, 15);
	rig_open(&g, "del");
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == 1 &&
	      pins_pin(&g.pins, U, "main", commit, sizeof(commit)) == 1 &&
	      settled_on(&g.pins, "main", "rev1"), "both pin rev1");
	a = blob_at(&g.s, R, "a");
	u = blob_at(&g.s, U, "u");
	snap_link(R, "rev2", "b.bin", "b");
	set_ref(R, "main", "rev2");
	snprintf(p, sizeof(p), "%s/hub/%s/snapshots/rev1", top, R);
	check_rmtree(p);
	pins_poll(&g.pins); /* rev2 pinned and queued */
	b = blob_at(&g.s, R, "b");
	CHECK(&c, store_wait_settled(&g.s, b, 30000) == BLOB_LOCAL, "rev2 local");
	for (int64_t end = store_now_ms() + 10000; store_now_ms() < end; usleep(10000)) {
		pins_poll(&g.pins);
		pin_of(&g.pins, "main", commit, pending);
		if (!ref_pinned(&g.s, a))
			break;
	}
	CHECK(&c, !ref_pinned(&g.s, a) && ref_pinned(&g.s, b) && ref_pinned(&g.s, u),
	      "rev1 deleted: its blob unpinned, rev2's and the other pin's kept");
	snprintf(p, sizeof(p), "%s/hub/%s/snapshots/rev1", top, U);
	check_rmtree(p);
	CHECK(&c, pins_unpin(&g.pins, U, "main") == 1 && !ref_pinned(&g.s, u) &&
	      ref_pinned(&g.s, b), "unpin --ref of a pin whose revision is gone: dropped, unpinned");
	rig_close(&g);
}

/* pin --ref and unpin --ref whose index write fails: the caller hears it
 * (both said success, and a restart forgot the pin or brought it back). */
static void test_not_saved(void)
{
	const char *R = "models--t--nosave";
	char commit[NAME_MAX + 1], pending[NAME_MAX + 1];
	struct rig g;

	check_mkdirs(top, "hub/models--t--nosave/blobs");
	check_put_pattern(top, "hub/models--t--nosave/blobs/a", 64 * KiB, 16);
	snap_link(R, "rev1", "a.bin", "a");
	set_ref(R, "main", "rev1");
	rig_open(&g, "nosave");
	atomic_store(&sync_armed, 1);
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == -ENOSPC,
	      "pin --ref, the index write failing: ENOSPC");
	pin_of(&g.pins, "main", commit, pending);
	CHECK(&c, !strcmp(pending, "rev1") || !strcmp(commit, "rev1"), "the pin in place");
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == 1, "asked again: saved");
	atomic_store(&sync_armed, 1);
	CHECK(&c, pins_unpin(&g.pins, R, "main") == -ENOSPC, "unpin --ref, the write failing");
	rig_close(&g);
}

/* One blob, x.bin in the revision main pins, original/x.bin in the one v1
 * pins, where the glob of original/ excludes it: v1 does not pin it, so it keeps
 * nothing of it -- unpin --ref main unpins it (it stayed pinned for good). */
static void test_excluded_elsewhere(void)
{
	const char *R = "models--t--exk";
	char commit[NAME_MAX + 1], err[256];
	struct rig g;
	struct blob *x;

	check_mkdirs(top, "hub/models--t--exk/blobs");
	check_put_pattern(top, "hub/models--t--exk/blobs/x", 64 * KiB, 17);
	snap_link(R, "rev1", "x.bin", "x");
	snap_link(R, "rev9", "original/x.bin", "x");
	set_ref(R, "main", "rev1");
	set_ref(R, "v1", "rev9");
	rig_open(&g, "exk");
	CHECK(&c, policy_parse_opt(&g.pol, "exclude", "*/original/*", err, sizeof(err)) == 1,
	      "glob");
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == 1 &&
	      pins_pin(&g.pins, R, "v1", commit, sizeof(commit)) == 0, "main pins x, v1 nothing");
	x = blob_at(&g.s, R, "x");
	CHECK(&c, ref_pinned(&g.s, x), "x ref-pinned");
	CHECK(&c, pins_unpin(&g.pins, R, "main") == 1 && !ref_pinned(&g.s, x),
	      "unpin --ref main: x unpinned, v1 excludes it");
	rig_close(&g);
}

/* unpin --ref whose listing of its revision fails: refused with the
 * error, the pin and its blob's pin kept; asked again, done. */
static void test_unpin_listing_fails(void)
{
	const char *R = "models--t--unpin";
	char commit[NAME_MAX + 1], pending[NAME_MAX + 1];
	struct rig g;
	struct blob *a;

	check_mkdirs(top, "hub/models--t--unpin/blobs");
	check_put_pattern(top, "hub/models--t--unpin/blobs/a", 64 * KiB, 3);
	snap_link(R, "rev1", "a.bin", "a");
	set_ref(R, "main", "rev1");
	rig_open(&g, "unpin");
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == 1 &&
	      settled_on(&g.pins, "main", "rev1"), "main pins rev1");
	a = blob_at(&g.s, R, "a");
	fail_listing_of("models--t--unpin/snapshots/rev1");
	CHECK(&c, pins_unpin(&g.pins, R, "main") == -EIO, "unpin --ref, its listing failing: EIO");
	pin_of(&g.pins, "main", commit, pending);
	CHECK(&c, !strcmp(commit, "rev1") && ref_pinned(&g.s, a), "the pin and its blob's pin kept");
	CHECK(&c, pins_unpin(&g.pins, R, "main") == 1 && !ref_pinned(&g.s, a), "asked again: unpinned");
	rig_close(&g);
}

/* refs/main moves to rev2 while its download is under way: config.json
 * there, the weights' blob still <id>.incomplete.  The pin stays pending
 * (rev1 kept, pinned); once the weights are in, rev2 is settled on with
 * them pinned and local, and rev1 let go. */
static void test_download_in_progress(void)
{
	const char *R = "models--t--dl";
	char commit[NAME_MAX + 1], pending[NAME_MAX + 1], from[PATH_MAX * 2], to[PATH_MAX * 2];
	struct rig g;
	struct blob *a, *w;

	check_mkdirs(top, "hub/models--t--dl/blobs");
	check_put_pattern(top, "hub/models--t--dl/blobs/a", 64 * KiB, 4);
	check_put_pattern(top, "hub/models--t--dl/blobs/cfg", 1 * KiB, 5);
	snap_link(R, "rev1", "model.safetensors", "a");
	set_ref(R, "main", "rev1");
	rig_open(&g, "dl");
	CHECK(&c, pins_pin(&g.pins, R, "main", commit, sizeof(commit)) == 1 &&
	      settled_on(&g.pins, "main", "rev1"), "main pins rev1");
	a = blob_at(&g.s, R, "a");
	check_put_pattern(top, "hub/models--t--dl/blobs/w.0123abcd.incomplete", 64 * KiB, 6);
	set_ref(R, "main", "rev2");
	snap_link(R, "rev2", "config.json", "cfg");
	CHECK(&c, pin_says(&g.pins, "main", "downloads in progress"),
	      "rev2's listed blob local: the pin says a download runs");
	pin_of(&g.pins, "main", commit, pending);
	CHECK(&c, !strcmp(commit, "rev1") && !strcmp(pending, "rev2") && ref_pinned(&g.s, a),
	      "rev1 kept and pinned, rev2 pending (%s, %s)", commit, pending);
	snprintf(from, sizeof(from), "%s/hub/%s/blobs/w.0123abcd.incomplete", top, R);
	snprintf(to, sizeof(to), "%s/hub/%s/blobs/w", top, R);
	CHECK(&c, rename(from, to) == 0, "the download done");
	snap_link(R, "rev2", "model.safetensors", "w");
	CHECK(&c, settled_on(&g.pins, "main", "rev2"), "rev2 settled on");
	w = blob_at(&g.s, R, "w");
	CHECK(&c, blob_state(w) == BLOB_LOCAL && ref_pinned(&g.s, w) && !ref_pinned(&g.s, a),
	      "rev2's weights local and pinned, rev1 let go");
	rig_close(&g);
}

/* A blob opened by its blobs/<id> name turns hot; the walk for its
 * snapshot names fails: not promoted (its only name is under an excluded
 * glob), hot again after more reads, then excluded. */
static void test_hot_names_fail(void)
{
	const char *R = "models--t--excl";
	struct store_opts opt = { .workers = 2 };
	struct auto_promoter ap;
	struct hub_roots roots = { 0 };
	struct policy_opts pol;
	struct blob_info in;
	char local[PATH_MAX * 2], err[256];
	struct store s;
	struct blob *o;
	unsigned handled;

	check_mkdirs(top, "hub/models--t--excl/blobs");
	check_put_pattern(top, "hub/models--t--excl/blobs/orig", 64 * KiB, 7);
	snap_link(R, "r1", "original/consolidated.pth", "orig");
	set_ref(R, "main", "r1");
	snprintf(local, sizeof(local), "%s/hub", top);
	hub_roots_add(&roots, local);
	policy_opts_init(&pol);
	pol.auto_bytes = 32 * KiB;
	pol.min_free_pct = 0;
	CHECK(&c, policy_parse_opt(&pol, "exclude", "*/original/*", err, sizeof(err)) == 1, "glob");
	opt.policy = &pol;
	check_store_dir(top, "excl", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0 &&
	      auto_start(&ap, &s, &roots, &pol, NULL) == 0, "store and policy");
	o = blob_at(&s, R, "orig");
	for (int round = 0; round < 2; round++) {
		handled = atomic_load(&ap.handled);
		if (round == 0)
			fail_listing_of("models--t--excl/snapshots");
		store_note_open(&s, o, "models--t--excl/blobs/orig");
		store_note_read(&s, o, 64 * KiB, 0);
		store_note_close(&s, o);
		for (int64_t end = store_now_ms() + 10000;
		     atomic_load(&ap.handled) == handled && store_now_ms() < end;)
			usleep(2000);
		store_wait_settled(&s, o, 5000);
		blob_info(&s, o, &in);
		if (round == 0)
			CHECK(&c, in.state == BLOB_NAS && in.hold == HOLD_NONE && !atomic_load(&fail_armed),
			      "its names not listed: not promoted, not held (%s, %s)",
			      blob_state_name(in.state), in.reason);
		else
			CHECK(&c, in.state == BLOB_NAS && in.hold == HOLD_EXCLUDED,
			      "hot again, its names listed: excluded (%s)", in.reason);
	}
	auto_stop(&ap);
	store_close(&s);
	policy_opts_free(&pol);
}

struct pin_call {
	struct pins *pins;
	const char *repo;
	_Atomic int done;
	int r;
};

static void *pin_thread(void *arg)
{
	struct pin_call *k = arg;
	char commit[NAME_MAX + 1];

	k->r = pins_pin(k->pins, k->repo, "main", commit, sizeof(commit));
	atomic_store(&k->done, 1);
	return NULL;
}

/* Waits until @k's pins_pin returned (10 s at most). */
static int pin_returned(struct pin_call *k)
{
	for (int64_t end = store_now_ms() + 10000; store_now_ms() < end; usleep(2000))
		if (atomic_load(&k->done))
			return 1;
	return 0;
}

/* A ref pin's walk of its revision hangs in a NAS listing (the wrap
 * holds it) with the pins' operation lock held.  A pin request for
 * another repo waits behind it only while the NAS is up: the gate saying
 * down refuses it (EHOSTDOWN), as a request made then is -- it waited
 * until the NAS answered again, taking a control worker for as long. */
static void test_request_behind_a_hung_walk(void)
{
	static const char *const R1 = "models--t--hung", *const R2 = "models--t--behind";
	struct pin_call a = { .repo = R1 }, b = { .repo = R2 };
	char root[PATH_MAX * 2], rel[PATH_MAX];
	struct nas_gate gate;
	pthread_t ta, tb;
	struct rig g;
	struct stat st;

	one_blob_repo(R1, "h", 4 * KiB, 31);
	one_blob_repo(R2, "k", 4 * KiB, 32);
	check_path(root, sizeof(root), top, "hub");
	CHECK(&c, nas_gate_init(&gate, root, 2000, NULL, NULL) == 0, "gate");
	rig_open_gated(&g, "hung", &gate);
	a.pins = b.pins = &g.pins;
	snprintf(rel, sizeof(rel), "%s/hub/%s/snapshots/rev1", top, R1);
	CHECK(&c, stat(rel, &st) == 0, "rev1");
	fail_dev = st.st_dev;
	fail_ino = st.st_ino;
	atomic_store(&hold_armed, 1);
	CHECK(&c, pthread_create(&ta, NULL, pin_thread, &a) == 0, "first pin");
	for (int64_t end = store_now_ms() + 10000; !atomic_load(&held) && store_now_ms() < end;)
		usleep(2000);
	CHECK(&c, atomic_load(&held), "the first pin's walk hangs");
	CHECK(&c, pthread_create(&tb, NULL, pin_thread, &b) == 0, "second pin");
	nas_gate_set_down(&gate, "test: the NAS hangs");
	CHECK(&c, pin_returned(&b) && b.r == -EHOSTDOWN, "the pin behind the hung walk: refused "
	      "once the NAS is down (%s, %d)", atomic_load(&b.done) ? "returned" : "still waiting",
	      b.r);
	atomic_store(&hold_released, 1);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	rig_close(&g);
	nas_gate_destroy(&gate);
}

/* A stop in the middle of pin --ref (@unpin 0) or unpin --ref (1), the
 * index written at that moment (@at): after a restart and the first poll,
 * the pin is there if and only if its blob is pinned for it.  A blob
 * pinned by no pin stayed pinned for good; a pin whose blob was not
 * pinned let its copy be evicted. */
static void stop_mid_pin(int unpin, int at, const char *name)
{
	char R[64], commit[NAME_MAX + 1], pending[NAME_MAX + 1];
	struct rig g;
	pid_t pid;
	int st;

	snprintf(R, sizeof(R), "models--t--%s", name);
	one_blob_repo(R, "a", 64 * KiB, 40 + (unsigned)at);
	if ((pid = fork()) == 0) {
		rig_open(&g, name);
		/* (settled: a pending revision is pinned again by any poll) */
		if (unpin && (pins_pin(&g.pins, R, "main", commit, sizeof(commit)) != 1 ||
			      !settled_on(&g.pins, "main", "rev1")))
			_exit(3);
		atomic_store(&crash_at, at);
		if (unpin)
			pins_unpin(&g.pins, R, "main");
		else
			pins_pin(&g.pins, R, "main", commit, sizeof(commit));
		_exit(4); /* (the wrap did not stop it) */
	}
	CHECK(&c, pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	      WEXITSTATUS(st) == 0, "%s: stopped mid-%s", name, unpin ? "unpin" : "pin");
	rig_open(&g, name);
	pins_poll(&g.pins);
	pin_of(&g.pins, "main", commit, pending);
	CHECK(&c, (*commit || *pending) == ref_pinned(&g.s, blob_at(&g.s, R, "a")),
	      "%s: after the restart, the pin (%s) and its blob's pin (%s) agree", name,
	      *commit || *pending ? "there" : "gone",
	      ref_pinned(&g.s, blob_at(&g.s, R, "a")) ? "pinned" : "not pinned");
	rig_close(&g);
}

int main(void)
{
	snprintf(top, sizeof(top), "/var/tmp/wfs-pinfaults-XXXXXX");
	check_tmpdir(top);
	check_mkdirs(top, "hub");
	keep_walk_fails("models--t--keep", 1, 0);
	keep_walk_fails("models--t--entry", 11, 1);
	test_unpin_listing_fails();
	test_revision_deleted();
	test_not_saved();
	test_excluded_elsewhere();
	test_download_in_progress();
	test_hot_names_fail();
	test_request_behind_a_hung_walk();
	stop_mid_pin(0, CRASH_BEFORE, "stoppin1");
	stop_mid_pin(0, CRASH_AFTER, "stoppin2");
	stop_mid_pin(1, CRASH_BEFORE, "stopunpin1");
	stop_mid_pin(1, CRASH_AFTER, "stopunpin2");
	check_rmtree(top);
	printf("pinfaults: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
