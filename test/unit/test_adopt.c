/* test_adopt.c - a blob whose bytes are a local copy's already is hashed
 * from the NAS and shares that copy (store_copy.c adopt_one), without
 * mounting: a hub tree on disk and the store driven through the calls the
 * daemon makes.
 *
 *   adopt    a blob whose content address and size are a local blob's is
 *            hashed, not copied: it shares that copy with no room free for
 *            a second one; other bytes under that name are a mismatch; a
 *            local blob whose name was not its bytes' gets a copy made
 *   changed  a copy changed on disk since it was verified is not shared:
 *            a copy is made and renamed over it, and every local blob
 *            serves the NAS's bytes, then and after a restart (sharing it
 *            recorded the changed file as proven, served with no re-hash)
 *   rehash   a copy whose source changed while it was made, renamed over
 *            the copy of a blob whose start-up re-hash is still to come,
 *            is left for that re-hash (--wrap=fetch_hash_file holds the
 *            re-hash of another blob meanwhile, --wrap=fsync changes the
 *            source after the rename): it was removed, and a good copy lost
 */
#include "check_hub.h"
#include "fetch.h"
#include "fsyncs.h"
#include "store.h"
#include "store_int.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB 1024u
#define BLOB (256 * KiB)

static struct check_count c;

static int files_in(const char *local, const char *sub)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", local, sub);
	return check_count_files(p);
}

static atomic_int hashed_only, copied_after_all, changed_on_disk;

static void on_log(void *arg, int prio, const char *msg)
{
	(void)arg;
	(void)prio;
	if (strstr(msg, "hashing the NAS file to share it"))
		atomic_fetch_add(&hashed_only, 1);
	if (strstr(msg, "no local copy has its bytes"))
		atomic_fetch_add(&copied_after_all, 1);
	if (strstr(msg, "changed on disk since it was verified"))
		atomic_fetch_add(&changed_on_disk, 1);
}

static void test_adopt(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 1, .policy = &pol };
	struct store_hooks hooks = { .log = on_log };
	struct store s;
	struct store_usage u;
	struct blob *a, *b, *bad, *l, *t;
	char local[PATH_MAX * 2], sha[65], sha2[65], rel[PATH_MAX];
	uint64_t ch;

	check_policy_manual(&pol);
	check_store_dir(top, "local-adopt", local, sizeof(local));
	mkdirs("hub/models--t--p/blobs");
	mkdirs("hub/models--t--q/blobs");
	mkdirs("hub/models--t--r/blobs");
	check_pattern_sha(BLOB, 21, sha);
	snprintf(rel, sizeof(rel), "hub/models--t--p/blobs/%s", sha);
	put(rel, BLOB, 21);
	snprintf(rel, sizeof(rel), "hub/models--t--q/blobs/%s", sha);
	put(rel, BLOB, 21);
	snprintf(rel, sizeof(rel), "hub/models--t--r/blobs/%s", sha);
	put(rel, BLOB, 22); /* other bytes under that name */
	CHECK(&c, store_open(&s, local, &opt, &hooks) == 0, "open");
	the_store = &s;
	ch = store_charge(&s, BLOB);
	pol.store_max = ch + ch / 2; /* one copy, never two at once */
	CHECK(&c, store_start(&s) == 0, "start");
	snprintf(rel, sizeof(rel), "hub/models--t--p/blobs/%s", sha);
	a = blob_at(rel);
	snprintf(rel, sizeof(rel), "hub/models--t--q/blobs/%s", sha);
	b = blob_at(rel);
	snprintf(rel, sizeof(rel), "hub/models--t--r/blobs/%s", sha);
	bad = blob_at(rel);

	store_promote(&s, a, 1, 1);
	CHECK(&c, store_wait_settled(&s, a, 30000) == BLOB_LOCAL, "a local: %s", info(a)->reason);
	CHECK(&c, promote(b) == BLOB_LOCAL, "b local with no room for a second copy: %s",
	      info(b)->reason);
	CHECK(&c, atomic_load(&hashed_only) == 1, "hashed, not copied: %d",
	      atomic_load(&hashed_only));
	CHECK(&c, !strcmp(info(a)->xxh, info(b)->xxh) && files_in(local, "data") == 1 &&
	      files_in(local, "tmp") == 0, "b shares a's copy: %d in data/, %d in tmp/",
	      files_in(local, "data"), files_in(local, "tmp"));
	store_usage(&s, &u);
	CHECK(&c, u.used == ch && u.reserved == 0 && atomic_load(&s.evicted) == 0,
	      "no new room: used %llu, reserved %llu, %llu evicted", (unsigned long long)u.used,
	      (unsigned long long)u.reserved, (unsigned long long)atomic_load(&s.evicted));
	CHECK(&c, promote(bad) == BLOB_MISMATCH && strstr(info(bad)->reason, "does not match"),
	      "other bytes under the name: %s, %s", st(bad), info(bad)->reason);
	CHECK(&c, blob_state(a) == BLOB_LOCAL && blob_state(b) == BLOB_LOCAL &&
	      files_in(local, "data") == 1, "the shared copy untouched");

	/* A local blob that learnt a content address after its copy was
	 * verified (under another name first): the hashes decide, and a blob
	 * with that name's real bytes gets a copy of its own. */
	store_pin(&s, a, 0);
	store_evict(&s, a, 0);
	store_evict(&s, b, 0);
	pol.store_max = 3 * ch;
	check_pattern_sha(BLOB, 23, sha2);
	snprintf(rel, sizeof(rel), "hub/models--t--p/blobs/%s", sha2);
	put(rel, BLOB, 24); /* not its name's bytes */
	l = blob_named(rel, "plain-name");
	CHECK(&c, promote(l) == BLOB_LOCAL, "l local under a plain name: %s", info(l)->reason);
	blob_named(rel, sha2); /* the same file, now seen under its content address */
	CHECK(&c, !strcmp(info(l)->id, sha2), "l's name is a content address now: %s", info(l)->id);
	snprintf(rel, sizeof(rel), "hub/models--t--q/blobs/%s", sha2);
	put(rel, BLOB, 23);
	t = blob_at(rel);
	CHECK(&c, promote(t) == BLOB_LOCAL, "t local: %s", info(t)->reason);
	snprintf(sha, sizeof(sha), "%s", info(l)->xxh);
	CHECK(&c, strcmp(info(t)->xxh, sha) && files_in(local, "data") == 2,
	      "t copied, not l's copy: %d in data/", files_in(local, "data"));
	CHECK(&c, atomic_load(&hashed_only) == 3 && atomic_load(&copied_after_all) == 1,
	      "t hashed first, then copied: %d, %d", atomic_load(&hashed_only),
	      atomic_load(&copied_after_all));
	store_close(&s);
	policy_opts_free(&pol);
}

