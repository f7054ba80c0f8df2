/* test_space.c - the room of a copy shared by several blobs (the same
 * bytes in two repos: one file per content hash), without mounting: a hub
 * tree on disk and the store driven through the calls the daemon makes.
 *
 *   count    a shared copy counts once (used, bytes, pinned), as on disk
 *   evict    eviction for room takes whole copies, least recently used by
 *            the latest use of any of their blobs, never one another blob
 *            still serves (pinned, open) or that a blob evicted while open
 *            may hold; a copy that fits with the truth counted evicts none
 *   held     an evicted-open blob's copy removed by evicting the last blob
 *            sharing it is held until that reader closes
 *   pinfull  a ref pin's blob that does not fit is tried again after a
 *            backoff, not at every poll of the ref (each try a log line)
 *   range    a range makes its room as a whole copy does: an older unpinned
 *            copy is evicted for it; and a whole copy counts the range's
 *            room
 *   race     a blob evicted after another's copy of the same bytes is
 *            renamed into data/, before that copy is recorded, leaves the
 *            file: it is the other's (it was unlinked, and the other went
 *            LOCAL with no file)
 *   beside   a copy of bytes already local under a name that is no content
 *            address shares the proven file instead of renaming over it
 *            (a reader of that file held blocks counted nowhere)
 *   heldtwo  a shared copy evicted under two readers is held until the
 *            last of them closes, not the first
 *   kept     a request larger than the room: the "no room" of one of its
 *            blobs holds for the others without a walk, and not after an
 *            unpin, a last close, a reservation given back, an eviction,
 *            nor for a later request
 *   onetime  the blobs of one request share its time: copies landing while
 *            it is queued are not evicted for its later blobs
 *   counts   the room the store counts as copies come and go (no walk of
 *            the table: store_copies.c) is the table's own tally after
 *            each of 400 random steps -- promotions (some shared by
 *            hashing only), evictions for room and by hand, evictions of
 *            open blobs, read errors that demote every sharer, pins,
 *            restarts --, and the copies never take more than store_max
 */
#include "check_hub.h"
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

/* Two uses either side of this are ordered (the LRU clock is coarse). */
static void next_use_tick(void)
{
	uint64_t t0 = store_now_ns();

	while (store_now_ns() == t0)
		usleep(1000);
}

static void use(struct blob *b)
{
	store_note_open(the_store, b, NULL);
	store_note_read(the_store, b, 4096, 1);
	store_note_close(the_store, b);
	next_use_tick();
}

/* Blocks of the files in LOCAL_STORE/data: what the copies take. */
static uint64_t du_data(const char *local)
{
	char cmd[PATH_MAX * 2];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "find '%s/data' -type f -printf '%%k\\n' | "
		 "awk '{s+=$1} END {print s+0}'", local);
	f = popen(cmd, "r");
	if (!f || fscanf(f, "%llu", &kb) != 1)
		kb = ~0ull;
	if (f)
		pclose(f);
	return kb * 1024;
}

/* A store of its own, LOCAL_STORE top/@name, started with room for
 * @halves halves of a copy of BLOB (3: one copy fits, two do not; 5: two,
 * not three), its copies asked for by hand (@pol, which must outlive it).
 * Returns a copy's charge. */
static uint64_t open_room(struct store *s, struct policy_opts *pol, const char *name,
			  unsigned halves)
{
	struct store_opts opt = { .workers = 1, .policy = pol };
	char local[PATH_MAX * 2];

	check_policy_manual(pol);
	check_store_dir(top, name, local, sizeof(local));
	CHECK(&c, store_open(s, local, &opt, NULL) == 0, "open %s", name);
	the_store = s;
	pol->store_max = store_charge(s, BLOB) * halves / 2;
	CHECK(&c, store_start(s) == 0, "start %s", name);
	return store_charge(s, BLOB);
}

/* Two blobs of the same bytes under names that are no content address:
 * the second is copied (nothing tells the bytes before), and its copy,
 * finding the first's file under its name and proven, shares it instead of
 * renaming over it -- a reader of the first kept the replaced file's
 * blocks, counted nowhere, and store_max was passed by a copy's size. */
