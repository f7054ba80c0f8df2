/* test_inflight.c - a copy in flight, without mounting: evicted (both the
 * copy and the one queued behind it go, nothing left in data/ or tmp/), or
 * its source replaced on the NAS (store_int.h, COPY_STOP_SOURCE): the copy,
 * whole or of a range, stops as soon as the store sees the new attributes,
 * never serves, says how far it got, and a copy asked for again holds the
 * new bytes; or asked for explicitly while it runs as an automatic copy
 * (its automatic slot freed at once).  The copies are throttled, so each
 * would take seconds to end on its own; what the test checks is how many
 * bytes each read, or what ran meanwhile.  And a range asked for while
 * the NAS is down waits for it, as does a copy (whole or of a range) given
 * out just as it goes down, its source replaced then or not (evicted then,
 * it ends cancelled, not failed).  And a source check, or a copy's content check,
 * whose file is replaced as it ends: its verdict is not the new file's;
 * nor is a full verify's of a copy evicted and made again as it ran. */
#include "check_store.h"
#include "hash.h"
#include "nasgate.h"
#include "policy.h"
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MiB ((size_t)1 << 20)

static char top[PATH_MAX];
static struct check_count c;

/* What the store says of @b now (a copy: valid until the next call). */
static const struct blob_info *info(struct store *s, struct blob *b)
{
	static struct blob_info in;

	blob_info(s, b, &in);
	return &in;
}

/* Wait (10 s at most) until @b's whole copy has read some bytes. */
static int copy_under_way(struct store *s, struct blob *b)
{
	int64_t end = store_now_ms() + 10000;

	while (!(blob_state(b) == BLOB_COPYING && info(s, b)->bytes_done > 0) &&
	       store_now_ms() < end)
		usleep(2000);
	return blob_state(b) == BLOB_COPYING;
}

/* The NAS file @rel replaced as a tool does it (a new file renamed over
 * it: new inode, mtime and ctime), with @n bytes of @seed's pattern
 * ("hello\n" for seed 0); the store told of its new attributes, as a
 * reader's stat or open tells it.  Its mtime is set to one no replacement
 * had before: two files made within one tick of the kernel's clock have
 * the same times, and the store would see nothing new. */
static void replace_source(struct store *s, struct blob *b, const char *rel, size_t n,
			   unsigned seed)
{
	static _Atomic long serial;
	struct timespec times[2] = { { 0, UTIME_OMIT }, { 1700000000 + ++serial, 0 } };
	char tmp[PATH_MAX], from[PATH_MAX * 2], to[PATH_MAX * 2];
	struct stat st;

	snprintf(tmp, sizeof(tmp), "%s.new", rel);
	check_path(from, sizeof(from), top, tmp);
	if (seed)
		check_put_pattern(top, tmp, n, seed);
	else
		check_write_file(from, "hello\n", 6);
	check_path(to, sizeof(to), top, rel);
	if (utimensat(AT_FDCWD, from, times, 0) < 0 || rename(from, to) < 0 ||
	    stat(to, &st) < 0) {
		perror(to);
		exit(2);
	}
	store_source_attrs(s, b, &st);
}

/* @why, the reason a copy of a replaced source ended with, says so and
 * where it stopped: @done of @of bytes (0 of 0 when it does not). */
static void stopped_at(const char *what, const char *why, unsigned long long *done,
		       unsigned long long *of)
{
	const char *at = strstr(why, "stopped after");

	*done = *of = 0;
	fprintf(stderr, "%s of a replaced source: %s\n", what, why);
	CHECK(&c, strstr(why, "source changed during the copy") && at &&
	      sscanf(at, "stopped after %llu of %llu bytes", done, of) == 2,
	      "%s: the reason says the source changed and where the copy stopped: %s", what, why);
}

/* --wrap=source_sample and --wrap=content_hash_final: when armed, the
 * NAS file is replaced (with @replace_seed's pattern, or "hello\n" when
 * 0) right after the source's sample, or the copy's content hash, is
 * taken, and the store told of the new attributes -- a reader's stat
 * landing while a check or a copy runs. */
