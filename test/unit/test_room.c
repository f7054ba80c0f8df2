/* test_room.c - the store's room, its automatic promotion and its ref pins,
 * without mounting: a hub tree on disk, the store driven through the same
 * calls the daemon makes (store_note_open/read/close) and the control
 * protocol.
 *
 *   room     the size limit counts copies, copies in flight and evicted
 *            copies still open; eviction is least recently used, never a
 *            pinned or open copy; what does not fit stays on the NAS with
 *            the reason; the limit holds while copies are in flight, and
 *            from the start when it was lowered since the last run
 *   auto     NAS reads past the threshold promote; a hot shard queues its
 *            siblings (by name and by weight_map); exclusions hold; off is off
 *   refs     a ref pin follows its ref, unpins the old revision once the new
 *            one is local, and survives a restart
 *   retry    a failed automatic or ref-pinned copy is retried with backoff
 *            (2 s, doubling), a user's is not; the gate coming up makes every
 *            backoff due at once; the policy thread retries by itself
 */
#include "check_store.h"
#include "control.h"
#include "store.h"
#include "store_int.h"
#include "auto.h"
#include "nasgate.h"
#include "pins.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB 1024u
#define BLOB (256 * KiB)

static char top[PATH_MAX];
static struct check_count c;

static void put(const char *rel, size_t n, unsigned seed)
{
	check_put_pattern(top, rel, n, seed);
}

static void mkdirs(const char *rel)
{
	check_mkdirs(top, rel);
}

/* <repo>/blobs/<blob> and <repo>/snapshots/<rev>/<name> -> ../../blobs/<blob> */
static void snap_link(const char *repo, const char *rev, const char *name, const char *blob)
{
	char p[PATH_MAX * 2], t[PATH_MAX];

	snprintf(p, sizeof(p), "hub/%s/snapshots/%s", repo, rev);
	mkdirs(p);
	snprintf(p, sizeof(p), "%s/hub/%s/snapshots/%s/%s", top, repo, rev, name);
	snprintf(t, sizeof(t), "../../blobs/%s", blob);
	if (symlink(t, p) < 0) {
		perror(p);
		exit(2);
	}
}

static void set_ref(const char *repo, const char *rev)
{
	char p[PATH_MAX * 2], q[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/refs", repo);
	snprintf(q, sizeof(q), "hub/%s", p);
	mkdirs(q);
	snprintf(p, sizeof(p), "%s/hub/%s/refs/main.tmp", top, repo);
	snprintf(q, sizeof(q), "%s/hub/%s/refs/main", top, repo);
	check_write_file(p, rev, strlen(rev));
	if (rename(p, q) < 0)
		exit(2);
}

static struct blob *blob_at(struct store *s, const char *hubrel)
{
	char rel[PATH_MAX];

	snprintf(rel, sizeof(rel), "hub/%s", hubrel);
	return check_blob(s, top, rel, NULL, 0);
}

static struct store *the_store; /* the store a test has open */

/* Wait until the clock the store stamps last use with has ticked: two
 * uses either side of this are ordered (the LRU order). */
static void next_use_tick(void)
{
	uint64_t t0 = store_now_ns();

	while (store_now_ns() == t0)
		sched_yield();
}

static enum blob_state wait_settled(struct blob *b)
{
	return store_wait_settled(the_store, b, 30000);
}

/* Poll the state the store reports until it is @want (the policy thread
 * queues asynchronously: nothing to wait on before that). */
static int wait_state(struct blob *b, enum blob_state want, int ms)
{
	int64_t end = store_now_ms() + ms;

	while (blob_state(b) != want && store_now_ms() < end)
		usleep(2000);
	return blob_state(b) == want;
}

/* What the store says of @b now (a copy: valid until the next call). */
static const struct blob_info *info(struct blob *b)
{
	static struct blob_info in;

	blob_info(the_store, b, &in);
	return &in;
}

/* Wait until the policy thread has dealt with @n hot blobs in all: what it
 * decided is then visible. */
static int wait_handled(struct auto_promoter *a, uint64_t n)
{
	int64_t end = store_now_ms() + 10000;

	while (atomic_load(&a->handled) < n && store_now_ms() < end)
		usleep(2000);
	return atomic_load(&a->handled) >= n;
}

/* Blocks of every regular file under LOCAL_STORE/data and tmp: what the
 * limit promises to bound. */
static uint64_t du_copies(const char *local)
{
	char cmd[PATH_MAX * 2];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "find '%s/data' '%s/tmp' -type f -printf '%%k\\n' | "
		 "awk '{s+=$1} END {print s+0}'", local, local);
	f = popen(cmd, "r");
	if (!f || fscanf(f, "%llu", &kb) != 1)
		kb = ~0ull;
	if (f)
		pclose(f);
	return kb * 1024;
}

