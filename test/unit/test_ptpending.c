/* test_ptpending.c - fs/passthrough.c's list of OPENs in flight.
 *
 * Each OPEN read and not yet answered must be in the list, or its reply
 * goes out unedited (daemon-served) while the open chose passthrough, and
 * the kernel fails the open(2) with EIO.  The rings add two entries a
 * possible CPU to the -o max_threads workers, so on a large machine more
 * OPENs are in flight than PT_MAX_PENDING: every one must still be
 * recorded; and when the list cannot grow (no memory), passthrough is
 * refused before that OPEN is handled, so that it and every later open are
 * daemon-served.  Linked with --wrap=realloc; the uring functions
 * passthrough.c calls are stubs (no ring here).
 */
#include "check.h"
#include "fuse_abi.h"
#include "passthrough.h"
#include "uring.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define OP_OPEN 14

void *__real_realloc(void *p, size_t n);
static int realloc_fails;

void *__wrap_realloc(void *p, size_t n)
{
	if (realloc_fails) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, n);
}

int uring_prepare(struct fuse_uring *u, size_t payload)
{
	(void)u;
	(void)payload;
	return -ENOSYS;
}

ssize_t uring_take_reply(struct fuse_uring *u, const struct iovec *iov, int count)
{
	(void)u;
	(void)iov;
	(void)count;
	return -ENOENT;
}

static void note_open(struct passthrough *pt, uint64_t unique)
{
	struct in_header h = { .len = sizeof(h) + 8, .opcode = OP_OPEN, .unique = unique };
	char req[sizeof(h) + 8] = { 0 };

	memcpy(req, &h, sizeof(h));
	passthrough_note_request(pt, req, sizeof(req));
}

static int recorded(const struct passthrough *pt, uint64_t unique)
{
	for (size_t i = 0; i < pt->npending; i++)
		if (pt->pending[i] == unique)
			return 1;
	return 0;
}

int main(void)
{
	static struct passthrough pt;
	struct check_count c = { 0 };
	size_t n = 3 * PT_MAX_PENDING, missing = 0;

	pthread_mutex_init(&pt.lock, NULL);
	pt.negotiated = 1;
	for (size_t i = 0; i < n; i++)
		note_open(&pt, 2 * i + 2);
	for (size_t i = 0; i < n; i++)
		missing += !recorded(&pt, 2 * i + 2);
	CHECK(&c, pt.npending == n && !missing, "%zu OPENs in flight (more than %d): %zu "
	      "recorded, %zu missing", n, PT_MAX_PENDING, pt.npending, missing);
	CHECK(&c, passthrough_usable(&pt), "passthrough still usable");

	/* the list full, and no memory to grow it */
	while (pt.npending < pt.pending_cap)
		note_open(&pt, 2 * n + 2 * pt.npending + 2);
	realloc_fails = 1;
	note_open(&pt, 1);
	realloc_fails = 0;
	CHECK(&c, !passthrough_usable(&pt), "an OPEN the list cannot hold: passthrough refused "
	      "before it is handled");
	CHECK(&c, recorded(&pt, 2) && recorded(&pt, 2 * n), "the OPENs recorded before stay");
	passthrough_free(&pt);
	CHECK(&c, pt.npending == 0 && !pt.pending, "freed");
	printf("ptpending: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
