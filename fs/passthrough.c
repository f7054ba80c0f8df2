/* passthrough.c - see passthrough.h.  Layouts and constants are those of
 * the kernel's include/uapi/linux/fuse.h (protocol 7.40 and later); the
 * system's header may predate them, so the few we need are spelt here. */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "fuse_abi.h"
#include "passthrough.h"
#include "replyorder.h"
#include "uring.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#define OP_INIT 26
#define OP_OPEN 14
#define INIT_EXT FUSE_ABI_INIT_EXT
#define INIT2_PASSTHROUGH (1u << 5) /* FUSE_PASSTHROUGH is bit 37 */
#define INIT2_OVER_IO_URING FUSE_ABI_INIT2_OVER_IO_URING
#define OPEN_DIRECT_IO (1u << 0)
#define OPEN_KEEP_CACHE (1u << 1)
#define OPEN_PASSTHROUGH (1u << 7)
#define DEV_IOC_BACKING_OPEN 0x4010e501u  /* _IOW(229, 1, struct backing_map) */
#define DEV_IOC_BACKING_CLOSE 0x4004e502u /* _IOW(229, 2, uint32_t) */

struct init_in {
	uint32_t major, minor, max_readahead, flags, flags2;
};

/* fuse_init_out: flags at 12, max_write at 20, max_pages at 28, flags2
 * at 32, max_stack_depth at 36. */
#define INIT_OUT_FLAGS 12
#define INIT_OUT_MAX_WRITE 20
#define INIT_OUT_MAX_PAGES 28
#define INIT_OUT_FLAGS2 32
#define INIT_OUT_STACK_DEPTH 36

struct open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};

struct backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};

#ifdef __SANITIZE_THREAD__
char wfs_reply_order; /* replyorder.h */
#endif

static struct passthrough *PT(void *userdata)
{
	/* The session's userdata is the daemon context, whose first member
	 * is the passthrough state (see struct wfs). */
	return userdata;
}

/* Lock held: the OPEN @unique recorded (the list grown when full).  0 or
 * -ENOMEM. */
static int note_open_locked(struct passthrough *pt, uint64_t unique)
{
	if (pt->npending == pt->pending_cap) {
		size_t cap = pt->pending_cap ? 2 * pt->pending_cap : PT_MAX_PENDING;
		uint64_t *v = realloc(pt->pending, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		pt->pending = v;
		pt->pending_cap = cap;
	}
	pt->pending[pt->npending++] = unique;
	return 0;
}

void passthrough_note_request(void *arg, const void *req, size_t len)
{
	struct passthrough *pt = arg;
	const struct in_header *h = req;

	if (len < sizeof(*h))
		return;
	if (h->opcode == OP_INIT && len >= sizeof(*h) + sizeof(struct init_in)) {
		const struct init_in *in = (const void *)(h + 1);
		int ext = in->flags & INIT_EXT;

		pthread_mutex_lock(&pt->lock);
		pt->init_unique = h->unique;
		pt->offered = ext && (in->flags2 & INIT2_PASSTHROUGH);
		pt->uring_offered = ext && (in->flags2 & INIT2_OVER_IO_URING);
		pthread_mutex_unlock(&pt->lock);
	} else if (h->opcode == OP_OPEN) {
		pthread_mutex_lock(&pt->lock);
		if (note_open_locked(pt, h->unique) < 0)
			/* before the OPEN is handled: it and every later one
			 * are daemon-served, never half passthrough */
			__atomic_store_n(&pt->refused, 1, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&pt->lock);
	}
}

static ssize_t pt_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t n = read(fd, buf, len);

	REQUEST_READ();
	if (n > 0)
		passthrough_note_request(PT(userdata), buf, (size_t)n);
	return n;
}

static int take_pending(struct passthrough *pt, uint64_t unique)
{
	for (size_t i = 0; i < pt->npending; i++) {
		if (pt->pending[i] == unique) {
			pt->pending[i] = pt->pending[--pt->npending];
			return 1;
		}
	}
	return 0;
}

/* The largest request or reply the INIT reply @p allows: what a ring
 * entry's payload buffer must hold (the kernel refuses a smaller one). */
static size_t uring_payload_of(const uint8_t *p)
{
	uint32_t max_write;
	uint16_t max_pages;
	size_t len = 8192;

	memcpy(&max_write, p + INIT_OUT_MAX_WRITE, 4);
	memcpy(&max_pages, p + INIT_OUT_MAX_PAGES, 2);
	if (max_write > len)
		len = max_write;
	if ((size_t)max_pages * 4096 > len)
		len = (size_t)max_pages * 4096;
	return len;
}

