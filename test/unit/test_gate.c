/* test_gate.c - core/nasgate.c without a NAS: the calls are functions
 * that return at once, fail, or block until the test lets them go (a hung
 * NFS call).  The prober stats a real directory, renamed away and back to
 * play an unreachable and a returning NAS.  A call that blocked its caller
 * past the deadline would hang this program: an alarm turns that into a
 * failure.  The NAS closer (nasclose.h) is checked here too. */
#include "check.h"
#include "nasgate.h"
#include "nasclose.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

static struct check_count cnt;

/* A call that blocks until released; counts its ends. */
struct hang {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int open, running, ended, released;
};

static int hang_fn(void *arg)
{
	struct hang *h = arg;

	pthread_mutex_lock(&h->lock);
	h->running++;
	pthread_cond_broadcast(&h->cond);
	while (!h->open)
		pthread_cond_wait(&h->cond, &h->lock);
	h->running--;
	h->ended++;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

static void hang_release(void *arg)
{
	struct hang *h = arg;

	pthread_mutex_lock(&h->lock);
	h->released++;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

/* Let @h's calls go; return once @n of them are released. */
static void wait_released(struct hang *h, int n)
{
	pthread_mutex_lock(&h->lock);
	h->open = 1;
	pthread_cond_broadcast(&h->cond);
	while (h->released < n)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

static int ok_fn(void *arg)
{
	(*(int *)arg)++;
	return 0;
}

static int err_fn(void *arg)
{
	return -*(int *)arg;
}

static int64_t ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wait_up(struct nas_gate *g, int want)
{
	uint64_t gen = atomic_load(&g->generation);

	while (nas_gate_up(g) != want)
		gen = nas_gate_wait_change(g, gen, 10000);
}

/* A burst: @want calls that each wait until all @want run at once (a
 * readahead's READs on a slow NAS), or give up at @by (CLOCK_MONOTONIC
 * ms): the gate must give each queued call a thread of its own. */
struct burst {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int want, running, most;
	int64_t by;
};

static int burst_fn(void *arg)
{
	struct burst *b = arg;
	int r = 0;

	pthread_mutex_lock(&b->lock);
	b->running++;
	if (b->running > b->most)
		b->most = b->running;
	pthread_cond_broadcast(&b->cond);
	while (b->most < b->want && r == 0) {
		struct timespec dl = { .tv_sec = b->by / 1000, .tv_nsec = (b->by % 1000) * 1000000 };

		if (pthread_cond_timedwait(&b->cond, &b->lock, &dl) == ETIMEDOUT &&
		    b->most < b->want)
			r = -EAGAIN; /* never all at once: not a NAS verdict */
	}
	b->running--;
	pthread_mutex_unlock(&b->lock);
	return r;
}

struct many {
	struct nas_gate *g;
	int (*fn)(void *);
	void *arg;
	void (*release)(void *);
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int arrived;
};

struct many_caller {
	struct many *m;
	pthread_t t;
	int r;
};

static void *many_caller(void *arg)
{
	struct many_caller *c = arg;
	struct many *m = c->m;

	pthread_mutex_lock(&m->lock);
	m->arrived++;
	pthread_cond_broadcast(&m->cond);
	pthread_mutex_unlock(&m->lock);
	c->r = nas_call(m->g, m->fn, m->arg, m->release);
	return NULL;
}

/* @n calls of @m's function, from threads of their own, all queued before
 * any runs (the gate's lock is held while they gather); each result in
 * @c[i].r. */
static void call_many(struct many *m, struct many_caller *c, int n)
{
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cond, NULL);
	m->arrived = 0;
	pthread_mutex_lock(&m->g->lock);
	for (int i = 0; i < n; i++) {
		c[i] = (struct many_caller){ .m = m };
		if (pthread_create(&c[i].t, NULL, many_caller, &c[i]))
			exit(2);
	}
	pthread_mutex_lock(&m->lock);
	while (m->arrived < n)
		pthread_cond_wait(&m->cond, &m->lock);
	pthread_mutex_unlock(&m->lock);
	pthread_mutex_unlock(&m->g->lock);
	for (int i = 0; i < n; i++)
		pthread_join(c[i].t, NULL);
	pthread_cond_destroy(&m->cond);
	pthread_mutex_destroy(&m->lock);
}

/* One burst of @n calls on @g, with idle threads left by earlier calls,
 * queued at once (call_many): before a woken thread can take its job, the
 * moment a count of idle threads that was not yet brought down would
 * mislead the next caller.  Returns how many calls failed. */
static int one_burst(struct nas_gate *g, int n)
{
	struct burst b = { .lock = PTHREAD_MUTEX_INITIALIZER, .want = n, .by = ms_now() + 1500 };
	struct many_caller c[NAS_GATE_THREADS];
	pthread_condattr_t ca;
	int bad = 0;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* @by is */
	pthread_cond_init(&b.cond, &ca);
	pthread_condattr_destroy(&ca);
	call_many(&(struct many){ .g = g, .fn = burst_fn, .arg = &b }, c, n);
	for (int i = 0; i < n; i++)
		if (c[i].r != 0) {
			fprintf(stderr, "burst call %d of %d: %d (%d at once at most)\n", i, n,
				c[i].r, b.most);
			bad++;
		}
	pthread_cond_destroy(&b.cond);
	return bad;
}

/* A call of many NAS operations, each answered in 20 ms (a listing on a
 * loaded server): @steps answers, then, with @h, it hangs until released. */
struct slow_list {
	_Atomic uint64_t progress;
	int steps;
	int64_t last_ms;      /* when the last answer came */
	struct hang *h;
};

static int slow_list_fn(void *arg)
{
	struct slow_list *s = arg;
	struct timespec step = { 0, 20 * 1000 * 1000 };

	for (int i = 0; i < s->steps; i++) {
		nanosleep(&step, NULL);
		s->last_ms = ms_now();
		atomic_fetch_add(&s->progress, 1);
	}
	return s->h ? hang_fn(s->h) : 0;
}

static void slow_list_release(void *arg)
{
	hang_release(((struct slow_list *)arg)->h);
}

/* nas_call_progress: a call that takes 5 deadlines, answered all along, is
 * not late (nas_call takes it for a hung NAS); one whose answers stop is
 * late a deadline or more after its last answer, and the NAS is down. */
static void test_progress(const char *root)
{
	struct hang h = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct hang h2 = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
			   .open = 1 };
	struct slow_list s = { .steps = 50 };
	struct nas_gate g;
	int64_t t0, back;
	int r;

	CHECK(&cnt, nas_gate_init(&g, root, 200, NULL, NULL) == 0, "init");
	CHECK(&cnt, nas_gate_start(&g) == 0, "start");
	t0 = ms_now();
	r = nas_call_progress(&g, slow_list_fn, &s, NULL, &s.progress);
	CHECK(&cnt, r == 0 && atomic_load(&s.progress) == 50, "a call answered all along: %d "
	      "after %lld ms", r, (long long)(ms_now() - t0));
	CHECK(&cnt, nas_gate_up(&g), "up after it");

	s = (struct slow_list){ .steps = 10, .h = &h };
	r = nas_call_progress(&g, slow_list_fn, &s, slow_list_release, &s.progress);
	back = ms_now();
	CHECK(&cnt, r == -ETIMEDOUT, "a call whose answers stop: %d", r);
	/* (last_ms read after the progress that counts its write: the call
	 * writes it no more once hung) */
	CHECK(&cnt, atomic_load(&s.progress) == 10 && back - s.last_ms >= 200 &&
	      back - s.last_ms < 400 + 2000, "back %lld ms after its last answer",
	      (long long)(back - s.last_ms));
	CHECK(&cnt, atomic_load(&g.outages) == 1 && atomic_load(&g.timeouts) == 1,
	      "marked down once: %llu outages", (unsigned long long)atomic_load(&g.outages));
	wait_released(&h, 1);

	/* (its end waited for: @s is this frame's) */
	s = (struct slow_list){ .steps = 50, .h = &h2 };
	wait_up(&g, 1);
	r = nas_call(&g, slow_list_fn, &s, slow_list_release);
	CHECK(&cnt, r == -ETIMEDOUT, "the same call under nas_call: %d", r);
	wait_released(&h2, 1);
	nas_gate_destroy(&g);
}

/* ---- more calls at once than NAS threads ---- */

/* A NAS call answered after SLOW_MS: a slow server, within the deadline. */
#define SLOW_MS 300

static int slow_fn(void *arg)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = SLOW_MS * 1000000L };

	atomic_fetch_add((_Atomic int *)arg, 1);
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	return 0;
}