static void test_publish_beside_open(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 1, .policy = &pol };
	char local[PATH_MAX * 2], pa[PATH_MAX + 64], pb[PATH_MAX + 64];
	struct stat held, named;
	struct blob *a, *b;
	struct store s;
	int fd;

	check_policy_manual(&pol);
	check_store_dir(top, "beside", local, sizeof(local));
	mkdirs("hub/models--t--pa/blobs");
	mkdirs("hub/models--t--pb/blobs");
	put("hub/models--t--pa/blobs/same", BLOB, 17);
	put("hub/models--t--pb/blobs/same", BLOB, 17);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	the_store = &s;
	a = blob_at("hub/models--t--pa/blobs/same");
	b = blob_at("hub/models--t--pb/blobs/same");
	CHECK(&c, promote(a) == BLOB_LOCAL, "a local");
	store_note_open(&s, a, NULL);
	fd = store_local_path(&s, a, pa, sizeof(pa)) == 0 ? open(pa, O_RDONLY) : -1;
	CHECK(&c, fd >= 0, "a's copy opened, as a reader does");
	CHECK(&c, promote(b) == BLOB_LOCAL && store_local_path(&s, b, pb, sizeof(pb)) == 0 &&
	      !strcmp(pa, pb), "b local, the same file name");
	CHECK(&c, fstat(fd, &held) == 0 && stat(pb, &named) == 0 && held.st_ino == named.st_ino &&
	      held.st_nlink == 1 && du_data(local) == (uint64_t)held.st_blocks * 512,
	      "the reader's file is the one data/ names, one copy on disk (inode %llu / %llu, "
	      "links %llu, %llu bytes)", (unsigned long long)held.st_ino,
	      (unsigned long long)named.st_ino, (unsigned long long)held.st_nlink,
	      (unsigned long long)du_data(local));
	if (fd >= 0)
		close(fd);
	store_note_close(&s, a);
	store_close(&s);
	policy_opts_free(&pol);
}

/* A copy shared by two blobs, each open by a reader, both evicted: the
 * file's blocks are held until the last of the readers closes -- they
 * were until the first closed, and then two more copies fitted beside
 * the file the other still held, past store_max. */
static void test_held_by_two(void)
{
	struct policy_opts pol;
	char p[PATH_MAX + 64];
	struct blob *a, *b, *x, *y;
	struct store_usage u;
	struct store s;
	uint64_t ch;
	int fa, fb, fit;

	mkdirs("hub/models--t--ha/blobs");
	mkdirs("hub/models--t--hb/blobs");
	put("hub/models--t--ha/blobs/same", BLOB, 27);
	put("hub/models--t--hb/blobs/same", BLOB, 27);
	put("hub/models--t--hb/blobs/x", BLOB, 28);
	put("hub/models--t--hb/blobs/y", BLOB, 29);
	ch = open_room(&s, &pol, "heldtwo", 5);
	a = blob_at("hub/models--t--ha/blobs/same");
	b = blob_at("hub/models--t--hb/blobs/same");
	x = blob_at("hub/models--t--hb/blobs/x");
	y = blob_at("hub/models--t--hb/blobs/y");
	CHECK(&c, promote(a) == BLOB_LOCAL && promote(b) == BLOB_LOCAL, "a and b local, one file");
	store_note_open(&s, a, NULL);
	store_note_open(&s, b, NULL);
	fa = store_local_path(&s, a, p, sizeof(p)) == 0 ? open(p, O_RDONLY) : -1;
	fb = open(p, O_RDONLY);
	CHECK(&c, store_evict(&s, a, 0) == 1 && store_evict(&s, b, 0) == 1, "both evicted, open");
	close(fb);
	store_note_close(&s, b);
	store_usage(&s, &u);
	CHECK(&c, u.held == ch, "b's reader closed, a's holds the file: %llu held, %llu a copy",
	      (unsigned long long)u.held, (unsigned long long)ch);
	/* y may be refused, or may evict x (when the coarse clock has moved
	 * since x landed): either way one of them is local at the end. */
	promote(x);
	promote(y);
	fit = (blob_state(x) == BLOB_LOCAL) + (blob_state(y) == BLOB_LOCAL);
	CHECK(&c, fit == 1, "one more copy fits beside the held file, not two (%d; x %s, y %s)",
	      fit, st(x), st(y));
	close(fa);
	store_note_close(&s, a);
	store_usage(&s, &u);
	CHECK(&c, u.held == 0, "the last reader closed: nothing held (%llu)",
	      (unsigned long long)u.held);
	store_close(&s);
	policy_opts_free(&pol);
}