/* Does @b's local copy hold the @n bytes of pattern @seed? */
static int copy_holds(const char *local, struct blob *b, size_t n, unsigned seed)
{
	char p[PATH_MAX * 2];
	const char *xxh = info(b)->xxh;

	snprintf(p, sizeof(p), "%s/data/%.2s/%s", local, xxh, xxh);
	return check_holds_pattern(p, n, seed);
}

/* Bytes written into @b's copy in place, its size kept (an operator's
 * edit, a tool writing into LOCAL_STORE). */
static void change_copy(const char *local, struct blob *b)
{
	char p[PATH_MAX * 2];
	const char *xxh = info(b)->xxh;
	int fd;

	snprintf(p, sizeof(p), "%s/data/%.2s/%s", local, xxh, xxh);
	if (chmod(p, 0600) < 0 || (fd = open(p, O_WRONLY)) < 0) {
		perror(p);
		exit(2);
	}
	if (pwrite(fd, "\0\1\2", 3, BLOB / 3) != 3)
		exit(2);
	close(fd);
	chmod(p, 0400);
}

static void test_adopt_changed(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 1, .policy = &pol };
	struct store_hooks hooks = { .log = on_log };
	struct store s;
	struct blob *a, *b;
	char local[PATH_MAX * 2], sha[65], pa[PATH_MAX], pb[PATH_MAX];

	check_policy_manual(&pol);
	check_store_dir(top, "local-changed", local, sizeof(local));
	mkdirs("hub/models--c--p/blobs");
	mkdirs("hub/models--c--q/blobs");
	check_pattern_sha(BLOB, 31, sha);
	snprintf(pa, sizeof(pa), "hub/models--c--p/blobs/%s", sha);
	snprintf(pb, sizeof(pb), "hub/models--c--q/blobs/%s", sha);
	put(pa, BLOB, 31);
	put(pb, BLOB, 31);
	CHECK(&c, store_open(&s, local, &opt, &hooks) == 0, "open");
	the_store = &s;
	CHECK(&c, store_start(&s) == 0, "start");
	a = blob_at(pa);
	CHECK(&c, promote(a) == BLOB_LOCAL, "a local: %s", info(a)->reason);
	change_copy(local, a);
	b = blob_at(pb);
	CHECK(&c, promote(b) == BLOB_LOCAL, "b local: %s", info(b)->reason);
	CHECK(&c, atomic_load(&changed_on_disk) == 1, "b not shared with the changed copy");
	CHECK(&c, copy_holds(local, a, BLOB, 31) && copy_holds(local, b, BLOB, 31) &&
	      files_in(local, "data") == 1, "a and b serve one copy of the NAS's bytes");
	store_close(&s);

	CHECK(&c, store_open(&s, local, &opt, &hooks) == 0, "open again");
	CHECK(&c, store_start(&s) == 0, "start again");
	a = blob_at(pa);
	b = blob_at(pb);
	CHECK(&c, store_wait_settled(&s, a, 30000) == BLOB_LOCAL &&
	      store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "local after a restart: %s, %s",
	      st(a), st(b));
	CHECK(&c, copy_holds(local, a, BLOB, 31) && copy_holds(local, b, BLOB, 31),
	      "after a restart, the NAS's bytes");
	store_close(&s);
	policy_opts_free(&pol);
}