struct sampler {
	struct store *s;
	const char *local;
	uint64_t limit, worst_accounted, worst_du;
	unsigned walks, torn, in_flight; /* du walks; of them, those discarded, and
					  * those that met copies in flight */
	atomic_int stop;
};

/* What changes when a file leaves data/ or a new copy may start.  A du
 * walk is not atomic: one that lists data/ before an eviction and tmp/
 * after the copy that eviction made room for counts both files, though
 * the two were never on disk at once.  A walk whose bracket of these
 * differs is discarded. */
struct room_gen {
	uint64_t used, reserved, held, evicted, demoted, promoted;
};

static void room_gen(struct store *s, struct room_gen *g)
{
	struct store_usage u;

	store_usage(s, &u);
	*g = (struct room_gen){ u.used, u.reserved, u.held, atomic_load(&s->evicted),
				atomic_load(&s->demoted), atomic_load(&s->promoted) };
}

static void *sample(void *arg)
{
	struct sampler *sm = arg;

	while (!atomic_load(&sm->stop)) {
		struct room_gen g0, g1;
		uint64_t d;

		room_gen(sm->s, &g0);
		if (g0.used + g0.reserved + g0.held > sm->worst_accounted)
			sm->worst_accounted = g0.used + g0.reserved + g0.held;
		d = du_copies(sm->local);
		room_gen(sm->s, &g1);
		sm->walks++;
		if (memcmp(&g0, &g1, sizeof(g0))) {
			sm->torn++;
			continue;
		}
		sm->in_flight += g0.reserved > 0;
		if (d > sm->worst_du)
			sm->worst_du = d;
	}
	return NULL;
}