int __real_source_sample(int fd, uint64_t size, char out[33]);
int __wrap_source_sample(int fd, uint64_t size, char out[33]);
int __real_content_hash_final(struct content_hash *h, char xxh_hex[33], int *id_matches);
int __wrap_content_hash_final(struct content_hash *h, char xxh_hex[33], int *id_matches);
static struct {
	_Atomic int armed;
	struct store *s;
	struct blob *b;
	const char *rel;
	size_t n;
	unsigned seed;
} replace_at;

static void replace_source(struct store *s, struct blob *b, const char *rel, size_t n,
			   unsigned seed);

static void replace_if_armed(void)
{
	if (atomic_exchange(&replace_at.armed, 0))
		replace_source(replace_at.s, replace_at.b, replace_at.rel, replace_at.n,
			       replace_at.seed);
}

int __wrap_source_sample(int fd, uint64_t size, char out[33])
{
	int r = __real_source_sample(fd, size, out);

	replace_if_armed();
	return r;
}

int __wrap_content_hash_final(struct content_hash *h, char xxh_hex[33], int *id_matches)
{
	int r = __real_content_hash_final(h, xxh_hex, id_matches);

	replace_if_armed();
	return r;
}

/* --wrap=fetch_hash_file: when armed, the blob is evicted before the hash
 * opens its copy (which is gone: ENOENT), and made again after. */
int __real_fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog);
int __wrap_fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog);
static struct {
	_Atomic int armed;
	struct store *s;
	struct blob *b;
	int remade; /* the blob was LOCAL again when the hash returned */
} evict_at;

int __wrap_fetch_hash_file(const char *path, char xxh_hex[33], struct fetch_progress *prog)
{
	int r;

	if (!atomic_exchange(&evict_at.armed, 0))
		return __real_fetch_hash_file(path, xxh_hex, prog);
	store_evict(evict_at.s, evict_at.b, 0);
	r = __real_fetch_hash_file(path, xxh_hex, prog);
	store_promote(evict_at.s, evict_at.b, 0, 1);
	evict_at.remade = store_wait_settled(evict_at.s, evict_at.b, 30000) == BLOB_LOCAL;
	return r;
}

/* wfsctl evict --force of a pinned blob whose copy is running or queued:
 * unpinned, the copy cancelled, on the NAS -- what "evicted" said. */
static void test_evict_in_flight(void)
{
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *b, *q;
	char local[PATH_MAX * 2], dir[PATH_MAX * 3];

	check_mkdirs(top, "nas");
	check_put_pattern(top, "nas/ev", 2 * MiB, 5);
	check_put_pattern(top, "nas/eq", 2 * MiB - 1, 6);
	check_store_dir(top, "elocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	store_set_bw_limit(&s, 4 * MiB); /* a half each (worker, range worker): ~1 s a copy */
	b = check_blob(&s, top, "nas/ev", "ev", 1);
	q = check_blob(&s, top, "nas/eq", "eq", 1);
	store_promote(&s, b, 1, 1);
	store_promote(&s, q, 1, 1); /* one worker: queued behind b */
	CHECK(&c, copy_under_way(&s, b) && blob_state(q) == BLOB_QUEUED,
	      "b copying, q queued: %s, %s", blob_state_name(blob_state(b)),
	      blob_state_name(blob_state(q)));
	CHECK(&c, store_evict(&s, q, 0) == -EBUSY && info(&s, q)->pinned,
	      "pinned: not without --force");
	/* a ref pin set just before the evict (the pin poller, as op_each
	 * looked): not even with --force */
	store_pin_why(&s, q, PIN_REF, 1);
	CHECK(&c, store_evict(&s, q, 1) == -EBUSY && blob_state(q) == BLOB_QUEUED &&
	      (info(&s, q)->pin_why & PIN_REF), "a ref pin's blob: kept with --force (%s)",
	      blob_state_name(blob_state(q)));
	store_pin_why(&s, q, PIN_REF, 0);
	CHECK(&c, store_evict(&s, b, 1) == 1 && store_evict(&s, q, 1) == 1, "evicted");
	CHECK(&c, !info(&s, b)->pinned && !info(&s, q)->pinned, "both unpinned at once");
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_NAS &&
	      store_wait_settled(&s, q, 30000) == BLOB_NAS, "both on the NAS: %s, %s",
	      blob_state_name(blob_state(b)), blob_state_name(blob_state(q)));
	CHECK(&c, !strcmp(info(&s, b)->reason, "copy cancelled"), "b: %s", info(&s, b)->reason);
	snprintf(dir, sizeof(dir), "%s/data", local);
	CHECK(&c, check_count_files(dir) == 0, "no copy in data/: %d", check_count_files(dir));
	snprintf(dir, sizeof(dir), "%s/tmp", local);
	CHECK(&c, check_count_files(dir) == 0, "no temporary file: %d", check_count_files(dir));
	store_close(&s);
}

