/* test_inval.c - fs/inval.c without FUSE: the notifications are probes
 * that count, and that can be stalled to play a kernel invalidation
 * waiting on a page.  A push that blocks would hang this program: an
 * alarm turns that into a failure. */
#include "check.h"
#include "inval.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SEEN 4096

struct probe {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int gate_open;            /* notify returns only once this is set */
	int in_notify;            /* a notify call is waiting at the gate */
	pthread_mutex_t *needs;   /* notify takes this lock too (the store's) */
	uint64_t seen[MAX_SEEN];  /* notified inodes, in order */
	size_t nseen;
	unsigned all;             /* notify_all calls */
};

static void probe_notify(void *arg, uint64_t ino)
{
	struct probe *p = arg;

	pthread_mutex_lock(&p->lock);
	if (p->nseen < MAX_SEEN)
		p->seen[p->nseen++] = ino;
	p->in_notify = 1;
	pthread_cond_broadcast(&p->cond);
	while (!p->gate_open)
		pthread_cond_wait(&p->cond, &p->lock);
	p->in_notify = 0;
	pthread_mutex_unlock(&p->lock);
	if (p->needs) {
		pthread_mutex_lock(p->needs);
		pthread_mutex_unlock(p->needs);
	}
}

static void probe_notify_all(void *arg)
{
	struct probe *p = arg;

	pthread_mutex_lock(&p->lock);
	p->all++;
	pthread_mutex_unlock(&p->lock);
}

static void probe_init(struct probe *p, int gate_open)
{
	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->gate_open = gate_open;
}

static void probe_set_gate(struct probe *p, int open)
{
	pthread_mutex_lock(&p->lock);
	p->gate_open = open;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/* Wait (at most 10 s) until the consumer is stalled at the gate. */
static int probe_wait_stalled(struct probe *p)
{
	struct timespec until;
	int e = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&p->lock);
	while (!p->in_notify && e != ETIMEDOUT)
		e = pthread_cond_timedwait(&p->cond, &p->lock, &until);
	e = p->in_notify;
	pthread_mutex_unlock(&p->lock);
	return e;
}

static void on_alarm(int sig)
{
	static const char msg[] = "test_inval: FAIL: hung (a push blocked, or the thread "
				  "never stopped)\n";

	(void)sig;
	if (write(2, msg, sizeof(msg) - 1) < 0)
		_exit(1);
	_exit(1);
}

static void start_queue(struct check_count *c, struct inval_queue *q, size_t cap, struct probe *p)
{
	struct inval_hooks h = { .arg = p, .notify = probe_notify,
				 .notify_all = probe_notify_all };

	CHECK(c, inval_init(q, cap, &h) == 0, "init");
	CHECK(c, inval_start(q) == 0, "start");
}

/* Pushed in order, notified in order, each once. */
static void test_in_order(struct check_count *c)
{
	struct inval_queue q;
	struct inval_stats st;
	struct probe p;

	probe_init(&p, 1);
	start_queue(c, &q, 8, &p);
	for (uint64_t i = 1; i <= 5; i++)
		inval_push(&q, i);
	inval_push(&q, 0); /* no inode: ignored */
	CHECK(c, inval_wait_idle(&q, 10000) == 0, "idle after 5 pushes");
	CHECK(c, p.nseen == 5 && p.seen[0] == 1 && p.seen[4] == 5, "5 notified in order: %zu",
	      p.nseen);
	CHECK(c, p.all == 0, "no sweep without overflow");
	inval_get_stats(&q, &st);
	CHECK(c, st.queued == 5 && st.notified == 5 && st.pending == 0 && st.coalesced == 0,
	      "stats: queued %llu notified %llu", (unsigned long long)st.queued,
	      (unsigned long long)st.notified);
	inval_stop(&q);
	inval_destroy(&q);
}

/* The consumer stalls in a notify; more than the capacity is pushed: no
 * push waits, duplicates are kept once, the excess coalesces into one
 * sweep, and the queued inodes are dropped in its favour. */
static void test_full_queue_coalesces(struct check_count *c)
{
	struct inval_queue q;
	struct inval_stats st;
	struct probe p;

	probe_init(&p, 0);
	start_queue(c, &q, 8, &p);
	inval_push(&q, 1000);
	CHECK(c, probe_wait_stalled(&p), "the consumer took inode 1000 and stalls");

	for (uint64_t i = 1; i <= 8; i++)
		inval_push(&q, i);
	inval_push(&q, 3); /* already queued */
	inval_get_stats(&q, &st);
	CHECK(c, st.pending == 8 && st.deduped == 1, "8 queued, 1 deduped: %zu, %llu", st.pending,
	      (unsigned long long)st.deduped);
	for (uint64_t i = 9; i <= 3000; i++)
		inval_push(&q, i);
	/* every push returned with the consumer stalled (a blocked one would
	 * hang here until the alarm) */
	inval_get_stats(&q, &st);
	CHECK(c, st.pending == 8 && st.coalesced == 2992, "full at 8; 2992 coalesced: %zu, %llu",
	      st.pending, (unsigned long long)st.coalesced);
	CHECK(c, inval_wait_idle(&q, 50) == -ETIMEDOUT, "not idle while stalled");

	probe_set_gate(&p, 1);
	CHECK(c, inval_wait_idle(&q, 10000) == 0, "idle once released");
	CHECK(c, p.all == 1, "one sweep for the overflow: %u", p.all);
	CHECK(c, p.nseen == 1 && p.seen[0] == 1000,
	      "the queued inodes went with the sweep (%zu notified)", p.nseen);

	/* After the sweep the queue works as before. */
	inval_push(&q, 7);
	CHECK(c, inval_wait_idle(&q, 10000) == 0 && p.nseen == 2 && p.seen[1] == 7,
	      "queued again after the sweep");
	inval_stop(&q);
	inval_destroy(&q);
}