static void test_room(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol };
	struct store s;
	struct store_usage u;
	struct blob *b[8];
	char local[PATH_MAX * 2], name[64];
	uint64_t ch;

	check_policy_manual(&pol);
	check_store_dir(top, "local-room", local, sizeof(local));
	mkdirs("hub/models--t--room/blobs");
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof(name), "hub/models--t--room/blobs/b%d", i);
		put(name, BLOB, (unsigned)i + 1);
	}
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0, "open");
	the_store = &s;
	ch = store_charge(&s, BLOB);
	CHECK(&c, ch >= BLOB && ch <= BLOB + 2 * 4096, "charge of %u bytes: %llu", BLOB,
	      (unsigned long long)ch);
	pol.store_max = 3 * ch + ch / 2; /* room for three */
	CHECK(&c, store_start(&s) == 0, "start");
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof(name), "models--t--room/blobs/b%d", i);
		b[i] = blob_at(&s, name);
	}
	for (int i = 0; i < 3; i++) {
		store_promote(&s, b[i], 0, 1);
		CHECK(&c, wait_settled(b[i]) == BLOB_LOCAL, "b%d local: %s", i, info(b[i])->reason);
		next_use_tick(); /* distinct use times */
	}
	/* b0 used again: b1 is now the least recently used */
	store_note_open(&s, b[0], "models--t--room/blobs/b0");
	store_note_read(&s, b[0], 4096, 1);
	store_note_close(&s, b[0]);
	next_use_tick();
	store_promote(&s, b[3], 0, 1);
	CHECK(&c, wait_settled(b[3]) == BLOB_LOCAL, "b3 local: %s", info(b[3])->reason);
	CHECK(&c, blob_state(b[1]) == BLOB_NAS && blob_state(b[0]) == BLOB_LOCAL && blob_state(b[2]) == BLOB_LOCAL,
	      "LRU evicted b1 (states %s %s %s)", blob_state_name(blob_state(b[0])),
	      blob_state_name(blob_state(b[1])), blob_state_name(blob_state(b[2])));
	store_usage(&s, &u);
	CHECK(&c, u.used <= pol.store_max && u.blobs == 3, "within the limit: %llu of %llu",
	      (unsigned long long)u.used, (unsigned long long)pol.store_max);

	/* pinned and open copies are not evicted: only b0 can go */
	store_pin(&s, b[2], 1);
	store_note_open(&s, b[3], "models--t--room/blobs/b3");
	next_use_tick();
	store_promote(&s, b[4], 0, 1);
	CHECK(&c, wait_settled(b[4]) == BLOB_LOCAL, "b4 local: %s", info(b[4])->reason);
	CHECK(&c, blob_state(b[0]) == BLOB_NAS && blob_state(b[2]) == BLOB_LOCAL && blob_state(b[3]) == BLOB_LOCAL,
	      "b0 evicted, pinned b2 and open b3 kept");
	/* now only b4 is evictable: b5 takes its place; then nothing is */
	store_note_open(&s, b[4], NULL);
	store_promote(&s, b[5], 0, 1);
	CHECK(&c, wait_settled(b[5]) == BLOB_NAS, "b5 stays on the NAS: %s",
	      blob_state_name(blob_state(b[5])));
	CHECK(&c, info(b[5])->hold == HOLD_NO_ROOM && strstr(info(b[5])->reason, "no room") &&
	      strstr(info(b[5])->reason, "pinned") && strstr(info(b[5])->reason, "open"),
	      "the reason says why: %s", info(b[5])->reason);
	CHECK(&c, blob_state(b[2]) == BLOB_LOCAL && blob_state(b[3]) == BLOB_LOCAL &&
	      blob_state(b[4]) == BLOB_LOCAL, "nothing evicted for a copy that cannot fit");

	/* an evicted copy still open keeps its space until the last close */
	CHECK(&c, store_evict(&s, b[3], 0) == 1, "evict while open");
	store_usage(&s, &u);
	CHECK(&c, u.held == ch, "held while open: %llu", (unsigned long long)u.held);
	store_promote(&s, b[6], 0, 1);
	CHECK(&c, wait_settled(b[6]) == BLOB_NAS && strstr(info(b[6])->reason, "evicted but still open"),
	      "the held space still counts: %s", info(b[6])->reason);
	store_note_close(&s, b[3]);
	store_usage(&s, &u);
	CHECK(&c, u.held == 0, "back at the close: %llu", (unsigned long long)u.held);
	store_promote(&s, b[6], 0, 1);
	CHECK(&c, wait_settled(b[6]) == BLOB_LOCAL, "then it fits: %s", info(b[6])->reason);
	store_note_close(&s, b[4]);

	/* bigger than the limit */
	put("hub/models--t--room/blobs/huge", 4 * BLOB, 99);
	{
		struct blob *h = blob_at(&s, "models--t--room/blobs/huge");

		store_promote(&s, h, 0, 1);
		CHECK(&c, wait_settled(h) == BLOB_NAS && strstr(info(h)->reason, "more than store_max"),
		      "too big: %s", info(h)->reason);
	}

	/* while copies are in flight the limit holds, in the accounting and on disk */
	{
		struct sampler sm = { .s = &s, .local = local, .limit = pol.store_max };
		pthread_t t;

		store_pin(&s, b[2], 0);
		store_set_bw_limit(&s, 1500000); /* 0.5 MB/s each of 3: ~0.5 s a 256 KiB copy */
		pthread_create(&t, NULL, sample, &sm);
		for (int i = 0; i < 8; i++)
			store_promote(&s, b[i], 0, 1);
		for (int i = 0; i < 8; i++)
			wait_settled(b[i]);
		for (int i = 0; i < 8; i++)
			store_promote(&s, b[7 - i], 0, 1);
		for (int i = 0; i < 8; i++)
			wait_settled(b[i]);
		atomic_store(&sm.stop, 1);
		pthread_join(t, NULL);
		fprintf(stderr, "room: limit %llu; worst accounted %llu, worst du of data/+tmp/ "
			"%llu (%u walks: %u with copies in flight, %u discarded)\n",
			(unsigned long long)pol.store_max, (unsigned long long)sm.worst_accounted,
			(unsigned long long)sm.worst_du, sm.walks, sm.in_flight, sm.torn);
		CHECK(&c, sm.worst_accounted <= pol.store_max,
		      "accounted (copies + reservations) never above the limit: %llu > %llu",
		      (unsigned long long)sm.worst_accounted, (unsigned long long)pol.store_max);
		CHECK(&c, sm.worst_du <= pol.store_max, "blocks on disk never above the limit: "
		      "%llu > %llu", (unsigned long long)sm.worst_du, (unsigned long long)pol.store_max);
		store_usage(&s, &u);
		CHECK(&c, u.blobs == 3 && u.reserved == 0, "three local, nothing reserved: %llu, %llu",
		      (unsigned long long)u.blobs, (unsigned long long)u.reserved);
		store_set_bw_limit(&s, 0);
	}

	/* store_max lowered between two runs: the start evicts down to it,
	 * least recently used first, never the pinned copy */
	{
		char kept[3][64];
		int n = 0;

		for (int i = 0; i < 8 && n < 3; i++)
			if (blob_state(b[i]) == BLOB_LOCAL) {
				snprintf(kept[n++], sizeof(kept[0]), "models--t--room/blobs/b%d", i);
				store_note_read(&s, b[i], 4096, 1); /* used in this order */
				if (n == 1)
					store_pin(&s, b[i], 1);
				next_use_tick();
			}
		CHECK(&c, n == 3, "three local copies to shrink: %d", n);
		store_close(&s);
		pol.store_max = 2 * ch + ch / 2; /* room for two */
		CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "reopen");
		n = 0;
		for (int i = 0; i < 8; i++) {
			snprintf(name, sizeof(name), "models--t--room/blobs/b%d", i);
			b[i] = blob_at(&s, name);
			n += blob_state(b[i]) == BLOB_LOCAL;
		}
		CHECK(&c, blob_state(blob_at(&s, kept[0])) == BLOB_LOCAL &&
		      blob_state(blob_at(&s, kept[1])) == BLOB_NAS &&
		      blob_state(blob_at(&s, kept[2])) == BLOB_LOCAL,
		      "the pinned and the most recently used copies kept");
		store_usage(&s, &u);
		CHECK(&c, u.used <= pol.store_max && n == 2 && u.pinned_bytes == ch,
		      "a lower store_max holds from the start: %llu of %llu, %d local, %llu pinned",
		      (unsigned long long)u.used, (unsigned long long)pol.store_max, n,
		      (unsigned long long)u.pinned_bytes);
		CHECK(&c, du_copies(local) <= pol.store_max, "on disk too: %llu of %llu",
		      (unsigned long long)du_copies(local), (unsigned long long)pol.store_max);
	}
	store_close(&s);
	policy_opts_free(&pol);
}