/* Five calls per NAS thread, each answered in SLOW_MS, deadline 800 ms:
 * the second round starts at ~300 ms and is answered (a deadline counted
 * from the call, not from when a thread took it, would pass in it), so
 * may the third (at ~600 ms); the fifth cannot start before 1200 ms (four
 * SLOW_MS one after another), so its callers, queued within 400 ms of the
 * first, give up waiting for a thread -- busy, not late: the threads
 * answered all along, so the NAS stays up.  Then
 * every thread held in a hung NAS with one call more queued behind them:
 * no thread ends a call while it waits, so that one is late, not busy. */
static void test_busy(const char *root)
{
	enum { N = 5 * NAS_GATE_THREADS };
	struct hang h = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct many_caller c[N];
	struct nas_gate_stats st;
	struct nas_gate g, g2; /* two: a thread of the first may outlive it */
	_Atomic int ran = 0;
	int ok = 0, busy = 0, late = 0;

	CHECK(&cnt, nas_gate_init(&g, root, 800, NULL, NULL) == 0, "init");
	CHECK(&cnt, nas_gate_start(&g) == 0, "start");
	call_many(&(struct many){ .g = &g, .fn = slow_fn, .arg = &ran }, c, N);
	for (int i = 0; i < N; i++) {
		ok += c[i].r == 0;
		busy += c[i].r == -EBUSY;
		if (c[i].r != 0 && c[i].r != -EBUSY)
			fprintf(stderr, "slow call %d: %d\n", i, c[i].r);
	}
	nas_gate_stats(&g, &st);
	CHECK(&cnt, ok >= 2 * NAS_GATE_THREADS && ok + busy == N,
	      "%d calls of %d answered, %d busy: each round took %d ms on a NAS thread", ok, N,
	      busy, SLOW_MS);
	CHECK(&cnt, busy >= NAS_GATE_THREADS, "the last round waited 1200 ms for a thread, "
	      "busy %d", busy);
	CHECK(&cnt, atomic_load(&ran) == ok, "ran %d, answered %d: a busy call ran",
	      atomic_load(&ran), ok);
	CHECK(&cnt, st.up && st.outages == 0 && st.timeouts == 0 && st.busy == (uint64_t)busy,
	      "a slow NAS answering every call taken for down: up %d, outages %llu, "
	      "timeouts %llu, busy %llu", st.up, (unsigned long long)st.outages,
	      (unsigned long long)st.timeouts, (unsigned long long)st.busy);
	nas_gate_destroy(&g);

	CHECK(&cnt, nas_gate_init(&g2, root, 300, NULL, NULL) == 0, "init");
	CHECK(&cnt, nas_gate_start(&g2) == 0, "start");
	call_many(&(struct many){ .g = &g2, .fn = hang_fn, .arg = &h, .release = hang_release }, c,
		  NAS_GATE_THREADS + 1);
	for (int i = 0; i <= NAS_GATE_THREADS; i++)
		late += c[i].r == -ETIMEDOUT;
	nas_gate_stats(&g2, &st);
	CHECK(&cnt, late == NAS_GATE_THREADS + 1 && st.busy == 0 && !st.up &&
	      st.timeouts == NAS_GATE_THREADS + 1,
	      "behind hung threads: %d of %d late, busy %llu, up %d, timeouts %llu", late,
	      NAS_GATE_THREADS + 1, (unsigned long long)st.busy, st.up,
	      (unsigned long long)st.timeouts);
	CHECK(&cnt, h.released == 1, "the call that never ran released at once: %d",
	      h.released);
	wait_released(&h, NAS_GATE_THREADS + 1);
	nas_gate_destroy(&g2);
}