static void edit_init(struct passthrough *pt, struct iovec *body)
{
	uint8_t *p = body->iov_base;
	uint32_t flags, flags2, depth = 1;

	if (body->iov_len < INIT_OUT_STACK_DEPTH + 4)
		return;
	memcpy(&flags, p + INIT_OUT_FLAGS, 4);
	if (!(flags & INIT_EXT))
		return;
	memcpy(&flags2, p + INIT_OUT_FLAGS2, 4);
	if (pt->wanted && pt->offered) {
		flags2 |= INIT2_PASSTHROUGH;
		/* 1: our backing files are on an ordinary filesystem.  0 or
		 * more than 2 makes every registration fail. */
		memcpy(p + INIT_OUT_STACK_DEPTH, &depth, 4);
		__atomic_store_n(&pt->negotiated, 1, __ATOMIC_RELEASE);
	}
	if (pt->uring && pt->uring_offered) {
		/* Asked for only when every queue has a ring: from this reply
		 * on the kernel holds each request until every queue has one
		 * registered */
		size_t payload = uring_payload_of(p);
		int r = uring_prepare(pt->uring, payload);

		if (r == 0) {
			flags2 |= INIT2_OVER_IO_URING;
			pt->uring_payload = payload;
		} else {
			pt->uring_error = r;
		}
	}
	memcpy(p + INIT_OUT_FLAGS2, &flags2, 4);
}

static void edit_open(struct passthrough *pt, struct iovec *body)
{
	struct open_out out;
	int id;

	if (body->iov_len < sizeof(out))
		return;
	memcpy(&out, body->iov_base, sizeof(out));
	id = pt->backing_of ? pt->backing_of(out.fh) : 0;
	if (id <= 0)
		return;
	out.open_flags |= OPEN_PASSTHROUGH;
	out.open_flags &= ~(OPEN_KEEP_CACHE | OPEN_DIRECT_IO);
	out.backing_id = id;
	memcpy(body->iov_base, &out, sizeof(out));
}

static ssize_t pt_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct passthrough *pt = PT(userdata);
	const struct out_header *h = iov[0].iov_base;
	ssize_t n;

	if (count >= 2 && iov[0].iov_len >= sizeof(*h)) {
		int is_init, is_open;

		pthread_mutex_lock(&pt->lock);
		is_init = h->unique == pt->init_unique && pt->init_unique;
		is_open = !is_init && take_pending(pt, h->unique);
		if (is_init && h->error == 0)
			edit_init(pt, &iov[1]);
		pthread_mutex_unlock(&pt->lock);
		if (is_open && h->error == 0)
			edit_open(pt, &iov[1]);
		if (is_init) {
			n = writev(fd, iov, count);

			if (n >= 0 && h->error == 0 && pt->init_done)
				pt->init_done(pt->init_done_arg);
			return n;
		}
	} else if (count >= 1 && iov[0].iov_len >= sizeof(*h)) {
		/* An error reply to an OPEN carries no body. */
		pthread_mutex_lock(&pt->lock);
		take_pending(pt, h->unique);
		pthread_mutex_unlock(&pt->lock);
	}
	if (pt->uring && count >= 1 && iov[0].iov_len >= sizeof(*h) &&
	    (n = uring_take_reply(pt->uring, iov, count)) >= 0)
		return n;
	return writev(fd, iov, count);
}

static ssize_t pt_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
			      unsigned int flags, void *userdata)
{
	(void)userdata;
	REPLY_SENT();
	return splice(fdin, offin, fdout, offout, len, flags);
}

int passthrough_install(struct passthrough *pt, struct fuse_session *se, int wanted,
			int (*backing_of)(uint64_t fh))
{
	static const struct fuse_custom_io io = {
		.read = pt_read,
		.writev = pt_writev,
		.splice_send = pt_splice_send,
	};

	pthread_mutex_init(&pt->lock, NULL);
	pt->devfd = fuse_session_fd(se);
	pt->wanted = wanted;
	pt->backing_of = backing_of;
	return fuse_session_custom_io(se, &io, pt->devfd);
}

void passthrough_free(struct passthrough *pt)
{
	free(pt->pending);
	pt->pending = NULL;
	pt->npending = pt->pending_cap = 0;
}

int passthrough_usable(const struct passthrough *pt)
{
	return __atomic_load_n(&pt->negotiated, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&pt->refused, __ATOMIC_ACQUIRE);
}

int passthrough_open_backing(struct passthrough *pt, int fd)
{
	struct backing_map map = { .fd = fd };
	int id = ioctl(pt->devfd, DEV_IOC_BACKING_OPEN, &map);

	if (id < 0) {
		int err = errno;

		if (err == EPERM || err == ENOTTY || err == EINVAL)
			__atomic_store_n(&pt->refused, 1, __ATOMIC_RELEASE);
		return -err;
	}
	return id;
}

void passthrough_close_backing(struct passthrough *pt, int backing_id)
{
	uint32_t id = (uint32_t)backing_id;

	ioctl(pt->devfd, DEV_IOC_BACKING_CLOSE, &id);
}