/* models--t--shards: shards 1..4 of 4, a weight-mapped pair, a gguf, a big blob */
static void make_shards(void)
{
	char name[128], blob[64];

	mkdirs("hub/models--t--shards/blobs");
	for (int i = 1; i <= 4; i++) {
		snprintf(blob, sizeof(blob), "s%d", i);
		snprintf(name, sizeof(name), "hub/models--t--shards/blobs/%s", blob);
		put(name, 64 * KiB, 10u + (unsigned)i);
		snprintf(name, sizeof(name), "model-%05d-of-00004.safetensors", i);
		snap_link("models--t--shards", "r1", name, blob);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(blob, sizeof(blob), "w%d", i);
		snprintf(name, sizeof(name), "hub/models--t--shards/blobs/%s", blob);
		put(name, 64 * KiB, 20u + (unsigned)i);
		snprintf(name, sizeof(name), "part-%c.safetensors", 'a' + i);
		snap_link("models--t--shards", "r1", name, blob);
	}
	{
		char p[PATH_MAX * 2];
		/* "", "." and "..": the directory, or the one above, not a file */
		const char *idx = "{\"weight_map\":{\"x\":\"part-a.safetensors\","
				  "\"y\":\"part-b.safetensors\",\"d\":\".\",\"u\":\"..\","
				  "\"e\":\"\"}}";

		snprintf(p, sizeof(p), "%s/hub/models--t--shards/snapshots/r1/"
			 "consolidated.safetensors.index.json", top);
		check_write_file(p, idx, strlen(idx));
	}
	put("hub/models--t--shards/blobs/g", 64 * KiB, 30);
	snap_link("models--t--shards", "r1", "q4.gguf", "g");
	put("hub/models--t--shards/blobs/big", 512 * KiB, 31);
	snap_link("models--t--shards", "r1", "big.bin", "big");
	set_ref("models--t--shards", "r1");
}