struct progress_caller {
	struct nas_gate *g;
	struct slow_list s;
	pthread_t t;
	int r;
};

static void *progress_caller(void *arg)
{
	struct progress_caller *c = arg;

	c->r = nas_call_progress(c->g, slow_list_fn, &c->s, NULL, &c->s.progress);
	return NULL;
}

/* Every NAS thread in a call of many operations answered every 20 ms for
 * 2.5 deadlines (16 listings of large directories on a slow server), and
 * one call more queued behind them: no thread ends a call while it waits,
 * but the listings' answers say the NAS is not hung: busy, not late. */
static void test_busy_listings(const char *root)
{
	struct progress_caller c[NAS_GATE_THREADS];
	struct nas_gate_stats st;
	struct nas_gate g;
	int n = 0, r, ok = 1;

	CHECK(&cnt, nas_gate_init(&g, root, 200, NULL, NULL) == 0, "init");
	CHECK(&cnt, nas_gate_start(&g) == 0, "start");
	for (int i = 0; i < NAS_GATE_THREADS; i++) {
		c[i] = (struct progress_caller){ .g = &g, .s = { .steps = 25 } };
		if (pthread_create(&c[i].t, NULL, progress_caller, &c[i]))
			exit(2);
	}
	/* each has a thread, ~100 ms in: the listings' callers look at their
	 * answers at ~200 ms, midway through the queued call's wait */
	for (int i = 0; i < NAS_GATE_THREADS; i++)
		while (atomic_load(&c[i].s.progress) < 5)
			nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	r = nas_call(&g, ok_fn, &n, NULL);
	CHECK(&cnt, r == -EBUSY && n == 0, "queued behind answering listings: %d, ran %d", r, n);
	for (int i = 0; i < NAS_GATE_THREADS; i++) {
		pthread_join(c[i].t, NULL);
		ok &= c[i].r == 0;
	}
	nas_gate_stats(&g, &st);
	CHECK(&cnt, ok && st.up && st.outages == 0 && st.timeouts == 0 && st.busy == 1,
	      "listings answered %d, up %d, outages %llu, timeouts %llu, busy %llu", ok, st.up,
	      (unsigned long long)st.outages, (unsigned long long)st.timeouts,
	      (unsigned long long)st.busy);
	nas_gate_destroy(&g);
}