/* A source replaced while its whole copy runs: the copy stops there. */
static void test_whole_copy_of_a_replaced_source(void)
{
	enum { N = 8 << 20 };
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *b;
	char local[PATH_MAX * 2], dir[PATH_MAX * 3];
	unsigned long long done, of;

	check_put_pattern(top, "nas/whole", N, 7);
	check_store_dir(top, "wlocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	store_set_bw_limit(&s, 2 * MiB); /* 1 MiB/s for the worker: 8 s to the end */
	b = check_blob(&s, top, "nas/whole", "whole", 1);
	store_promote(&s, b, 0, 1);
	CHECK(&c, copy_under_way(&s, b), "the copy is under way: %s",
	      blob_state_name(blob_state(b)));
	replace_source(&s, b, "nas/whole", N, 8);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_FAILED, "the copy ends FAILED: %s",
	      blob_state_name(blob_state(b)));
	stopped_at("whole copy", info(&s, b)->reason, &done, &of);
	CHECK(&c, of == N && done < N / 2, "stopped at once: %llu of %llu bytes read", done, of);
	CHECK(&c, s.failed_by[STORE_FAIL_SOURCE_CHANGED] == 1 && s.cancelled == 0,
	      "counted as a source change (%llu), not as a cancel (%llu)",
	      (unsigned long long)s.failed_by[STORE_FAIL_SOURCE_CHANGED],
	      (unsigned long long)s.cancelled);
	snprintf(dir, sizeof(dir), "%s/data", local);
	CHECK(&c, check_count_files(dir) == 0, "no copy in data/: %d", check_count_files(dir));
	snprintf(dir, sizeof(dir), "%s/tmp", local);
	CHECK(&c, check_count_files(dir) == 0, "no temporary file: %d", check_count_files(dir));

	/* asked again: a copy of what the NAS holds now */
	store_set_bw_limit(&s, 0);
	store_promote(&s, b, 0, 1);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "copied again: %s (%s)",
	      blob_state_name(blob_state(b)), info(&s, b)->reason);
	snprintf(dir, sizeof(dir), "%s/data/%.2s/%s", local, info(&s, b)->xxh, info(&s, b)->xxh);
	CHECK(&c, check_holds_pattern(dir, N, 8), "the copy %s holds the new bytes", dir);
	store_close(&s);
}

/* A source replaced while a range of it is copied: the range copy stops,
 * is never listed, and the range is copied from the new file when asked
 * again. */