static void test_auto(void)
{
	struct policy_opts pol;
	struct hub_roots roots = {0};
	struct store_opts opt = { .workers = 2, .policy = &pol };
	struct auto_promoter ap;
	struct store s;
	struct blob *sh[5], *w[3], *g, *big;
	char local[PATH_MAX * 2], name[128], err[256];

	make_shards();
	snprintf(local, sizeof(local), "%s/hub", top);
	hub_roots_add(&roots, local);
	policy_opts_init(&pol);
	pol.auto_bytes = 100 * KiB;
	pol.auto_opens = 3;
	pol.min_free_pct = 0;
	policy_parse_opt(&pol, "exclude", "*.gguf", err, sizeof(err));
	check_store_dir(top, "local-auto", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0 &&
	      auto_start(&ap, &s, &roots, &pol, NULL) == 0, "open auto");
	the_store = &s;
	for (int i = 1; i <= 4; i++) {
		snprintf(name, sizeof(name), "models--t--shards/blobs/s%d", i);
		sh[i] = blob_at(&s, name);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "models--t--shards/blobs/w%d", i);
		w[i] = blob_at(&s, name);
	}
	g = blob_at(&s, "models--t--shards/blobs/g");
	big = blob_at(&s, "models--t--shards/blobs/big");

	/* below the threshold: nothing */
	store_note_open(&s, big, "models--t--shards/blobs/big");
	store_note_read(&s, big, 64 * KiB, 0);
	/* hotness is decided in the read itself: nothing was handed over */
	CHECK(&c, blob_state(big) == BLOB_NAS && !atomic_load(&big->hot),
	      "64 KiB of 512: still nas (%s)", blob_state_name(blob_state(big)));
	store_note_read(&s, big, 64 * KiB, 0);
	CHECK(&c, wait_state(big, BLOB_LOCAL, 5000), "128 KiB read: promoted (%s)",
	      blob_state_name(blob_state(big)));
	store_note_close(&s, big);
	CHECK(&c, wait_handled(&ap, 1), "the policy dealt with big.bin");
	CHECK(&c, blob_state(sh[1]) == BLOB_NAS, "big.bin has no siblings");

	/* a hot shard, opened the way the kernel opens it (blobs/<id>): every
	 * sibling of its revision is queued */
	store_note_open(&s, sh[2], "models--t--shards/blobs/s2");
	store_note_read(&s, sh[2], 64 * KiB, 0);
	store_note_close(&s, sh[2]);
	for (int i = 1; i <= 4; i++)
		CHECK(&c, wait_state(sh[i], BLOB_LOCAL, 5000), "shard %d local (%s)", i,
		      blob_state_name(blob_state(sh[i])));
	CHECK(&c, wait_handled(&ap, 2), "the policy dealt with the shard");
	CHECK(&c, blob_state(w[0]) == BLOB_NAS, "the weight-mapped files are not its siblings");

	/* weight map: part-b is listed with part-a, part-c is not */
	store_note_open(&s, w[1], "models--t--shards/snapshots/r1/part-b.safetensors");
	store_note_read(&s, w[1], 64 * KiB, 0);
	store_note_close(&s, w[1]);
	CHECK(&c, wait_state(w[1], BLOB_LOCAL, 5000) && wait_state(w[0], BLOB_LOCAL, 5000),
	      "part-b and its weight_map sibling part-a local (%s, %s)",
	      blob_state_name(blob_state(w[1])), blob_state_name(blob_state(w[0])));
	CHECK(&c, wait_handled(&ap, 3), "the policy dealt with part-b");
	CHECK(&c, blob_state(w[2]) == BLOB_NAS, "part-c (not in the map) stays: %s",
	      blob_state_name(blob_state(w[2])));

	/* opens count too; an excluded name keeps its blob on the NAS */
	for (int i = 0; i < 3; i++) {
		store_note_open(&s, g, "models--t--shards/blobs/g");
		store_note_close(&s, g);
	}
	CHECK(&c, wait_handled(&ap, 4), "the policy dealt with q4.gguf");
	CHECK(&c, blob_state(g) == BLOB_NAS && info(g)->hold == HOLD_EXCLUDED &&
	      strstr(info(g)->reason, "*.gguf"),
	      "q4.gguf excluded: %s %s", blob_state_name(blob_state(g)), info(g)->reason);
	for (int i = 0; i < 3; i++) {
		store_note_open(&s, w[2], NULL);
		store_note_close(&s, w[2]);
	}
	CHECK(&c, wait_state(w[2], BLOB_LOCAL, 5000), "3 opens from the NAS: promoted");

	/* off is off */
	store_evict(&s, big, 1);
	pol.auto_on = 0;
	store_note_open(&s, big, NULL);
	store_note_read(&s, big, 512 * KiB, 0);
	store_note_close(&s, big);
	CHECK(&c, blob_state(big) == BLOB_NAS && !atomic_load(&big->hot),
	      "auto off: %s", blob_state_name(blob_state(big)));
	CHECK(&c, s.auto_queued >= 7, "auto_queued counted: %llu",
	      (unsigned long long)s.auto_queued);
	auto_stop(&ap);
	store_close(&s);
	policy_opts_free(&pol);
}

static int pinned(struct blob *b)
{
	return info(b)->pinned;
}

struct poller {
	struct pins *pins;
	atomic_int stop, polls;
};

static void *poll_loop(void *arg)
{
	struct poller *pl = arg;

	while (!atomic_load(&pl->stop)) {
		pins_poll(pl->pins);
		atomic_fetch_add(&pl->polls, 1);
	}
	return NULL;
}

