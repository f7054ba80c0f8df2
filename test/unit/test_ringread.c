/* test_ringread.c - core/ringread.c: a read made on the calling thread's
 * own io_uring, waited for with a deadline.  A file gives its bytes; the
 * read end of an empty pipe plays a hung NAS (the read waits in the kernel,
 * as a read of a frozen NFS server does): the caller is back at the
 * deadline, the read is left running, a thread holds at most
 * RINGREAD_MAX_LEFT of them, and once the pipe has bytes the ones left end
 * and are freed.  A thread that ends with reads left hands them over; under
 * ASan, a buffer lost on the way is a leak report.  The same read on a
 * ring of the caller's (fs/uring.c's), tagged, is reaped by its tag. */
#include "check.h"
#include "clock.h"
#include "ringread.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct check_count cnt;

static void other_none(void *arg, uint64_t ud, int res)
{
	(void)arg;
	CHECK(&cnt, 0, "an unexpected completion: %llu, %d", (unsigned long long)ud, res);
}

struct fixture {
	struct ringread *rr;
	const char *path;
	const unsigned char *want;
	int pipe_rd, pipe_wr;
};

/* On a thread of its own, as a FUSE worker: the calls, then the thread
 * ends with RINGREAD_MAX_LEFT - 1 reads left running. */
static void *exercise(void *arg)
{
	struct fixture *f = arg;
	struct ringread *rr = f->rr;
	const unsigned char *want = f->want;
	void *buf = NULL;
	ssize_t got;
	int64_t t0;
	int fd;

	CHECK(&cnt, ringread_ready(rr) == 1, "ready");
	/* a file's bytes, a short read at its end, a read past it */
	fd = open(f->path, O_RDONLY);
	got = ringread_pread(rr, fd, 8192, 4096, 1000, &buf);
	CHECK(&cnt, got == 8192 && !memcmp(buf, want + 4096, 8192), "middle: %zd", got);
	CHECK(&cnt, ((uintptr_t)buf & 4095) == 0, "buffer aligned for O_DIRECT");
	free(buf);
	got = ringread_pread(rr, fd, 8192, 3 * 4096, 1000, &buf);
	CHECK(&cnt, got == 100 && !memcmp(buf, want + 3 * 4096, 100), "tail: %zd", got);
	free(buf);
	got = ringread_pread(rr, fd, 4096, 1 << 20, 1000, &buf);
	CHECK(&cnt, got == 0, "past the end: %zd", got);
	free(buf);
	close(fd);
	got = ringread_pread(rr, fd, 4096, 0, 1000, &buf);
	CHECK(&cnt, got == -EBADF, "closed descriptor: %zd", got);

	/* a read that does not end: back at the deadline, left running;
	 * RINGREAD_MAX_LEFT of them, then refused at once */
	for (int i = 0; i < RINGREAD_MAX_LEFT; i++) {
		t0 = mono_ms();
		got = ringread_pread(rr, f->pipe_rd, 4096, -1, 50, &buf);
		CHECK(&cnt, got == -ETIMEDOUT, "hung read %d: %zd", i, got);
		CHECK(&cnt, mono_ms() - t0 >= 45 && mono_ms() - t0 < 5000,
		      "hung read %d back after %lld ms", i, (long long)(mono_ms() - t0));
	}
	t0 = mono_ms();
	got = ringread_pread(rr, f->pipe_rd, 4096, -1, 50, &buf);
	CHECK(&cnt, got == -EHOSTDOWN && mono_ms() - t0 < 40,
	      "with %d reads left, refused at once: %zd after %lld ms", RINGREAD_MAX_LEFT, got,
	      (long long)(mono_ms() - t0));

	/* the pipe answers one of them: it ends and is freed, and the thread
	 * may read again */
	CHECK(&cnt, write(f->pipe_wr, "abcdefgh", 8) == 8, "write");
	fd = open(f->path, O_RDONLY);
	got = ringread_pread(rr, fd, 4096, 0, 1000, &buf);
	CHECK(&cnt, got == 4096 && !memcmp(buf, want, 4096),
	      "a read once a read left ended: %zd", got);
	free(buf);
	close(fd);
	return NULL;
}

/* The read on a ring of the caller's, as fs/uring.c's FUSE ring threads
 * make it: 128-byte entries, other completions on the ring, a tag in the
 * user_data.  A hung read is left on the caller's list; its completion,
 * seen by the caller, is known by its tagged user_data and frees it. */