static void test_shared(void)
{
	struct policy_opts pol;
	struct store s;
	struct store_usage u;
	struct blob *a, *b, *x, *y, *z;
	char local[PATH_MAX * 2];
	uint64_t ch, ev;

	mkdirs("hub/models--t--one/blobs");
	mkdirs("hub/models--t--two/blobs");
	/* the same bytes in two repos; three other blobs */
	put("hub/models--t--one/blobs/same", BLOB, 7);
	put("hub/models--t--two/blobs/same", BLOB, 7);
	put("hub/models--t--two/blobs/x", BLOB, 8);
	put("hub/models--t--two/blobs/y", BLOB, 9);
	put("hub/models--t--two/blobs/z", BLOB, 10);
	ch = open_room(&s, &pol, "local", 5); /* two copies fit, three do not */
	snprintf(local, sizeof(local), "%s/local", top);
	a = blob_at("hub/models--t--one/blobs/same");
	b = blob_at("hub/models--t--two/blobs/same");
	x = blob_at("hub/models--t--two/blobs/x");
	y = blob_at("hub/models--t--two/blobs/y");
	z = blob_at("hub/models--t--two/blobs/z");

	/* count: a pinned, b promoted: one file, counted once */
	store_promote(&s, a, 1, 1);
	CHECK(&c, store_wait_settled(&s, a, 30000) == BLOB_LOCAL, "a local: %s", info(a)->reason);
	next_use_tick();
	CHECK(&c, promote(b) == BLOB_LOCAL, "b local: %s", info(b)->reason);
	CHECK(&c, !strcmp(info(a)->xxh, info(b)->xxh), "a and b share one copy");
	store_usage(&s, &u);
	CHECK(&c, u.blobs == 2 && u.used == ch && u.bytes == BLOB && u.pinned_bytes == ch &&
	      u.open_bytes == 0, "one copy counted once: %llu blobs, used %llu, bytes %llu, "
	      "pinned %llu (charge %llu)", (unsigned long long)u.blobs,
	      (unsigned long long)u.used, (unsigned long long)u.bytes,
	      (unsigned long long)u.pinned_bytes, (unsigned long long)ch);
	CHECK(&c, du_data(local) <= u.used, "as on disk: du %llu, used %llu",
	      (unsigned long long)du_data(local), (unsigned long long)u.used);
	store_room(&s, &ev);
	CHECK(&c, ev == 0, "b's copy is a's too (pinned): evicting b would free nothing: %llu",
	      (unsigned long long)ev);

	/* x fits beside them with the truth counted: nothing evicted */
	next_use_tick();
	CHECK(&c, promote(x) == BLOB_LOCAL, "x local: %s", info(x)->reason);
	CHECK(&c, blob_state(b) == BLOB_LOCAL && atomic_load(&s.evicted) == 0,
	      "b kept, nothing evicted (%s, %llu evicted)", st(b),
	      (unsigned long long)atomic_load(&s.evicted));

	/* evict: unpinned, the shared copy is used last through a; b's own use
	 * is the oldest of all, yet the copy goes by its latest use: x goes */
	store_pin(&s, a, 0);
	use(x);
	use(a);
	CHECK(&c, promote(y) == BLOB_LOCAL, "y local: %s", info(y)->reason);
	CHECK(&c, blob_state(x) == BLOB_NAS && blob_state(a) == BLOB_LOCAL &&
	      blob_state(b) == BLOB_LOCAL, "x evicted, the shared copy kept (x %s, a %s, b %s)",
	      st(x), st(a), st(b));
	CHECK(&c, atomic_load(&s.evicted) == 1, "one eviction: %llu",
	      (unsigned long long)atomic_load(&s.evicted));

	/* a copy with an open blob is not freeable, whichever blob is open */
	next_use_tick();
	store_note_open(&s, b, NULL);
	store_room(&s, &ev);
	CHECK(&c, ev == ch, "only y's copy is evictable: %llu", (unsigned long long)ev);
	CHECK(&c, promote(z) == BLOB_LOCAL && blob_state(y) == BLOB_NAS &&
	      blob_state(a) == BLOB_LOCAL && blob_state(b) == BLOB_LOCAL,
	      "z took y's room, the copy open through b kept (z %s, y %s, a %s, b %s)",
	      st(z), st(y), st(a), st(b));

	/* a whole copy goes when it is the least recently used: both blobs */
	store_note_close(&s, b);
	use(z);
	CHECK(&c, promote(y) == BLOB_LOCAL && blob_state(a) == BLOB_NAS &&
	      blob_state(b) == BLOB_NAS && blob_state(z) == BLOB_LOCAL,
	      "y took the shared copy's room: both its blobs evicted (y %s, a %s, b %s, z %s)",
	      st(y), st(a), st(b), st(z));
	store_usage(&s, &u);
	CHECK(&c, u.used == 2 * ch && u.blobs == 2 && du_data(local) <= u.used,
	      "two copies: used %llu, du %llu", (unsigned long long)u.used,
	      (unsigned long long)du_data(local));

	/* held: b evicted while open, its copy kept for a; evicting a then
	 * removes the file b's reader may hold: held until b closes, and
	 * meanwhile the copy was no candidate for room */
	store_evict(&s, y, 0);
	store_evict(&s, z, 0);
	CHECK(&c, promote(a) == BLOB_LOCAL && promote(b) == BLOB_LOCAL, "a, b local again");
	store_note_open(&s, b, NULL);
	CHECK(&c, store_evict(&s, b, 0) == 1 && blob_state(a) == BLOB_LOCAL, "b evicted while open");
	store_usage(&s, &u);
	CHECK(&c, u.used == ch && u.held == 0, "the copy still a's: used %llu, held %llu",
	      (unsigned long long)u.used, (unsigned long long)u.held);
	store_room(&s, &ev);
	CHECK(&c, ev == 0, "b's reader may hold a's copy: not evictable (%llu)",
	      (unsigned long long)ev);
	CHECK(&c, store_evict(&s, a, 0) == 1, "a evicted");
	store_usage(&s, &u);
	CHECK(&c, u.used == 0 && u.held == ch, "removed, held for b's reader: used %llu, held %llu",
	      (unsigned long long)u.used, (unsigned long long)u.held);
	store_note_close(&s, b);
	store_usage(&s, &u);
	CHECK(&c, u.held == 0, "back at b's close: %llu", (unsigned long long)u.held);

	store_close(&s);
	policy_opts_free(&pol);
}

