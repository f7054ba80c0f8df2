/* test_queue.c - the copy queue's order, without copying anything (the
 * store not started: whatever is asked for stays queued).
 *
 *   order     explicit requests first, in the order asked, then automatic
 *             ones in theirs; an automatic one asked for explicitly moves
 *             to the end of the explicit ones
 *   cancel    evicting queued blobs (first, last, middle, the last
 *             explicit one) leaves the rest in order, the links whole
 *   many      20,000 explicit requests after 20,000 automatic ones: every
 *             one in its place (a walk past each explicit entry to place
 *             the next once made a promote of 40,000 blobs take 11 s of
 *             lock-held work)
 *   taken     (a store started) a blob the copy worker takes from the
 *             queue is copied, even when the index falls due to be written
 *             meanwhile: it was dropped then, QUEUED in no queue, and its
 *             promote --wait waited for ever
 */
#include "check_store.h"
#include "store.h"
#include "store_int.h"

#include <pthread.h>
#include <stdatomic.h>

static struct check_count c;

/* The queue walked from its head, each back link, its tail and its last
 * explicit entry checked: the blobs in order into @out (at most @max),
 * their count, or -1 when the links disagree. */
static long queue_walk(struct store *s, struct blob **out, size_t max)
{
	struct blob *prev = NULL, *last_explicit = NULL;
	size_t n = 0;

	for (struct blob *b = s->qhead; b; prev = b, b = b->qnext) {
		if (b->qprev != prev || !b->in_queue || n >= max)
			return -1;
		if (b->explicit_req) {
			if (prev && !prev->explicit_req)
				return -1; /* an explicit one behind an automatic one */
			last_explicit = b;
		}
		out[n++] = b;
	}
	return s->qtail == prev && s->qexplicit == last_explicit ? (long)n : -1;
}

static struct blob *blob_named(struct store *s, unsigned i)
{
	struct stat st = { .st_mode = S_IFREG | 0644, .st_size = 4096, .st_ino = i + 1 };
	char key[160], id[65];

	snprintf(key, sizeof(key), "/nowhere/hub/datasets--q--q/blobs/%064u", i);
	snprintf(id, sizeof(id), "%064u", i);
	return store_blob(s, key, &st, id);
}

/* The queue is exactly @want (@n blobs)? */
static int queue_is(struct store *s, struct blob *const *want, size_t n)
{
	struct blob *got[16];
	long k = queue_walk(s, got, 16);

	if (k != (long)n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i])
			return 0;
	return 1;
}

static void test_order_and_cancel(struct store *s)
{
	struct blob *a0 = blob_named(s, 0), *a1 = blob_named(s, 1), *a2 = blob_named(s, 2);
	struct blob *e0 = blob_named(s, 3), *e1 = blob_named(s, 4), *e2 = blob_named(s, 5);

	store_promote(s, a0, 0, 0);
	store_promote(s, a1, 0, 0);
	store_promote(s, e0, 0, 1);
	store_promote(s, a2, 0, 0);
	store_promote(s, e1, 0, 1);
	CHECK(&c, queue_is(s, (struct blob *[]){ e0, e1, a0, a1, a2 }, 5),
	      "explicit first, each kind in the order asked");
	store_promote(s, a1, 0, 1);
	CHECK(&c, queue_is(s, (struct blob *[]){ e0, e1, a1, a0, a2 }, 5),
	      "an automatic one asked for explicitly: after the explicit ones");
	store_evict(s, a1, 1); /* the last explicit one */
	store_promote(s, e2, 0, 1);
	CHECK(&c, queue_is(s, (struct blob *[]){ e0, e1, e2, a0, a2 }, 5),
	      "the last explicit one cancelled: the next goes after e1");
	store_evict(s, e0, 1);
	store_evict(s, a2, 1);
	store_evict(s, e2, 1);
	CHECK(&c, queue_is(s, (struct blob *[]){ e1, a0 }, 2), "head, tail, middle cancelled");
	store_evict(s, e1, 1);
	store_evict(s, a0, 1);
	CHECK(&c, queue_is(s, NULL, 0) && !s->qhead && !s->qtail && !s->qexplicit, "empty");
}

static void test_many(struct store *s)
{
	enum { N = 20000 };
	struct blob **v = calloc(2 * N, sizeof(*v)), **got = calloc(2 * N, sizeof(*got));
	long k;
	int in_order = 1;

	if (!v || !got)
		exit(2);
	for (unsigned i = 0; i < 2 * N; i++)
		v[i] = blob_named(s, 100 + i);
	for (unsigned i = 0; i < N; i++)
		store_promote(s, v[i], 0, 0);
	for (unsigned i = N; i < 2 * N; i++)
		store_promote(s, v[i], 0, 1);
	k = queue_walk(s, got, 2 * N);
	for (long i = 0; i < k && in_order; i++)
		in_order = got[i] == (i < N ? v[N + i] : v[i - N]);
	CHECK(&c, k == 2 * N && in_order, "%ld queued, in order: %d", k, in_order);
	for (unsigned i = 0; i < 2 * N; i += 2)
		store_evict(s, v[i], 1);
	k = queue_walk(s, got, 2 * N);
	CHECK(&c, k == N, "every other one cancelled: %ld left, the links whole", k);
	free(v);
	free(got);
}

/* Linked with --wrap=nas_gate_up.  Armed, the copy worker's next look at
 * the gate -- as it takes a blob from the queue -- first waits past
 * INDEX_FLUSH_MS: a dirty index falls due in between. */
static atomic_int slow_gate;
int __real_nas_gate_up(struct nas_gate *g);
int __wrap_nas_gate_up(struct nas_gate *g)
{
	char name[16] = "";

	pthread_getname_np(pthread_self(), name, sizeof(name));
	if (!strcmp(name, "wfs-copy") && atomic_exchange(&slow_gate, 0))
		usleep((INDEX_FLUSH_MS + 300) * 1000);
	return __real_nas_gate_up(g);
}

static void test_taken(const char *top)
{
	struct store_opts opt = { .workers = 1 };
	char local[PATH_MAX * 2];
	struct blob *pinned, *b;
	struct store s;

	check_mkdirs(top, "hub/models--q--t/blobs");
	check_put_pattern(top, "hub/models--q--t/blobs/pinned", 4096, 1);
	check_put_pattern(top, "hub/models--q--t/blobs/b", 4096, 2);
	check_store_dir(top, "local-taken", local, sizeof(local));
	if (store_open(&s, local, &opt, NULL) < 0 || store_start(&s) < 0)
		exit(2);
	pinned = check_blob(&s, top, "hub/models--q--t/blobs/pinned", NULL, 1);
	b = check_blob(&s, top, "hub/models--q--t/blobs/b", NULL, 1);
	store_pin(&s, pinned, 1); /* the index dirty, not due yet */
	atomic_store(&slow_gate, 1);
	store_promote(&s, b, 0, 1);
	CHECK(&c, store_wait_settled(&s, b, 3 * INDEX_FLUSH_MS + 5000) == BLOB_LOCAL &&
	      !atomic_load(&slow_gate), "taken while the index fell due: copied (%s)",
	      blob_state_name(blob_state(b)));
	store_close(&s);
}

int main(void)
{
	struct store_opts opt = { .workers = 1 };
	char top[] = "/var/tmp/wfs-queue-XXXXXX";
	struct store s;

	check_tmpdir(top);
	if (store_open(&s, top, &opt, NULL) < 0)
		return 2;
	test_order_and_cancel(&s);
	test_many(&s);
	store_close(&s);
	test_taken(top);
	check_rmtree(top);
	printf("queue: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