/* The deadlock this queue is for: the store pushes while holding its lock,
 * and the kernel's invalidation (the consumer) waits on a reader that needs
 * that lock.  With a blocking pipe, the pushes would stop once it filled. */
static void test_push_under_the_consumers_lock(struct check_count *c)
{
	pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
	struct inval_queue q;
	struct probe p;

	probe_init(&p, 1);
	p.needs = &store_lock;
	start_queue(c, &q, 16, &p);
	pthread_mutex_lock(&store_lock);
	for (uint64_t i = 1; i <= 100000; i++)
		inval_push(&q, i);
	pthread_mutex_unlock(&store_lock);
	CHECK(c, inval_wait_idle(&q, 10000) == 0, "drained once the store lock is free");
	CHECK(c, p.all >= 1, "the overflow was swept: %u", p.all);
	inval_stop(&q);
	inval_destroy(&q);
}

/* Stop drops what is queued (the mount is gone), and later pushes are
 * ignored. */
static void test_stop(struct check_count *c)
{
	struct inval_queue q;
	struct inval_stats st;
	struct probe p;

	probe_init(&p, 0);
	start_queue(c, &q, 8, &p);
	inval_push(&q, 1);
	CHECK(c, probe_wait_stalled(&p), "stalled");
	inval_push(&q, 2);
	inval_push(&q, 3);
	probe_set_gate(&p, 1); /* a notify in progress finishes; the rest is dropped */
	inval_stop(&q);
	inval_push(&q, 4);
	inval_get_stats(&q, &st);
	CHECK(c, st.pending == 0, "nothing queued after stop: %zu", st.pending);
	CHECK(c, p.nseen <= 3 && p.all == 0, "stopped: %zu notified", p.nseen);
	inval_destroy(&q);

	/* A queue that never started stops and frees too. */
	probe_init(&p, 1);
	{
		struct inval_hooks h = { .arg = &p, .notify = probe_notify,
					 .notify_all = probe_notify_all };

		CHECK(c, inval_init(&q, 0, &h) == 0, "init default capacity");
		CHECK(c, q.cap == INVAL_CAPACITY, "default capacity %zu", q.cap);
		inval_push(&q, 5);
		inval_stop(&q);
		inval_destroy(&q);
	}
}

/* The device's descriptor retired at shutdown (fs/main.c: end_device): its
 * file closed at once (here a pipe's write end: the reader sees the end),
 * its number still taken, a write to it EBADF -- never into a file opened
 * since. */
static void test_retire_fd(struct check_count *c)
{
	int p[2], other;
	char byte;

	CHECK(c, pipe(p) == 0, "pipe");
	CHECK(c, inval_retire_fd(p[1], "/dev/null") == 0, "retired");
	CHECK(c, read(p[0], &byte, 1) == 0, "the file it held is closed: end of file for its reader");
	CHECK(c, fcntl(p[1], F_GETFD) == FD_CLOEXEC, "the number is still taken, close-on-exec");
	errno = 0;
	CHECK(c, write(p[1], "x", 1) == -1 && errno == EBADF, "a write to it fails EBADF: %s",
	      strerror(errno));
	other = open("/dev/null", O_WRONLY | O_CLOEXEC);
	CHECK(c, other >= 0 && other != p[1], "an open meanwhile gets another number: %d", other);
	CHECK(c, inval_retire_fd(-1, "/dev/null") == -EBADF, "no descriptor: -EBADF");
	close(other);
	close(p[1]);
	close(p[0]);
	/* the stand-in for a device unmounted already: it polls POLLERR as
	 * that device does, so libfuse does not unmount a second time */
	if (access("/dev/fuse", R_OK) == 0) {
		struct pollfd pf = { .fd = dup(1) };

		CHECK(c, inval_retire_fd(pf.fd, "/dev/fuse") == 0, "retired for /dev/fuse");
		CHECK(c, poll(&pf, 1, 0) == 1 && (pf.revents & POLLERR), "it polls POLLERR: %#x",
		      (unsigned)pf.revents);
		close(pf.fd);
	}
}

int main(void)
{
	struct check_count c = { 0, 0 };

	signal(SIGALRM, on_alarm);
	alarm(60);
	test_in_order(&c);
	test_full_queue_coalesces(&c);
	test_push_under_the_consumers_lock(&c);
	test_stop(&c);
	test_retire_fd(&c);
	printf("inval: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