/* A ref pin asks for the blobs of its revision not local at every poll
 * (pins.c pin_set): one that does not fit waits for its backoff. */
static void test_pin_no_room(void)
{
	struct policy_opts pol;
	struct store s;
	struct blob *held, *want;
	uint64_t tries;

	mkdirs("hub/models--t--full/blobs");
	put("hub/models--t--full/blobs/held", BLOB, 21);
	put("hub/models--t--full/blobs/want", BLOB, 22);
	open_room(&s, &pol, "local-pinfull", 3);
	held = blob_at("hub/models--t--full/blobs/held");
	want = blob_at("hub/models--t--full/blobs/want");
	store_pin(&s, held, 1);
	CHECK(&c, promote(held) == BLOB_LOCAL, "the pinned copy fills the room");
	store_pin(&s, want, 1);
	for (int poll = 0; poll < 5; poll++) {
		store_request(&s, want, STORE_BY_PIN, 0);
		CHECK(&c, store_wait_settled(&s, want, 30000) == BLOB_NAS &&
		      strstr(info(want)->reason, "no room"), "no room: %s", info(want)->reason);
	}
	tries = s.no_room;
	CHECK(&c, tries == 1, "5 polls of the ref tried the copy that cannot fit %llu times",
	      (unsigned long long)tries);
	CHECK(&c, info(want)->auto_retry, "it is tried again later by itself");
	/* an operator's request is not held back */
	store_promote(&s, want, 0, 1);
	CHECK(&c, store_wait_settled(&s, want, 30000) == BLOB_NAS && s.no_room == tries + 1,
	      "wfsctl promote tries at once");
	store_close(&s);
	policy_opts_free(&pol);
}