static void tagged_ring(struct fixture *f)
{
	struct ringread_lefts left = { 0 };
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	void *buf = NULL;
	ssize_t got;
	int fd, r;

	if ((r = io_uring_queue_init(4, &ring, IORING_SETUP_SQE128)) < 0) {
		CHECK(&cnt, 0, "a ring of 128-byte entries: %s", strerror(-r));
		return;
	}
	fd = open(f->path, O_RDONLY);
	got = ringread_read_on(&ring, &left, 1, fd, 4096, 4096, mono_ms() + 1000,
			       other_none, NULL, &buf);
	CHECK(&cnt, got == 4096 && !memcmp(buf, f->want + 4096, 4096), "tagged read: %zd", got);
	free(buf);
	close(fd);
	got = ringread_read_on(&ring, &left, 1, f->pipe_rd, 4096, -1, mono_ms() + 50,
			       other_none, NULL, &buf);
	CHECK(&cnt, got == -ETIMEDOUT && left.n == 1, "tagged hung read left: %zd, %u",
	      got, left.n);
	CHECK(&cnt, write(f->pipe_wr, "x", 1) == 1, "write");
	r = io_uring_wait_cqe(&ring, &cqe);
	CHECK(&cnt, r == 0 && (cqe->user_data & 1), "its completion carries the tag");
	if (r == 0) {
		uint64_t ud = cqe->user_data;

		io_uring_cqe_seen(&ring, cqe);
		CHECK(&cnt, ringread_reap(&left, ud + 64, 1) == 0 && left.n == 1,
		      "another user_data is not it");
		CHECK(&cnt, left.n == 1 && ringread_reap(&left, ud, 1) == 1 && left.n == 0 &&
			     !left.head, "reaped by its tagged user_data");
	}
	io_uring_queue_exit(&ring);
}

/* A thread whose ring cannot be made (here: no descriptor left for it;
 * elsewhere io_uring disabled) is told so at once, every time. */
/* Two rings of two threads with no order between them but the kernel's:
 * the second is made once the first is ended (told by a relaxed atomic,
 * which ThreadSanitizer takes for no order), most likely where the first
 * was, and of another shape (so that one's SQE array may lie where the
 * other's ring header was).  Each reads and writes back every word of its
 * ring's memory outside liburing.h.  In the TSan build this test fails (a
 * race reported) unless ringread_check and ringread_end tell TSan the
 * order of the unmap and the map, and unless ringread_check reads nothing
 * of a ring before it has; elsewhere it checks the two rings work. */
struct reuse {
	atomic_int first_ended;
	void *addr[2];
	int ok[2];
};

static int nop_on(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct io_uring_cqe *cqe = NULL;
	int ok;

	if (!sqe)
		return 0;
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, 42);
	if (io_uring_submit_and_wait(ring, 1) < 0 || io_uring_peek_cqe(ring, &cqe) < 0 || !cqe)
		return 0;
	ok = cqe->user_data == 42 && cqe->res == 0;
	io_uring_cqe_seen(ring, cqe);
	return ok;
}

/* Every word of @ring's memory read and written back (an idle ring: the
 * same values, nothing the kernel looks at changes). */
static void touch_all(struct io_uring *ring)
{
	size_t sqe = ring->flags & IORING_SETUP_SQE128 ? 128 : 64;
	const struct { void *p; size_t len; } part[] = {
		{ ring->sq.ring_ptr, ring->sq.ring_sz },
		{ ring->cq.ring_ptr, ring->cq.ring_sz },
		{ ring->sq.sqes, (size_t)ring->sq.ring_entries * sqe },
	};

	for (size_t i = 0; i < sizeof(part) / sizeof(part[0]); i++) {
		volatile unsigned *w = part[i].p;

		for (size_t k = 0; w && k < part[i].len / sizeof(*w); k++)
			w[k] = w[k];
	}
}

static void reuse_one(struct reuse *x, int i)
{
	struct io_uring ring;

	if (ringread_make(&ring, i ? 4 : 16, i ? 0 : IORING_SETUP_SQE128) < 0)
		return;
	x->ok[i] = nop_on(&ring);
	touch_all(&ring);
	x->addr[i] = ring.sq.ring_ptr;
	ringread_end(&ring);
}

static void *reuse_first(void *arg)
{
	struct reuse *x = arg;

	reuse_one(x, 0);
	atomic_store_explicit(&x->first_ended, 1, memory_order_relaxed);
	return NULL;
}

static void *reuse_second(void *arg)
{
	struct reuse *x = arg;

	while (!atomic_load_explicit(&x->first_ended, memory_order_relaxed))
		sched_yield();
	reuse_one(x, 1);
	return NULL;
}

