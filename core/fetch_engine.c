/* fetch_engine.c - the engine of the verified copy: io_uring, or the same
 * operations done synchronously (WFS_FETCH_NO_URING, or no io_uring).
 *
 * Operations are submitted with a user-data word and their results come
 * back, in any order, from eng_next().  Without io_uring each operation runs
 * at submission and its result waits in a small queue, so the pipeline in
 * fetch.c is the same either way.  See fetch_int.h.
 */
#include "fetch_int.h"
#include "ringread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

void eng_init(struct engine *e, uint64_t size)
{
	memset(e, 0, sizeof(*e));
	/* A file under one chunk is one read, one write, one fsync and one
	 * re-read, each waiting on the one before: a ring would add only its
	 * making and unmaking, and a hand-off of the fsync to an io-wq thread
	 * (a promote of 10,000 small files: 25% of the daemon's CPU). */
	if (getenv("WFS_FETCH_NO_URING") || size < CHUNK)
		return;
	if (io_uring_queue_init(MAX_OPS, &e->ring, 0) < 0)
		return;
	/* a ring made may still refuse every submission (a seccomp filter
	 * listing io_uring_enter alone): the copy would fail, not fall back */
	if (ringread_check(&e->ring) < 0) {
		ringread_end(&e->ring);
		return;
	}
	e->uring = 1;
}

/* Register @mem (every slot) as fixed buffer 0: no page pinning and no
 * dirtying per operation.  Needs locked memory (RLIMIT_MEMLOCK or
 * CAP_IPC_LOCK); without it the operations go on with plain buffers. */
void eng_fixed(struct engine *e, void *mem, size_t len)
{
	struct iovec iov = { mem, len };

	if (e->uring)
		e->fixed = io_uring_register_buffers(&e->ring, &iov, 1) == 0;
}

void eng_exit(struct engine *e)
{
	if (e->uring)
		ringread_end(&e->ring);
}

static void eng_push(struct engine *e, uint64_t ud, int res)
{
	e->q[(e->qh + e->qn) % MAX_OPS].ud = ud;
	e->q[(e->qh + e->qn) % MAX_OPS].res = res;
	e->qn++;
}

static struct io_uring_sqe *eng_sqe(struct engine *e, uint64_t ud)
{
	struct io_uring_sqe *sqe;

	e->inflight++;
	if (!e->uring)
		return NULL;
	sqe = io_uring_get_sqe(&e->ring);
	if (!sqe) {
		io_uring_submit(&e->ring);
		sqe = io_uring_get_sqe(&e->ring);
	}
	if (!sqe)
		eng_push(e, ud, -EBUSY);  /* cannot happen: the ring holds MAX_OPS */
	return sqe;
}

void eng_rw(struct engine *e, int write, int fd, void *buf, size_t len,
	    uint64_t off, uint64_t ud)
{
	struct io_uring_sqe *sqe = eng_sqe(e, ud);
	ssize_t r;

	if (sqe) {
		if (write && e->fixed)
			io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)len, off, 0);
		else if (write)
			io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
		else if (e->fixed)
			io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)len, off, 0);
		else
			io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
		io_uring_sqe_set_data64(sqe, ud);
		return;
	}
	if (e->uring)
		return;
	do
		r = write ? pwrite(fd, buf, len, (off_t)off) : pread(fd, buf, len, (off_t)off);
	while (r < 0 && errno == EINTR);
	eng_push(e, ud, r < 0 ? -errno : (int)r);
}

void eng_sync(struct engine *e, int fd, int datasync, uint64_t ud)
{
	struct io_uring_sqe *sqe = eng_sqe(e, ud);

	if (sqe) {
		io_uring_prep_fsync(sqe, fd, datasync ? IORING_FSYNC_DATASYNC : 0);
		io_uring_sqe_set_data64(sqe, ud);
		return;
	}
	if (!e->uring)
		eng_push(e, ud, (datasync ? fdatasync(fd) : fsync(fd)) < 0 ? -errno : 0);
}

/* Read the hasher's eventfd (blocks, without io_uring). */
void eng_wake(struct engine *e, int fd, uint64_t *buf, uint64_t ud)
{
	struct io_uring_sqe *sqe = eng_sqe(e, ud);
	ssize_t r;

	if (sqe) {
		io_uring_prep_read(sqe, fd, buf, sizeof(*buf), 0);
		io_uring_sqe_set_data64(sqe, ud);
		return;
	}
	if (e->uring)
		return;
	do
		r = read(fd, buf, sizeof(*buf));
	while (r < 0 && errno == EINTR);
	eng_push(e, ud, r < 0 ? -errno : (int)r);
}

/* Next completion: 1 when one is returned, 0 when none came (timeout,
 * signal, or nothing to wait for), -errno when the ring itself failed.  With
 * @block, waits (at most @timeout_ns when >= 0). */
int eng_next(struct engine *e, int block, int64_t timeout_ns, uint64_t *ud, int *res)
{
	struct io_uring_cqe *cqe = NULL;
	int r;

	if (e->qn) {
		*ud = e->q[e->qh].ud;
		*res = e->q[e->qh].res;
		e->qh = (e->qh + 1) % MAX_OPS;
		e->qn--;
		e->inflight--;
		return 1;
	}
	if (!e->uring) {
		if (block && timeout_ns > 0)
			nanosleep(&(struct timespec){ timeout_ns / 1000000000LL,
						      timeout_ns % 1000000000LL }, NULL);
		return 0;
	}
	if (!block) {
		r = io_uring_peek_cqe(&e->ring, &cqe);
	} else if (timeout_ns >= 0) {
		struct __kernel_timespec ts = { timeout_ns / 1000000000LL,
						timeout_ns % 1000000000LL };

		r = io_uring_submit_and_wait_timeout(&e->ring, &cqe, 1, &ts, NULL);
	} else {
		r = io_uring_submit_and_wait(&e->ring, 1);
		if (r >= 0)
			r = io_uring_peek_cqe(&e->ring, &cqe);
	}
	if (r == -EAGAIN || r == -ETIME || r == -EINTR || (r >= 0 && !cqe))
		return 0;
	if (r < 0)
		return r;
	*ud = cqe->user_data;
	*res = cqe->res;
	io_uring_cqe_seen(&e->ring, cqe);
	e->inflight--;
	return 1;
}