/* A range makes its room as a whole copy does: an unpinned copy used
 * before the range was asked for is evicted for it. */
static void test_range_evicts(void)
{
	struct policy_opts pol;
	struct store s;
	struct blob *old, *b;
	struct blob_info in;

	mkdirs("hub/models--t--range/blobs");
	put("hub/models--t--range/blobs/old", BLOB, 23);
	put("hub/models--t--range/blobs/part", 2 * BLOB, 24);
	open_room(&s, &pol, "local-range", 3);
	old = blob_at("hub/models--t--range/blobs/old");
	b = blob_at("hub/models--t--range/blobs/part");
	CHECK(&c, promote(old) == BLOB_LOCAL, "an unpinned copy fills the room");
	use(old);
	next_use_tick();
	CHECK(&c, store_part_request(&s, b, &(struct brange){ 0, BLOB }, 1, 0) == BLOB,
	      "a range of the other blob is asked for");
	CHECK(&c, wait_parts(&s, b), "the range copy ends");
	blob_info(&s, b, &in);
	CHECK(&c, in.part_bytes == BLOB && blob_state(old) == BLOB_NAS,
	      "the range is local (%llu bytes: %s), the older copy evicted for it (%s)",
	      (unsigned long long)in.part_bytes, in.part_reason, st(old));
	/* and a whole copy counts the range's room (on the counts kept too,
	 * store_copies.c): none left for it */
	CHECK(&c, promote(old) == BLOB_NAS && strstr(info(old)->reason, "no room"),
	      "the range leaves no room for a whole copy: %s (%s)", st(old), info(old)->reason);
	store_close(&s);
	policy_opts_free(&pol);
}

static struct blob *race_victim;

/* After the rename into data/, no store lock held: the evict a wfsctl
 * evict of the other repo's blob makes there. */
static void evict_after_publish(const char *dir)
{
	if (!strstr(dir, "/data/")) {
		/* not the publish yet */
		__atomic_store_n(&fsyncs_dir_hook, evict_after_publish, __ATOMIC_RELEASE);
		return;
	}
	CHECK(&c, store_evict(the_store, race_victim, 1) == 1, "a evicted after b's rename");
}

static void test_publish_race(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 1, .policy = &pol };
	struct store s;
	struct blob *a, *b;
	char local[PATH_MAX * 2], path[PATH_MAX * 3];

	check_policy_manual(&pol);
	check_store_dir(top, "rlocal", local, sizeof(local));
	mkdirs("hub/models--r--one/blobs");
	mkdirs("hub/models--r--two/blobs");
	put("hub/models--r--one/blobs/tok", BLOB, 21);
	put("hub/models--r--two/blobs/tok", BLOB, 21);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	the_store = &s;
	a = blob_at("hub/models--r--one/blobs/tok");
	b = blob_at("hub/models--r--two/blobs/tok");
	CHECK(&c, promote(a) == BLOB_LOCAL, "a local: %s", info(a)->reason);
	race_victim = a;
	__atomic_store_n(&fsyncs_dir_hook, evict_after_publish, __ATOMIC_RELEASE);
	CHECK(&c, promote(b) == BLOB_LOCAL, "b local: %s", info(b)->reason);
	CHECK(&c, !__atomic_load_n(&fsyncs_dir_hook, __ATOMIC_ACQUIRE), "the hook ran (b's copy was renamed into data/)");
	CHECK(&c, blob_state(a) == BLOB_NAS, "a evicted: %s", st(a));
	CHECK(&c, store_local_path(&s, b, path, sizeof(path)) == 0 && access(path, R_OK) == 0,
	      "b's copy %s is there", path);
	store_close(&s);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0, "reopen");
	b = blob_at("hub/models--r--two/blobs/tok");
	CHECK(&c, blob_state(b) == BLOB_LOCAL, "b local after a restart: %s (%s)", st(b),
	      info(b)->reason);
	store_close(&s);
	the_store = NULL;
}