static void test_range_copy_of_a_replaced_source(void)
{
	enum { N = 8 << 20, LEN = 6 << 20 };
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *b;
	char local[PATH_MAX * 2];
	unsigned long long done, of;
	int64_t end;

	check_put_pattern(top, "nas/range", N, 9);
	check_store_dir(top, "rlocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	store_set_bw_limit(&s, 2 * MiB);
	b = check_blob(&s, top, "nas/range", "range", 1);
	CHECK(&c, store_part_request(&s, b, &(struct brange){ 0, LEN }, 1, 1) == LEN,
	      "the range is asked for");
	/* (part_copying is set with the attributes the copy vouches for) */
	end = store_now_ms() + 10000;
	while (!info(&s, b)->part_copying && store_now_ms() < end)
		usleep(2000);
	CHECK(&c, info(&s, b)->part_copying, "the range copy is under way");
	replace_source(&s, b, "nas/range", N, 10);
	CHECK(&c, wait_parts(&s, b), "the range copy ends");
	stopped_at("range copy", info(&s, b)->part_reason, &done, &of);
	CHECK(&c, of == LEN && done < LEN / 2, "stopped at once: %llu of %llu bytes read", done,
	      of);
	CHECK(&c, info(&s, b)->part_n == 0 && info(&s, b)->part_bytes == 0,
	      "no range listed: %zu ranges, %llu bytes", info(&s, b)->part_n,
	      (unsigned long long)info(&s, b)->part_bytes);

	store_set_bw_limit(&s, 0);
	CHECK(&c, store_part_request(&s, b, &(struct brange){ 0, LEN }, 1, 1) == LEN,
	      "asked again");
	CHECK(&c, wait_parts(&s, b) && info(&s, b)->part_bytes == LEN,
	      "copied again: %llu bytes local (%s)", (unsigned long long)info(&s, b)->part_bytes,
	      info(&s, b)->part_reason);
	store_close(&s);
}

/* An automatic copy asked for explicitly while it runs is an explicit copy
 * from then on: the automatic slot it held is free for the next automatic
 * copy at once, not when it ends. */
static void test_raised_copy_frees_its_auto_slot(void)
{
	struct policy_opts pol;
	struct store_opts opt = { .workers = 2, .policy = &pol }; /* one automatic slot */
	struct store s;
	struct blob *a, *b;
	char local[PATH_MAX * 2];
	int64_t end;

	policy_opts_init(&pol);
	pol.auto_bw = 256000; /* auto_mbps=0.256 */
	pol.min_free_pct = 0;
	check_put_pattern(top, "nas/auto-a", 8 * MiB, 11);
	check_put_pattern(top, "nas/auto-b", 64 * 1024, 12);
	check_store_dir(top, "alocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	store_set_bw_limit(&s, 2 * MiB); /* an explicit copy's share: ~0.7 MB/s */
	a = check_blob(&s, top, "nas/auto-a", NULL, 1);
	b = check_blob(&s, top, "nas/auto-b", NULL, 1);
	store_promote(&s, a, 0, 0);
	CHECK(&c, copy_under_way(&s, a), "a's automatic copy is under way: %s",
	      blob_state_name(blob_state(a)));
	store_promote(&s, b, 0, 0);
	CHECK(&c, blob_state(b) == BLOB_QUEUED, "b waits for the automatic slot a holds: %s",
	      blob_state_name(blob_state(b)));
	store_promote(&s, a, 0, 1);
	end = store_now_ms() + 5000;
	while (blob_state(b) == BLOB_QUEUED && store_now_ms() < end)
		usleep(2000);
	CHECK(&c, blob_state(b) != BLOB_QUEUED && blob_state(a) == BLOB_COPYING,
	      "a asked for explicitly: b's automatic copy starts while a's goes on (b %s, a %s, "
	      "%llu of %zu bytes)", blob_state_name(blob_state(b)),
	      blob_state_name(blob_state(a)), (unsigned long long)info(&s, a)->bytes_done,
	      8 * MiB);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "b local: %s",
	      blob_state_name(blob_state(b)));
	CHECK(&c, s.started == 2, "a copy each: %llu started", (unsigned long long)s.started);
	/* a would take seconds more at its rate */
	CHECK(&c, store_evict(&s, a, 1) == 1 && store_wait_settled(&s, a, 30000) == BLOB_NAS,
	      "a evicted mid-copy: %s", blob_state_name(blob_state(a)));
	store_close(&s);
	policy_opts_free(&pol);
}

/* Copies asked for while the NAS is down wait for it: an operator's, an
 * automatic one and a range alike.  No copy starts (the workers look at
 * the gate and leave the queue as it is), none fails, and once the NAS is
 * up all are made. */
static void test_copies_wait_for_the_nas(void)
{
	enum { N = 2 << 20 };
	struct store_opts opt = { .workers = 2 };
	struct nas_gate g;
	struct store s;
	struct blob *b, *e, *q;
	char local[PATH_MAX * 2], root[PATH_MAX * 2];
	uint64_t held0;
	int64_t end;

	check_put_pattern(top, "nas/held", N, 13);
	check_put_pattern(top, "nas/held-e", N, 14);
	check_put_pattern(top, "nas/held-q", N, 15);
	check_path(root, sizeof(root), top, "nas");
	CHECK(&c, nas_gate_init(&g, root, 200, NULL, NULL) == 0, "gate");
	opt.gate = &g;
	check_store_dir(top, "hlocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	b = check_blob(&s, top, "nas/held", NULL, 1);
	e = check_blob(&s, top, "nas/held-e", NULL, 1);
	q = check_blob(&s, top, "nas/held-q", NULL, 1);
	nas_gate_set_down(&g, "test: down");
	held0 = atomic_load(&s.queue_held);
	store_promote(&s, e, 0, 1);
	store_promote(&s, q, 0, 0);
	CHECK(&c, store_part_request(&s, b, &(struct brange){ 0, N / 2 }, 1, 0) == N / 2,
	      "the range is asked for");
	end = store_now_ms() + 10000;
	while (atomic_load(&s.queue_held) < held0 + 6 && store_now_ms() < end)
		usleep(2000);
	CHECK(&c, blob_state(e) == BLOB_QUEUED && blob_state(q) == BLOB_QUEUED &&
	      atomic_load(&s.started) == 0, "the NAS down: an operator's and an automatic copy "
	      "wait in the queue, none started (%s, %s)", blob_state_name(blob_state(e)),
	      blob_state_name(blob_state(q)));
	CHECK(&c, info(&s, b)->part_copying && !info(&s, b)->part_bytes &&
	      !info(&s, b)->part_reason[0] && atomic_load(&s.part_failed) == 0,
	      "the NAS down: the range waits (pending), looked at %llu times, none failed (%s)",
	      (unsigned long long)(atomic_load(&s.queue_held) - held0), info(&s, b)->part_reason);
	CHECK(&c, nas_gate_start(&g) == 0, "prober");
	nas_gate_wait_change(&g, atomic_load(&g.generation), 5000);
	CHECK(&c, store_wait_settled(&s, e, 30000) == BLOB_LOCAL &&
	      store_wait_settled(&s, q, 30000) == BLOB_LOCAL, "the NAS up: both copied (%s, %s)",
	      blob_state_name(blob_state(e)), blob_state_name(blob_state(q)));
	CHECK(&c, wait_parts(&s, b) && info(&s, b)->part_bytes == N / 2,
	      "the NAS up: the range copied (%llu bytes local: %s)",
	      (unsigned long long)info(&s, b)->part_bytes, info(&s, b)->part_reason);
	store_close(&s);
	nas_gate_destroy(&g);
}

/* The gate goes down as a copy is given out (between the worker's look at
 * the gate and the copy's own): the copy waits for the NAS as one asked for
 * while it is down does, rather than failing -- a range's as a whole one's
 * (back in its queue).  The copy's room is made by evicting a local copy;
 * its log line is where the gate goes down. */
struct down_at_evict {
	struct nas_gate *_Atomic gate; /* armed by the test, disarmed once used */
};

static void gate_down_at_evict(void *arg, int prio, const char *msg)
{
	struct down_at_evict *d = arg;
	struct nas_gate *g;

	(void)prio;
	if (!strncmp(msg, "evicted ", 8) && (g = atomic_exchange(&d->gate, NULL)))
		nas_gate_set_down(g, "test: down as the copy is given out");
}

/* A store LOCAL_STORE top/@name with room for one copy of @n bytes, the
 * NAS top/nas behind the gate @g (up, not probed), and the blob
 * nas/evictee (@n bytes) local in it: a copy of another blob evicts it
 * for its room.  Returns the evictee. */
static struct blob *room_for_one(struct store *s, struct store_opts *opt, struct policy_opts *pol,
				 struct nas_gate *g, const char *name, size_t n,
				 const struct store_hooks *hooks)
{
	char local[PATH_MAX * 2], root[PATH_MAX * 2];
	struct blob *a;

	check_policy_manual(pol);
	opt->policy = pol;
	check_put_pattern(top, "nas/evictee", n, 14);
	check_path(root, sizeof(root), top, "nas");
	CHECK(&c, nas_gate_init(g, root, 200, NULL, NULL) == 0, "gate");
	opt->gate = g;
	check_store_dir(top, name, local, sizeof(local));
	CHECK(&c, store_open(s, local, opt, hooks) == 0, "open");
	pol->store_max = store_charge(s, n) + store_charge(s, n) / 2; /* room for one */
	CHECK(&c, store_start(s) == 0, "start");
	a = check_blob(s, top, "nas/evictee", NULL, 1);
	store_promote(s, a, 0, 1);
	CHECK(&c, store_wait_settled(s, a, 30000) == BLOB_LOCAL, "a local: %s",
	      blob_state_name(blob_state(a)));
	/* (a copy evicts only copies used before its blob was asked for:
	 * the request after a's use, on a coarse clock) */
	while (store_now_ns() <= atomic_load(&a->use_ns))
		sched_yield();
	return a;
}

static void copy_given_out_as_the_nas_goes_down(int whole)
{
	enum { N = 1 << 20 };
	struct down_at_evict d = { NULL };
	struct store_hooks hooks = { .arg = &d, .log = gate_down_at_evict };
	struct store_opts opt = { .workers = 1 };
	struct policy_opts pol;
	struct nas_gate g;
	struct store s;
	struct blob *a, *b;
	char name[32];
	uint64_t held0;
	int64_t end;

	snprintf(name, sizeof(name), "glocal%d", whole);
	a = room_for_one(&s, &opt, &pol, &g, name, N, &hooks);
	check_put_pattern(top, "nas/given-out", N, 15);
	b = check_blob(&s, top, "nas/given-out", NULL, 1);
	atomic_store(&d.gate, &g);
	if (whole)
		store_promote(&s, b, 0, 1);
	else
		CHECK(&c, store_part_request(&s, b, &(struct brange){ 0, N }, 1, 0) == N,
		      "the range is asked for");
	/* b's copy is given out (a evicted for its room, the gate down
	 * then): it fails, or goes back to wait -- looked at again */
	end = store_now_ms() + 10000;
	while (blob_state(a) == BLOB_LOCAL && store_now_ms() < end)
		usleep(2000);
	held0 = atomic_load(&s.queue_held);
	while (atomic_load(&s.queue_held) < held0 + 2 && store_now_ms() < end &&
	       (whole ? blob_state(b) == BLOB_QUEUED || blob_state(b) == BLOB_COPYING :
			info(&s, b)->part_copying))
		usleep(2000);
	CHECK(&c, !atomic_load(&d.gate) && !nas_gate_up(&g), "the gate went down as a was evicted");
	if (whole)
		CHECK(&c, blob_state(b) == BLOB_QUEUED && atomic_load(&s.failed) == 0,
		      "the whole copy waits for the NAS in the queue, none failed (%s: %s)",
		      blob_state_name(blob_state(b)), info(&s, b)->reason);
	else
		CHECK(&c, info(&s, b)->part_copying && !info(&s, b)->part_reason[0] &&
		      atomic_load(&s.part_failed) == 0,
		      "the range waits for the NAS, none failed (%s)", info(&s, b)->part_reason);
	CHECK(&c, nas_gate_start(&g) == 0, "prober");
	CHECK(&c, wait_parts(&s, b) && store_wait_settled(&s, b, 30000) == BLOB_LOCAL,
	      "the NAS up: copied (%s: %s %s)", blob_state_name(blob_state(b)), info(&s, b)->reason,
	      info(&s, b)->part_reason);
	store_close(&s);
	nas_gate_destroy(&g);
	policy_opts_free(&pol);
}

static void test_copy_given_out_as_the_nas_goes_down(void)
{
	copy_given_out_as_the_nas_goes_down(1);
	copy_given_out_as_the_nas_goes_down(0);
}

/* --wrap=store_write_index: when armed, as a copy worker writes the index
 * after evicting for its copy's room (no lock held, the copy given out,
 * not started), the NAS goes down, and the operator evicts that copy or a
 * reader's stat shows its source replaced. */
int __real_store_write_index(struct store *s);
int __wrap_store_write_index(struct store *s);
static struct {
	struct nas_gate *_Atomic gate;
	struct blob *b;
	const char *replace; /* NULL: evicted */
} given_out;

int __wrap_store_write_index(struct store *s)
{
	struct nas_gate *g = atomic_exchange(&given_out.gate, NULL);

	if (g) {
		nas_gate_set_down(g, "test: down as the copy is given out");
		if (given_out.replace)
			replace_source(s, given_out.b, given_out.replace, 1 << 20, 17);
		else
			CHECK(&c, store_evict(s, given_out.b, 1) == 1, "b evicted as it is given out");
	}
	return __real_store_write_index(s);
}

/* A copy given out as the NAS goes down never starts.  Evicted then, it
 * ends as "evicted" said -- on the NAS, cancelled -- not FAILED as a copy
 * the NAS failed (a failure counted, a backoff, a flag in status for a
 * blob the operator sent to the NAS).  Its source replaced then, it waits
 * for the NAS as any copy given out then does (nothing of the old file was
 * read), and the copy made holds the new bytes. */
static void given_out_and_then(int replaced)
{
	enum { N = 1 << 20 };
	struct store_opts opt = { .workers = 1 };
	struct policy_opts pol;
	struct nas_gate g;
	struct store s;
	struct blob *b;
	char copy[PATH_MAX * 2];
	uint64_t held0;
	int64_t end;

	room_for_one(&s, &opt, &pol, &g, replaced ? "rglocal" : "eglocal", N, NULL);
	check_put_pattern(top, "nas/given-out-2", N, 16);
	given_out.b = b = check_blob(&s, top, "nas/given-out-2", NULL, 1);
	given_out.replace = replaced ? "nas/given-out-2" : NULL;
	atomic_store(&given_out.gate, &g);
	store_promote(&s, b, 0, 1);
	if (!replaced) {
		CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_NAS &&
		      !strcmp(info(&s, b)->reason, "copy cancelled") && atomic_load(&s.failed) == 0,
		      "evicted as given out: cancelled, not failed: %s (%s), %llu failed",
		      blob_state_name(blob_state(b)), info(&s, b)->reason,
		      (unsigned long long)atomic_load(&s.failed));
	} else {
		/* the wrap ran; then the worker looked at the queue twice */
		end = store_now_ms() + 10000;
		while (atomic_load(&given_out.gate) && store_now_ms() < end)
			usleep(2000);
		held0 = atomic_load(&s.queue_held);
		while (atomic_load(&s.queue_held) < held0 + 2 && store_now_ms() < end)
			usleep(2000);
		CHECK(&c, blob_state(b) == BLOB_QUEUED && atomic_load(&s.failed) == 0,
		      "replaced as given out: it waits for the NAS: %s (%s)",
		      blob_state_name(blob_state(b)), info(&s, b)->reason);
		CHECK(&c, nas_gate_start(&g) == 0, "prober");
		CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL &&
		      store_local_path(&s, b, copy, sizeof(copy)) == 0 && check_holds_pattern(copy, N, 17),
		      "the NAS up: the new bytes copied: %s (%s)", blob_state_name(blob_state(b)),
		      info(&s, b)->reason);
	}
	CHECK(&c, !atomic_load(&given_out.gate), "the wrap ran");
	store_close(&s);
	nas_gate_destroy(&g);
	policy_opts_free(&pol);
}