static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* nasclose.h: what is given to the closer gets closed, more than its
 * first array holds; without a closer, at once. */
static void test_closer(void)
{
	struct nas_closer c;
	int fds[40], p[2], still = 0;

	CHECK(&cnt, nas_closer_init(&c) == 0, "closer init");
	for (int i = 0; i < 40; i += 2) {
		CHECK(&cnt, pipe(p) == 0, "pipe");
		fds[i] = p[0];
		fds[i + 1] = p[1];
	}
	for (int i = 0; i < 40; i++)
		nas_close_later(&c, fds[i]);
	nas_closer_stop_by(&c, ms_now() + 5000);
	for (int i = 0; i < 40; i++)
		still += fd_open(fds[i]);
	CHECK(&cnt, still == 0, "%d of 40 descriptors still open after the closer's stop", still);
	CHECK(&cnt, pipe(p) == 0, "pipe");
	nas_close_later(NULL, p[0]);
	nas_close_later(&c, p[1]); /* stopped: closed here */
	CHECK(&cnt, !fd_open(p[0]) && !fd_open(p[1]), "closed at once without a closer");
}

int main(void)
{
	char root[] = "/tmp/wfs-gate-XXXXXX", away[64];
	struct hang h = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct nas_gate_stats st;
	struct nas_gate g;
	int64_t t0;
	int n = 0, e, r;

	alarm(120);
	if (!mkdtemp(root))
		return 2;
	snprintf(away, sizeof(away), "%s.away", root);
	CHECK(&cnt, nas_gate_init(&g, root, 50, NULL, NULL) == 0, "init");
	CHECK(&cnt, nas_gate_start(&g) == 0, "start");

	/* an errno says unreachable only as one: a call's result (100 bytes
	 * read, descriptor 107) is never ENETDOWN or ENOTCONN (a read of 100
	 * bytes was taken for a NAS descriptor that died: reopened, and the
	 * rest of a short read asked on a descriptor of -ESTALE) */
	CHECK(&cnt, nas_gate_unavailable(-ENETDOWN) && nas_gate_unavailable(-ENOTCONN) &&
	      !nas_gate_unavailable(ENETDOWN) && !nas_gate_unavailable(ENOTCONN) &&
	      !nas_gate_unavailable(0) && !nas_cannot_answer(ENETDOWN),
	      "unavailable: negative errnos only");

	/* a call that answers: its result, up stays up */
	CHECK(&cnt, nas_call(&g, ok_fn, &n, NULL) == 0 && n == 1, "n=%d", n);
	e = ENOENT;
	CHECK(&cnt, nas_call(&g, err_fn, &e, NULL) == -ENOENT, "ENOENT passed through");
	CHECK(&cnt, nas_gate_up(&g), "a missing file says nothing of the NAS");

	/* a hung call: the caller is back at the deadline, the NAS is down,
	 * later calls fail at once without running (the root away meanwhile,
	 * or the prober would find the NAS up at once) */
	CHECK(&cnt, rename(root, away) == 0, "rename");
	t0 = ms_now();
	r = nas_call(&g, hang_fn, &h, hang_release);
	CHECK(&cnt, r == -ETIMEDOUT, "hung call: %d", r);
	CHECK(&cnt, ms_now() - t0 < 5000, "returned after %lld ms", (long long)(ms_now() - t0));
	CHECK(&cnt, !nas_gate_up(&g), "down after a timeout");
	r = nas_call(&g, ok_fn, &n, NULL);
	CHECK(&cnt, r == -EHOSTDOWN && n == 1, "refused while down: %d, ran %d", r, n);
	nas_gate_stats(&g, &st);
	CHECK(&cnt, st.timeouts == 1 && st.failed_down == 1 && st.outages == 1 && st.stuck == 1,
	      "timeouts %llu failed_down %llu outages %llu stuck %u",
	      (unsigned long long)st.timeouts, (unsigned long long)st.failed_down,
	      (unsigned long long)st.outages, st.stuck);

	/* the hung call ends: its release runs on its thread; the prober
	 * (its root answers) marks the NAS up */
	wait_released(&h, 1);
	CHECK(&cnt, h.ended == 1 && h.released == 1, "ended %d released %d", h.ended, h.released);
	CHECK(&cnt, !nas_gate_up(&g), "still down: the root is away");
	CHECK(&cnt, rename(away, root) == 0, "rename back");
	wait_up(&g, 1);
	CHECK(&cnt, nas_gate_up(&g), "up again");
	CHECK(&cnt, nas_call(&g, ok_fn, &n, NULL) == 0 && n == 2, "calls run again");

	/* an error meaning "unreachable" marks it down; the root gone keeps
	 * it down; the root back brings it up */
	CHECK(&cnt, rename(root, away) == 0, "rename");
	e = ENOTCONN;
	CHECK(&cnt, nas_call(&g, err_fn, &e, NULL) == -ENOTCONN, "ENOTCONN passed through");
	CHECK(&cnt, !nas_gate_up(&g), "down after ENOTCONN");
	nas_gate_stats(&g, &st);
	CHECK(&cnt, strstr(st.reason, "Transport endpoint") != NULL, "reason: %s", st.reason);
	CHECK(&cnt, rename(away, root) == 0, "rename back");
	wait_up(&g, 1);
	CHECK(&cnt, nas_gate_up(&g), "up once the root answers");

	/* ENOTCONN from a call on a descriptor opened earlier (a read): that
	 * descriptor may be of a mount since gone; the root answers, so the
	 * NAS stays up.  With the root gone too, the probe it asked for finds
	 * it down. */
	CHECK(&cnt, nas_call_on_fd(&g, err_fn, &e, NULL) == -ENOTCONN, "ENOTCONN on a descriptor");
	nas_gate_stats(&g, &st);
	CHECK(&cnt, st.up && st.outages == 2, "a dead descriptor took the NAS down: up %d, "
	      "outages %llu", st.up, (unsigned long long)st.outages);
	CHECK(&cnt, rename(root, away) == 0, "rename");
	r = nas_call_on_fd(&g, err_fn, &e, NULL);
	CHECK(&cnt, r == -ENOTCONN || r == -EHOSTDOWN, "ENOTCONN, or down already: %d", r);
	wait_up(&g, 0);
	CHECK(&cnt, !nas_gate_up(&g), "ENOTCONN on a descriptor, the root unreachable: down");
	CHECK(&cnt, rename(away, root) == 0, "rename back");
	wait_up(&g, 1);

	/* EIO on one file: the root answers, so it stays up; EIO with the root
	 * gone: the probe confirms it, down */
	e = EIO;
	CHECK(&cnt, nas_call(&g, err_fn, &e, NULL) == -EIO, "EIO passed through");
	CHECK(&cnt, rename(root, away) == 0, "rename");
	/* (the look the first EIO asked for may find the root gone already:
	 * then this call is refused, the NAS down) */
	r = nas_call(&g, err_fn, &e, NULL);
	CHECK(&cnt, r == -EIO || r == -EHOSTDOWN, "EIO passed through, or down already: %d", r);
	wait_up(&g, 0);
	CHECK(&cnt, !nas_gate_up(&g), "EIO with the root unreachable: down");
	CHECK(&cnt, rename(away, root) == 0, "rename back");
	wait_up(&g, 1);

	/* every thread stuck: calls fail at once, nothing queues behind them */
	h.open = 0;
	for (int i = 0; i < NAS_GATE_THREADS; i++) {
		wait_up(&g, 1);
		r = nas_call(&g, hang_fn, &h, hang_release);
		CHECK(&cnt, r == -ETIMEDOUT, "stuck %d: %d", i, r);
	}
	nas_gate_stats(&g, &st);
	CHECK(&cnt, st.stuck == NAS_GATE_THREADS, "stuck %u", st.stuck);
	t0 = ms_now();
	r = nas_call(&g, ok_fn, &n, NULL);
	CHECK(&cnt, r == -EHOSTDOWN, "all stuck: %d", r);
	CHECK(&cnt, ms_now() - t0 < 1000, "at once: %lld ms", (long long)(ms_now() - t0));
	wait_released(&h, 1 + NAS_GATE_THREADS);
	wait_up(&g, 1);
	CHECK(&cnt, nas_call(&g, ok_fn, &n, NULL) == 0, "runs again once they ended");

	/* a burst of calls on a slow NAS that answers within the deadline:
	 * each gets a thread (up to NAS_GATE_THREADS) and none times out.  A
	 * fresh gate, its deadline ample: one warm-up call leaves one idle
	 * thread, the first burst leaves eight. */
	{
		struct nas_gate b;
		int bad = 0, m = 0;

		CHECK(&cnt, nas_gate_init(&b, root, 5000, NULL, NULL) == 0, "init");
		CHECK(&cnt, nas_call(&b, ok_fn, &m, NULL) == 0 && m == 1, "warm-up");
		for (int round = 0; round < 10 && !bad; round++)
			bad = one_burst(&b, round % 2 ? NAS_GATE_THREADS : 8);
		CHECK(&cnt, bad == 0, "%d calls of a burst failed", bad);
		nas_gate_stats(&b, &st);
		CHECK(&cnt, st.up && st.timeouts == 0, "up %d, timeouts %llu", st.up,
		      (unsigned long long)st.timeouts);
		nas_gate_destroy(&b);
	}

	/* NAS_HUB empty where a file was expected (ENOMEDIUM, nas_root_gone:
	 * the NAS not mounted, its mount point seen): down, and the prober,
	 * whose stat of the empty root succeeds, keeps it down until the root
	 * holds an entry */
	{
		char entry[96];
		uint64_t gen;

		CHECK(&cnt, nas_root_gone(root) == 1, "an empty root is gone");
		CHECK(&cnt, nas_root_gone(away) == 1, "a missing root is gone");
		e = ENOMEDIUM;
		CHECK(&cnt, nas_call(&g, err_fn, &e, NULL) == -ENOMEDIUM, "ENOMEDIUM passed through");
		CHECK(&cnt, !nas_gate_up(&g), "down after ENOMEDIUM");
		nas_gate_stats(&g, &st);
		CHECK(&cnt, strstr(st.reason, "empty or missing") != NULL, "reason: %s", st.reason);
		gen = atomic_load(&g.generation);
		/* the prober looks at 100, 200 and 400 ms meanwhile */
		CHECK(&cnt, nas_gate_wait_change(&g, gen, 800) == gen && !nas_gate_up(&g),
		      "an empty NAS_HUB brought the NAS up");
		snprintf(entry, sizeof(entry), "%s/models--a--b", root);
		CHECK(&cnt, mkdir(entry, 0755) == 0, "mkdir");
		CHECK(&cnt, nas_root_gone(root) == 0, "a root with an entry is not gone");
		wait_up(&g, 1);
		CHECK(&cnt, nas_gate_up(&g), "up once NAS_HUB holds an entry");
		rmdir(entry);
	}

	test_closer();
	test_progress(root);
	test_busy(root);
	test_busy_listings(root);

	/* no gate: the call runs on the caller */
	CHECK(&cnt, nas_call(NULL, ok_fn, &n, NULL) == 0, "no gate");

	nas_gate_destroy(&g);
	rmdir(root);
	printf("test_gate: %d passed, %d failed\n", cnt.passed, cnt.failed);
	return cnt.failed ? 1 : 0;
}