#define NC_REPO 4
#define NC_EACH 3
#define NC_BYTES 4

static struct blob *counts_blob(int i)
{
	char rel[160], sha[65];

	check_pattern_sha(BLOB / 4, 40 + i % NC_BYTES, sha);
	snprintf(rel, sizeof(rel), "hub/models--c--%d/blobs/%s", i / NC_EACH, sha);
	return blob_at(rel);
}

/* One random step on @v; 1 when it was a restart (@v looked up again). */
static int counts_step(struct store *s, const struct store_opts *opt, const char *local,
		       struct blob **v, unsigned *seed)
{
	struct blob *b = v[rand_r(seed) % (NC_REPO * NC_EACH)];
	int op = rand_r(seed) % 20;

	if (op < 8) {
		promote(b);
	} else if (op < 11) {
		store_evict(s, b, 0);
	} else if (op < 13) {
		store_note_open(s, b, NULL);
		store_evict(s, b, 0);
		store_note_close(s, b);
	} else if (op < 15) {
		if (blob_state(b) == BLOB_LOCAL)
			store_local_read_error(s, b, blob_copy_gen(b), EIO);
	} else if (op < 19) {
		store_pin(s, b, rand_r(seed) % 2);
	} else {
		store_close(s);
		CHECK(&c, store_open(s, local, opt, NULL) == 0 && store_start(s) == 0, "reopen");
		for (int i = 0; i < NC_REPO * NC_EACH; i++)
			v[i] = counts_blob(i);
		return 1;
	}
	return 0;
}

static void test_counts(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol };
	struct store s;
	struct store_usage u;
	struct blob *v[NC_REPO * NC_EACH];
	char local[PATH_MAX * 2], rel[160], sha[65];
	unsigned seed = 7;
	int restarts = 0, wrong = -1, over = -1;

	check_policy_manual(&pol);
	check_store_dir(top, "clocal", local, sizeof(local));
	for (int i = 0; i < NC_REPO * NC_EACH; i++) {
		snprintf(rel, sizeof(rel), "hub/models--c--%d/blobs", i / NC_EACH);
		mkdirs(rel);
		check_pattern_sha(BLOB / 4, 40 + i % NC_BYTES, sha);
		snprintf(rel, sizeof(rel), "hub/models--c--%d/blobs/%s", i / NC_EACH, sha);
		put(rel, BLOB / 4, 40 + i % NC_BYTES);
	}
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	the_store = &s;
	pol.store_max = 3 * store_charge(&s, BLOB / 4); /* three of the four contents fit */
	for (int i = 0; i < NC_REPO * NC_EACH; i++)
		v[i] = counts_blob(i);
	for (int step = 0; step < 400; step++) {
		restarts += counts_step(&s, &opt, local, v, &seed);
		store_usage(&s, &u);
		if (atomic_load(&s.copies_recounted) && wrong < 0)
			wrong = step;
		if (u.used > pol.store_max && over < 0)
			over = step;
	}
	CHECK(&c, wrong < 0, "the counts kept differed from the tally (first after step %d)", wrong);
	CHECK(&c, over < 0, "the copies took more than store_max after step %d", over);
	CHECK(&c, restarts > 5 && atomic_load(&s.evicted) > 0 && u.blobs > 0,
	      "the steps did what they are for: %d restarts, %llu evicted, %llu local now",
	      restarts, (unsigned long long)atomic_load(&s.evicted), (unsigned long long)u.blobs);
	CHECK(&c, du_data(local) <= u.used, "as on disk: du %llu, used %llu",
	      (unsigned long long)du_data(local), (unsigned long long)u.used);
	store_close(&s);
	the_store = NULL;
	policy_opts_free(&pol);
}