static void test_given_out_and_then(void)
{
	given_out_and_then(0);
	given_out_and_then(1);
}

/* A source check made as the NAS file is replaced by one of the same size
 * and other bytes: its sample may be of the file before, so it is made
 * again on the new one, which demotes the copy -- never marked checked
 * (nothing would check it again: the store has seen the new attributes). */
static void test_check_of_a_replaced_source(void)
{
	enum { N = 256 << 10 };
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *b;
	char local[PATH_MAX * 2];

	check_put_pattern(top, "nas/checked", N, 3);
	check_store_dir(top, "clocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	b = check_blob(&s, top, "nas/checked", "checked", 1);
	store_promote(&s, b, 0, 1);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "local");
	replace_source(&s, b, "nas/checked", N, 3); /* same bytes, new attributes */
	replace_at.s = &s, replace_at.b = b, replace_at.rel = "nas/checked";
	replace_at.n = N, replace_at.seed = 4;
	atomic_store(&replace_at.armed, 1);
	CHECK(&c, store_check_source(&s, b) == 0 && blob_state(b) != BLOB_LOCAL &&
	      !atomic_load(&replace_at.armed), "a check made as the source is replaced by other "
	      "bytes: made again, the copy demoted (%s: %s)", blob_state_name(blob_state(b)),
	      info(&s, b)->reason);
	CHECK(&c, store_check_source(&s, b) == 0, "and not served after");
	store_close(&s);
}