static void ring_reuse(void)
{
	struct reuse x = { 0 };
	pthread_t a, b;

	if (pthread_create(&b, NULL, reuse_second, &x))
		return;
	if (pthread_create(&a, NULL, reuse_first, &x)) {
		atomic_store(&x.first_ended, 1);
		pthread_join(b, NULL);
		return;
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	CHECK(&cnt, x.ok[0] && x.ok[1], "two rings, one after the other: %d %d", x.ok[0], x.ok[1]);
	if (x.addr[0] != x.addr[1])
		printf("ring_reuse: the second ring is not where the first was (%p, %p): "
		       "nothing shown to TSan\n", x.addr[0], x.addr[1]);
}

static void *no_ring(void *arg)
{
	struct fixture *f = arg;
	void *buf = NULL;

	CHECK(&cnt, ringread_ready(f->rr) == 0, "ready without a ring");
	CHECK(&cnt, ringread_pread(f->rr, f->pipe_rd, 4096, -1, 50, &buf) == -ENOTSUP,
	      "a read without a ring");
	return NULL;
}

/* Run @fn on a thread of its own, with every descriptor taken. */
static void run_without_fds(void *(*fn)(void *), struct fixture *f)
{
	struct rlimit was, low;
	int fds[64], n = 0, r;
	pthread_t th;

	getrlimit(RLIMIT_NOFILE, &was);
	low = (struct rlimit){ .rlim_cur = 64, .rlim_max = was.rlim_max };
	setrlimit(RLIMIT_NOFILE, &low);
	while (n < 64 && (fds[n] = open("/dev/null", O_RDONLY)) >= 0)
		n++;
	r = pthread_create(&th, NULL, fn, f);
	if (r == 0)
		pthread_join(th, NULL);
	while (n > 0)
		close(fds[--n]);
	setrlimit(RLIMIT_NOFILE, &was);
	CHECK(&cnt, r == 0, "thread: %s", strerror(r));
}

/* Under `confine --no-io-uring-enter` (io_uring_enter refused, rings still made):
 * no ring is taken for one that works. */
static int refused(void)
{
	struct ringread rr;
	int r = ringread_probe();
	pthread_t th;
	struct fixture f = { .rr = &rr, .pipe_rd = -1 };

	CHECK(&cnt, r == -EPERM, "probe with io_uring_enter refused: %s", strerror(-r));
	CHECK(&cnt, ringread_init(&rr) == 0, "init");
	r = pthread_create(&th, NULL, no_ring, &f);
	if (r == 0)
		pthread_join(th, NULL);
	ringread_fini(&rr);
	printf("%d passed, %d failed\n", cnt.passed, cnt.failed);
	return cnt.failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/wfs-ringread-XXXXXX", path[64];
	unsigned char want[3 * 4096 + 100];
	struct ringread rr;
	struct fixture f;
	pthread_t th;
	int pipefd[2], r;

	alarm(60);
	if (argc > 1 && !strcmp(argv[1], "--refused"))
		return refused();
	check_tmpdir(dir);
	snprintf(path, sizeof(path), "%s/blob", dir);
	for (size_t i = 0; i < sizeof(want); i++)
		want[i] = (unsigned char)(i * 7 + 3);
	check_write_file(path, want, sizeof(want));
	if (pipe(pipefd) < 0)
		return 2;
	CHECK(&cnt, ringread_init(&rr) == 0, "init");
	f = (struct fixture){ .rr = &rr, .path = path, .want = want,
			      .pipe_rd = pipefd[0], .pipe_wr = pipefd[1] };
	r = pthread_create(&th, NULL, exercise, &f);
	if (r == 0)
		pthread_join(th, NULL); /* before main counts a check again */
	CHECK(&cnt, r == 0, "thread: %s", strerror(r));
	run_without_fds(no_ring, &f);
	tagged_ring(&f);
	ring_reuse();
	/* it ended with reads left: handed over, freed by fini (ASan: a
	 * buffer lost on the way is a leak) */
	pthread_mutex_lock(&rr.lock);
	CHECK(&cnt, rr.orphans.n == RINGREAD_MAX_LEFT - 1 && rr.orphans.head,
	      "the ended thread's %d reads handed over: %u", RINGREAD_MAX_LEFT - 1, rr.orphans.n);
	pthread_mutex_unlock(&rr.lock);
	ringread_fini(&rr);
	close(pipefd[0]);
	close(pipefd[1]);
	check_rmtree(dir);
	printf("%d passed, %d failed\n", cnt.passed, cnt.failed);
	return cnt.failed ? 1 : 0;
}