/* Does a copy of @b find room now, for a request made at @want_ns?  What
 * it reserves is given back at once (what it evicts stays evicted). */
static int room_for(struct store *s, struct blob *b, uint64_t want_ns, char *why, size_t wsz)
{
	int evicted = 0, r;

	pthread_mutex_lock(&s->lock);
	b->want_ns = want_ns;
	r = space_reserve_locked(s, b, store_charge(s, b->size), &b->reserved, why, wsz, &evicted);
	if (r == 0)
		space_release_locked(s, b);
	pthread_mutex_unlock(&s->lock);
	return r == 0;
}

/* No room for @a, then none for @b either -- the verdict kept, no walk. */
static void no_room_kept(struct store *s, struct blob *a, struct blob *b, uint64_t want_ns,
			 const char *what)
{
	char why[512];
	uint64_t hits = atomic_load(&s->no_room_kept_hits);

	CHECK(&c, !room_for(s, a, want_ns, why, sizeof(why)) && strstr(why, "no room"),
	      "%s: no room (%s)", what, why);
	CHECK(&c, !room_for(s, b, want_ns, why, sizeof(why)) && strstr(why, "no room") &&
	      atomic_load(&s->no_room_kept_hits) == hits + 1,
	      "%s: none for a second blob of the request, by the verdict kept (%s)", what, why);
}

static void relocal(struct blob *b, int pin)
{
	CHECK(&c, promote(b) == BLOB_LOCAL, "%s local again", b->key);
	store_pin(the_store, b, pin);
	next_use_tick();
}

/* A request larger than the room: the "no room" of one of its blobs is
 * kept for the others (store_space.c), and never outlives what may make
 * room -- an unpin, a last close, a reservation given back, an eviction,
 * or a later request, for which copies used since are evictable. */
static void test_kept(void)
{
	struct policy_opts pol;
	struct store s;
	struct blob *a1, *a2, *s1, *s2, *w1, *w2, *w3;
	char why[512];
	uint64_t t;

	mkdirs("hub/models--t--kept/blobs");
	put("hub/models--t--kept/blobs/a1", BLOB, 41);
	put("hub/models--t--kept/blobs/a2", BLOB, 42);
	put("hub/models--t--kept/blobs/w1", BLOB, 43);
	put("hub/models--t--kept/blobs/w2", BLOB, 44);
	put("hub/models--t--kept/blobs/w3", BLOB, 45);
	put("hub/models--t--kept/blobs/s1", BLOB / 4, 46);
	put("hub/models--t--kept/blobs/s2", BLOB / 4 + 8 * KiB, 47);
	open_room(&s, &pol, "local-kept", 3);
	pol.store_max = store_charge(&s, BLOB) * 5 / 2; /* two copies */
	a1 = blob_at("hub/models--t--kept/blobs/a1");
	a2 = blob_at("hub/models--t--kept/blobs/a2");
	w1 = blob_at("hub/models--t--kept/blobs/w1");
	w2 = blob_at("hub/models--t--kept/blobs/w2");
	w3 = blob_at("hub/models--t--kept/blobs/w3");
	s1 = blob_at("hub/models--t--kept/blobs/s1");
	s2 = blob_at("hub/models--t--kept/blobs/s2");
	relocal(a1, 1);
	relocal(a2, 1);

	/* an unpin */
	no_room_kept(&s, w1, w2, store_now_ns(), "both copies pinned");
	store_pin(&s, a1, 0);
	CHECK(&c, room_for(&s, w2, s.room_kept.want_ns, why, sizeof(why)) &&
	      blob_state(a1) == BLOB_NAS, "after an unpin: room, a1 evicted (%s, %s)", why,
	      st(a1));
	relocal(a1, 1);

	/* a last close */
	store_note_open(&s, a1, NULL);
	store_pin(&s, a1, 0);
	next_use_tick();
	t = store_now_ns();
	no_room_kept(&s, w1, w2, t, "a1 open, a2 pinned");
	store_note_close(&s, a1);
	CHECK(&c, room_for(&s, w2, t, why, sizeof(why)) && blob_state(a1) == BLOB_NAS,
	      "after the last close: room, a1 evicted (%s, %s)", why, st(a1));

	/* a reservation given back (a copy in flight that failed), when the
	 * room is still found only by evicting: a2 and s2 pinned, s1 evictable,
	 * w3's small copy in flight (the counted check fails before and after) */
	relocal(s2, 1);
	relocal(s1, 0);
	t = store_now_ns();
	pthread_mutex_lock(&s.lock);
	CHECK(&c, space_reserve_locked(&s, w3, store_charge(&s, BLOB / 4), &w3->reserved, why,
				       sizeof(why), &(int){ 0 }) == 0, "w3 reserves room");
	pthread_mutex_unlock(&s.lock);
	no_room_kept(&s, w1, w2, t, "w3's copy in flight");
	pthread_mutex_lock(&s.lock);
	space_release_locked(&s, w3);
	pthread_mutex_unlock(&s.lock);
	CHECK(&c, room_for(&s, w2, t, why, sizeof(why)) && blob_state(s1) == BLOB_NAS,
	      "w3's room given back: room, s1 evicted (%s, %s)", why, st(s1));
	relocal(a1, 1);

	/* an eviction by hand */
	no_room_kept(&s, w1, w2, store_now_ns(), "both pinned again");
	CHECK(&c, store_evict(&s, a2, 1) == 1, "a2 evicted by hand");
	CHECK(&c, room_for(&s, w2, s.room_kept.want_ns, why, sizeof(why)),
	      "after the eviction: room (%s)", why);
	relocal(a2, 0);

	/* a later request: a2, used after the first was made, is evictable
	 * for the second only */
	t = store_now_ns();
	next_use_tick();
	use(a2);
	no_room_kept(&s, w1, w2, t, "a1 pinned, a2 used since the request");
	CHECK(&c, room_for(&s, w2, store_now_ns(), why, sizeof(why)) && blob_state(a2) == BLOB_NAS,
	      "a later request: room, a2 evicted (%s, %s)", why, st(a2));
	store_close(&s);
	policy_opts_free(&pol);
}