/* ---- rehash ---- */

static struct {
	char r0_copy[PATH_MAX * 2]; /* the first re-hashed blob's copy */
	_Atomic int armed;
	const char *b_rel;          /* the NAS file copied while it is hashed */
	struct blob *b;
	int b_state;
} hold;

/* After the rename of b's copy into data/ (no store lock held): the NAS
 * rewrites b's source, and a reader's stat shows the store. */
static void change_b_source(const char *dir)
{
	char p[PATH_MAX * 2];
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { 1234567, 0 } };
	struct stat sb;

	if (!strstr(dir, "/data/")) {
		__atomic_store_n(&fsyncs_dir_hook, change_b_source, __ATOMIC_RELEASE);
		return;
	}
	snprintf(p, sizeof(p), "%s/%s", top, hold.b_rel);
	if (utimensat(AT_FDCWD, p, ts, 0) < 0 || stat(p, &sb) < 0)
		exit(2);
	store_source_attrs(the_store, hold.b, &sb);
}

/* --wrap=fetch_hash_file: the first start-up re-hash, when armed, copies
 * the other re-hashed blob's bytes from another NAS file first. */
int __real_fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog);
int __wrap_fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog);
int __wrap_fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog)
{
	if (atomic_exchange(&hold.armed, 0)) {
		hold.b_rel = strcmp(path, hold.r0_copy) ? "hub/models--h--two/blobs/p0" :
			     "hub/models--h--two/blobs/p1";
		hold.b = blob_at(hold.b_rel);
		__atomic_store_n(&fsyncs_dir_hook, change_b_source, __ATOMIC_RELEASE);
		store_promote(the_store, hold.b, 0, 1);
		hold.b_state = store_wait_settled(the_store, hold.b, 30000);
	}
	return __real_fetch_hash_file(path, xxh_hex, prog);
}

static void test_rehash_pending(void)
{
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *r0, *r1;
	char local[PATH_MAX * 2], copy[2][PATH_MAX * 2];

	check_store_dir(top, "local-rehash", local, sizeof(local));
	mkdirs("hub/models--h--one/blobs");
	mkdirs("hub/models--h--two/blobs");
	put("hub/models--h--one/blobs/p0", BLOB, 41);
	put("hub/models--h--one/blobs/p1", BLOB, 42);
	put("hub/models--h--two/blobs/p0", BLOB, 41);
	put("hub/models--h--two/blobs/p1", BLOB, 42);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	the_store = &s;
	r0 = blob_at("hub/models--h--one/blobs/p0");
	r1 = blob_at("hub/models--h--one/blobs/p1");
	CHECK(&c, promote(r0) == BLOB_LOCAL && promote(r1) == BLOB_LOCAL, "r0, r1 local");
	snprintf(copy[0], sizeof(copy[0]), "%s/data/%.2s/%s", local, info(r0)->xxh, info(r0)->xxh);
	snprintf(copy[1], sizeof(copy[1]), "%s/data/%.2s/%s", local, info(r1)->xxh, info(r1)->xxh);
	store_close(&s);
	/* touched: each re-hashed before it serves */
	CHECK(&c, utimensat(AT_FDCWD, copy[0], NULL, 0) == 0 &&
	      utimensat(AT_FDCWD, copy[1], NULL, 0) == 0, "touch the copies");
	snprintf(hold.r0_copy, sizeof(hold.r0_copy), "%s", copy[0]);
	atomic_store(&hold.armed, 1);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open again");
	r0 = blob_at("hub/models--h--one/blobs/p0");
	r1 = blob_at("hub/models--h--one/blobs/p1");
	CHECK(&c, store_wait_settled(&s, r0, 30000) == BLOB_LOCAL &&
	      store_wait_settled(&s, r1, 30000) == BLOB_LOCAL, "both re-verified: %s (%s), %s (%s)",
	      st(r0), info(r0)->reason, st(r1), info(r1)->reason);
	CHECK(&c, hold.b && hold.b_state == BLOB_FAILED &&
	      strstr(info(hold.b)->reason, "source changed during the copy"),
	      "the copy made meanwhile is not used: %s", hold.b ? info(hold.b)->reason : "none");
	CHECK(&c, copy_holds(local, r0, BLOB, 41) && copy_holds(local, r1, BLOB, 42),
	      "their copies hold the NAS's bytes");
	store_close(&s);
}

int main(void)
{
	snprintf(top, sizeof(top), "/var/tmp/wfs-adopt-XXXXXX");
	check_tmpdir(top);
	test_adopt();
	test_adopt_changed();
	test_rehash_pending();
	check_rmtree(top);
	printf("adopt: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