/* A copy whose content check fails as the NAS file is replaced by the
 * right bytes (a download finished): the mismatch was the old file's and is
 * not flagged (nothing would clear it: the new attributes came first); the
 * copy asked for again is made of the new file. */
static void test_mismatch_of_a_replaced_source(void)
{
	static const char sha_hello[] =
		"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
	struct store_opts opt = { .workers = 1 };
	struct store s;
	struct blob *b;
	char local[PATH_MAX * 2], p[PATH_MAX * 2];

	check_path(p, sizeof(p), top, "nas/redownloaded");
	check_write_file(p, "HELLO\n", 6);
	check_store_dir(top, "mlocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	b = check_blob(&s, top, "nas/redownloaded", sha_hello, 1);
	replace_at.s = &s, replace_at.b = b, replace_at.rel = "nas/redownloaded";
	replace_at.n = 6, replace_at.seed = 0;
	atomic_store(&replace_at.armed, 1);
	store_promote(&s, b, 0, 1);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_FAILED &&
	      !atomic_load(&replace_at.armed) && strstr(info(&s, b)->reason, "source changed"),
	      "a mismatch found as the source is replaced: failed, the source changed (%s: %s)",
	      blob_state_name(blob_state(b)), info(&s, b)->reason);
	store_promote(&s, b, 0, 1);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "asked again: local (%s: %s)",
	      blob_state_name(blob_state(b)), info(&s, b)->reason);
	store_close(&s);
}