/* The blobs of one request share its time: copies that land while the rest
 * is still being queued are not evicted for its later blobs. */
static void test_one_time(void)
{
	enum { N = 40 };
	struct policy_opts pol;
	struct store s;
	struct blob *v[N];
	char rel[128];
	uint64_t asked;
	int landed_early = 0, local = 0;

	mkdirs("hub/models--t--onetime/blobs");
	for (int i = 0; i < N; i++) {
		snprintf(rel, sizeof(rel), "hub/models--t--onetime/blobs/f%02d", i);
		put(rel, 4 * KiB, 60 + i);
	}
	open_room(&s, &pol, "local-onetime", 3);
	pol.store_max = store_charge(&s, 4 * KiB) * N / 2;
	asked = store_now_ns();
	for (int i = 0; i < N; i++) {
		snprintf(rel, sizeof(rel), "hub/models--t--onetime/blobs/f%02d", i);
		v[i] = blob_at(rel);
		store_promote_at(&s, v[i], 0, 1, asked);
		usleep(5000);
		landed_early |= i < N - 1 && blob_state(v[0]) == BLOB_LOCAL;
	}
	for (int i = 0; i < N; i++)
		local += store_wait_settled(&s, v[i], 30000) == BLOB_LOCAL;
	CHECK(&c, landed_early && local == N / 2 && s.evicted == 0,
	      "a request of %d into room for %d, copies landing as it was queued (%d): %d local, "
	      "%llu evicted", N, N / 2, landed_early, local, (unsigned long long)s.evicted);
	store_close(&s);
	policy_opts_free(&pol);
}

int main(void)
{
	snprintf(top, sizeof(top), "/var/tmp/wfs-space-XXXXXX");
	check_tmpdir(top);
	test_shared();
	test_pin_no_room();
	test_range_evicts();
	test_kept();
	test_one_time();
	test_publish_race();
	test_publish_beside_open();
	test_held_by_two();
	test_counts();
	check_rmtree(top);
	printf("space: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