static void test_refs(void)
{
	struct policy_opts pol;
	struct hub_roots roots = {0};
	struct store_opts opt = { .workers = 2, .policy = &pol };
	struct auto_promoter ap;
	struct pins pins;
	struct store s;
	struct blob *a, *sh, *b2;
	char local[PATH_MAX * 2], commit[64];
	size_t n;
	struct pin *refs;
	int64_t end;
	int ok = 0;

	mkdirs("hub/models--t--ref/blobs");
	put("hub/models--t--ref/blobs/a", 64 * KiB, 40);
	put("hub/models--t--ref/blobs/shared", 64 * KiB, 41);
	put("hub/models--t--ref/blobs/b", 64 * KiB, 42);
	snap_link("models--t--ref", "rev1", "a.bin", "a");
	snap_link("models--t--ref", "rev1", "shared.bin", "shared");
	set_ref("models--t--ref", "rev1");
	snprintf(local, sizeof(local), "%s/hub", top);
	hub_roots_add(&roots, local);
	policy_opts_init(&pol);
	pol.auto_on = 0;
	pol.ref_poll = 0.2;
	check_store_dir(top, "local-refs", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0 &&
	      pins_open(&pins, &s, &roots, &pol) == 0 &&
	      auto_start(&ap, &s, &roots, &pol, &pins) == 0, "open refs");
	the_store = &s;
	CHECK(&c, pins_pin(&pins, "models--t--ref", "main", commit, sizeof(commit)) == 2 &&
	      !strcmp(commit, "rev1"), "pin --ref main: rev1, 2 blobs (%s)", commit);
	CHECK(&c, pins_pin(&pins, "models--t--nope", "main", commit, sizeof(commit)) == -ENOENT,
	      "no such repo");
	CHECK(&c, pins_pin(&pins, "models--t--ref", "../x", commit, sizeof(commit)) == -EINVAL,
	      "a ref leaving refs/");
	a = blob_at(&s, "models--t--ref/blobs/a");
	sh = blob_at(&s, "models--t--ref/blobs/shared");
	b2 = blob_at(&s, "models--t--ref/blobs/b");
	CHECK(&c, wait_state(a, BLOB_LOCAL, 5000) && wait_state(sh, BLOB_LOCAL, 5000) &&
	      pinned(a) && pinned(sh), "rev1 local and pinned");

	/* the ref moves: rev2 keeps shared, drops a, adds b */
	snap_link("models--t--ref", "rev2", "b.bin", "b");
	snap_link("models--t--ref", "rev2", "shared.bin", "shared");
	set_ref("models--t--ref", "rev2");
	pins_poke(&pins);
	for (end = store_now_ms() + 10000; !ok && store_now_ms() < end;) {
		refs = pins_list(&pins, &n);
		ok = n == 1 && !strcmp(refs[0].commit, "rev2") && !refs[0].pending[0];
		free(refs);
		if (!ok)
			usleep(2000);
	}
	CHECK(&c, ok, "the pin moved to rev2");
	CHECK(&c, b2->state == BLOB_LOCAL && pinned(b2) && pinned(sh), "rev2 local and pinned");
	CHECK(&c, !pinned(a) && blob_state(a) == BLOB_LOCAL, "rev1's own blob unpinned (still local)");

	/* it survives a restart */
	auto_stop(&ap);
	store_close(&s);
	pins_close(&pins);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && pins_open(&pins, &s, &roots, &pol) == 0,
	      "reopen");
	refs = pins_list(&pins, &n);
	CHECK(&c, n == 1 && !strcmp(refs[0].repo, "models--t--ref") && !strcmp(refs[0].ref, "main") &&
	      !strcmp(refs[0].commit, "rev2"), "ref pin in the index");
	free(refs);
	CHECK(&c, pins_unpin(&pins, "models--t--ref", "main") == 2, "unpin --ref: 2 blobs");
	CHECK(&c, pins_unpin(&pins, "models--t--ref", "main") == -ENOENT, "not pinned any more");
	b2 = blob_at(&s, "models--t--ref/blobs/b");
	CHECK(&c, !pinned(b2), "unpinned");

	/* pins and unpins while polls run: none lost, none left behind */
	{
		struct poller pl = { .pins = &pins };
		pthread_t t;
		int bad = 0;

		pthread_create(&t, NULL, poll_loop, &pl);
		for (int i = 0; i < 40; i++) {
			bad |= pins_pin(&pins, "models--t--ref", "main", commit, sizeof(commit)) != 2;
			refs = pins_list(&pins, &n);
			bad |= n != 1;
			free(refs);
			bad |= pins_unpin(&pins, "models--t--ref", "main") < 0;
		}
		atomic_store(&pl.stop, 1);
		pthread_join(t, NULL);
		refs = pins_list(&pins, &n);
		CHECK(&c, !bad && n == 0 && atomic_load(&pl.polls) > 0,
		      "40 pin/unpin pairs beside %d polls: every call took, no pin left",
		      atomic_load(&pl.polls));
		free(refs);
		sh = blob_at(&s, "models--t--ref/blobs/shared");
		CHECK(&c, !pinned(b2) && !pinned(sh), "no blob left pinned (b %d, shared %d)",
		      pinned(b2), pinned(sh));
	}
	store_close(&s);
	pins_close(&pins);
	policy_opts_free(&pol);
}

static void rm_hub(const char *hubrel)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/hub/%s", top, hubrel);
	if (unlink(p) < 0) {
		perror(p);
		exit(2);
	}
}

/* The backoff has passed: what the clock would do in STORE_RETRY_*_MS,
 * without the wait (the fields are the store's, under its lock). */