/* wfsctl verify --full of a copy evicted as its hash begins, and made
 * again before it ends: the hash found no file, which says nothing of the
 * copy serving now -- it stays local and keeps serving. */
static void test_full_verify_of_a_copy_made_again(void)
{
	struct store_opts opt = { .workers = 1 };
	char local[PATH_MAX * 2], why[256] = "";
	struct store s;
	struct blob *b;

	check_put_pattern(top, "nas/verified", 1 << 20, 5);
	check_store_dir(top, "vlocal", local, sizeof(local));
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	b = check_blob(&s, top, "nas/verified", "verified", 1);
	store_promote(&s, b, 0, 1);
	CHECK(&c, store_wait_settled(&s, b, 30000) == BLOB_LOCAL, "local");
	evict_at.s = &s, evict_at.b = b;
	atomic_store(&evict_at.armed, 1);
	CHECK(&c, store_verify(&s, b, 1, why, sizeof(why)) == 0 && evict_at.remade &&
	      blob_state(b) == BLOB_LOCAL, "verify --full of a copy made again as it ran: "
	      "nothing demoted (%s, %s)", blob_state_name(blob_state(b)), why);
	CHECK(&c, store_verify(&s, b, 1, why, sizeof(why)) == 0 && blob_state(b) == BLOB_LOCAL,
	      "and the copy made again verifies whole (%s)", why);
	store_close(&s);
}

int main(void)
{
	snprintf(top, sizeof(top), "/var/tmp/wfs-inflight-XXXXXX");
	check_tmpdir(top);
	check_mkdirs(top, "nas");
	test_evict_in_flight();
	test_whole_copy_of_a_replaced_source();
	test_range_copy_of_a_replaced_source();
	test_raised_copy_frees_its_auto_slot();
	test_copies_wait_for_the_nas();
	test_copy_given_out_as_the_nas_goes_down();
	test_given_out_and_then();
	test_check_of_a_replaced_source();
	test_mismatch_of_a_replaced_source();
	test_full_verify_of_a_copy_made_again();
	check_rmtree(top);
	printf("inflight: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