static void backoff_passes(struct store *s, struct blob *b)
{
	pthread_mutex_lock(&s->lock);
	b->retry_at_ms = store_now_ms() - 1;
	s->retry_next_ms = b->retry_at_ms;
	pthread_mutex_unlock(&s->lock);
}

static void test_retry(void)
{
	struct policy_opts pol;
	struct nas_gate g;
	struct store_opts opt = { .workers = 2, .policy = &pol };
	struct auto_promoter ap;
	struct store s;
	struct blob *a, *b, *u, *p, *h;
	struct blob_info in;
	char local[PATH_MAX * 2], root[PATH_MAX * 2];
	int64_t t0, due;

	policy_opts_init(&pol);
	pol.min_free_pct = 0;
	mkdirs("hub/models--t--retry/blobs");
	put("hub/models--t--retry/blobs/a", 64 * KiB, 50);
	put("hub/models--t--retry/blobs/b", 64 * KiB, 51);
	put("hub/models--t--retry/blobs/u", 64 * KiB, 52);
	put("hub/models--t--retry/blobs/p", 64 * KiB, 53);
	check_store_dir(top, "local-retry", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open retry");
	the_store = &s;
	a = blob_at(&s, "models--t--retry/blobs/a");
	b = blob_at(&s, "models--t--retry/blobs/b");
	u = blob_at(&s, "models--t--retry/blobs/u");
	p = blob_at(&s, "models--t--retry/blobs/p");

	/* An automatic copy whose source went after it was queued: FAILED,
	 * the reason names the path and the error, the backoff 2 s. */
	rm_hub("models--t--retry/blobs/a");
	t0 = store_now_ms();
	store_promote(&s, a, 0, 0);
	CHECK(&c, wait_settled(a) == BLOB_FAILED, "failed: %s", blob_state_name(blob_state(a)));
	blob_info(&s, a, &in);
	CHECK(&c, strstr(in.reason, "models--t--retry/blobs/a") &&
	      strstr(in.reason, "No such file"), "reason names the path and the error: %s",
	      in.reason);
	CHECK(&c, in.fail_count == 1 && in.auto_retry &&
	      in.retry_at_ms >= t0 + STORE_RETRY_FIRST_MS &&
	      in.retry_at_ms <= store_now_ms() + STORE_RETRY_FIRST_MS,
	      "fail_count %u, retried in %lld ms", in.fail_count,
	      (long long)(in.retry_at_ms - store_now_ms()));
	due = store_retry_due(&s);
	CHECK(&c, due == in.retry_at_ms && blob_state(a) == BLOB_FAILED && s.retries == 0,
	      "not due yet: %lld", (long long)(due - store_now_ms()));
	store_promote(&s, a, 0, 0);
	CHECK(&c, blob_state(a) == BLOB_FAILED, "an automatic request waits for the backoff: %s",
	      blob_state_name(blob_state(a)));
	put("hub/models--t--retry/blobs/a", 64 * KiB, 50);
	backoff_passes(&s, a);
	CHECK(&c, store_retry_due(&s) == -1 && s.retries == 1, "due: queued again, nothing waits");
	CHECK(&c, wait_settled(a) == BLOB_LOCAL, "the retry made it local: %s", info(a)->reason);
	blob_info(&s, a, &in);
	CHECK(&c, in.fail_count == 0 && in.retry_at_ms == 0, "reset on success: %u", in.fail_count);

	/* Failing again doubles the wait. */
	rm_hub("models--t--retry/blobs/b");
	store_promote(&s, b, 0, 0);
	CHECK(&c, wait_settled(b) == BLOB_FAILED, "b failed");
	backoff_passes(&s, b);
	t0 = store_now_ms();
	store_retry_due(&s);
	CHECK(&c, wait_settled(b) == BLOB_FAILED, "b failed again");
	blob_info(&s, b, &in);
	CHECK(&c, in.fail_count == 2 && in.retry_at_ms >= t0 + 2 * STORE_RETRY_FIRST_MS &&
	      in.retry_at_ms <= store_now_ms() + 2 * STORE_RETRY_FIRST_MS,
	      "second failure: fail_count %u, retried in %lld ms", in.fail_count,
	      (long long)(in.retry_at_ms - store_now_ms()));
	pol.auto_on = 0;
	CHECK(&c, !info(b)->auto_retry, "automatic promotion off: not retried");
	pol.auto_on = 1;

	/* A user's promotion is not retried; a ref pin's is, while pinned. */
	rm_hub("models--t--retry/blobs/u");
	store_promote(&s, u, 0, 1);
	CHECK(&c, wait_settled(u) == BLOB_FAILED && info(u)->fail_count == 1 &&
	      !info(u)->auto_retry, "a user's failure: not retried (%d)", info(u)->auto_retry);
	rm_hub("models--t--retry/blobs/p");
	store_pin(&s, p, 1);
	CHECK(&c, store_request(&s, p, STORE_BY_PIN, 0) == 1, "a pin's request queued");
	CHECK(&c, wait_settled(p) == BLOB_FAILED && info(p)->auto_retry, "a pin's failure: retried");
	CHECK(&c, store_request(&s, p, STORE_BY_PIN, 0) == 0 && blob_state(p) == BLOB_FAILED,
	      "a pin's request in the backoff waits");
	store_pin(&s, p, 0);
	CHECK(&c, !info(p)->auto_retry, "unpinned: not retried");
	store_pin(&s, p, 1);
	put("hub/models--t--retry/blobs/p", 64 * KiB, 53);
	CHECK(&c, store_request(&s, p, STORE_BY_PIN, 1) == 1 && wait_settled(p) == BLOB_LOCAL,
	      "an operator's pin --ref does not wait: %s", info(p)->reason);
	store_close(&s);

	/* The NAS gate: no failed copy is retried while it is down (no copy
	 * starts then either: test_inflight); every backoff is due when it
	 * is up. */
	snprintf(root, sizeof(root), "%s/hub", top);
	CHECK(&c, nas_gate_init(&g, root, 200, NULL, NULL) == 0, "gate");
	opt.gate = &g;
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open with a gate");
	the_store = &s;
	put("hub/models--t--retry/blobs/b", 64 * KiB, 51);
	b = blob_at(&s, "models--t--retry/blobs/b");
	rm_hub("models--t--retry/blobs/b");
	store_promote(&s, b, 0, 0);
	CHECK(&c, wait_settled(b) == BLOB_FAILED, "b failed, the gate up: %s", info(b)->reason);
	nas_gate_set_down(&g, "test: down");
	put("hub/models--t--retry/blobs/b", 64 * KiB, 51);
	backoff_passes(&s, b);
	due = store_retry_due(&s);
	CHECK(&c, blob_state(b) == BLOB_FAILED && due > store_now_ms(), "no retry while down");
	pthread_mutex_lock(&s.lock);
	b->retry_at_ms = store_now_ms() + 60000; /* far off: only the gate makes it due */
	s.retry_next_ms = b->retry_at_ms;
	pthread_mutex_unlock(&s.lock);
	/* A blob turning hot while the NAS is down waits for it: what to do
	 * with it needs NAS walks (exclusion globs by snapshot name). */
	CHECK(&c, auto_start(&ap, &s, NULL, &pol, NULL) == 0, "policy thread");
	put("hub/models--t--retry/blobs/h", 64 * KiB, 54);
	h = blob_at(&s, "models--t--retry/blobs/h");
	store_note_open(&s, h, NULL);
	store_note_read(&s, h, 64 * KiB, 0);
	store_note_close(&s, h);
	usleep(300000);
	CHECK(&c, atomic_load(&ap.handled) == 0 && blob_state(h) == BLOB_NAS,
	      "hot while down: deferred (%llu handled, %s)",
	      (unsigned long long)atomic_load(&ap.handled), blob_state_name(blob_state(h)));
	CHECK(&c, nas_gate_start(&g) == 0, "prober");
	nas_gate_wait_change(&g, atomic_load(&g.generation), 5000);
	CHECK(&c, nas_gate_up(&g), "up");
	store_retry_due(&s);
	CHECK(&c, wait_settled(b) == BLOB_LOCAL && atomic_load(&s.retries) == 1,
	      "the gate up: retried at once: %s", blob_state_name(blob_state(b)));
	CHECK(&c, wait_handled(&ap, 1) && wait_state(h, BLOB_LOCAL, 5000),
	      "the NAS up: the deferred hot blob promoted (%s)", blob_state_name(blob_state(h)));

	/* The policy thread retries by itself once the backoff passes. */
	put("hub/models--t--retry/blobs/u", 64 * KiB, 52);
	u = blob_at(&s, "models--t--retry/blobs/u");
	rm_hub("models--t--retry/blobs/u");
	store_promote(&s, u, 0, 0);
	CHECK(&c, wait_settled(u) == BLOB_FAILED, "u failed");
	put("hub/models--t--retry/blobs/u", 64 * KiB, 52);
	CHECK(&c, wait_state(u, BLOB_LOCAL, 15000), "retried by the policy thread: %s",
	      blob_state_name(blob_state(u)));
	auto_stop(&ap);
	store_close(&s);
	nas_gate_destroy(&g);
	policy_opts_free(&pol);
}

int main(void)
{
	snprintf(top, sizeof(top), "/var/tmp/wfs-room-XXXXXX");
	if (!mkdtemp(top))
		return 2;
	mkdirs("hub");
	test_room();
	test_auto();
	test_refs();
	test_retry();
	{
		char cmd[PATH_MAX * 2];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", top);
	}
	printf("room: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
