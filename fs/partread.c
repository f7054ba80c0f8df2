/* partread.c - reads of files with local ranges; see partread.h. */
#include "partread.h"
#include "nas.h"
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 4096

/* The aligned span around [@off, @off + @len): its start, its length. */
static uint64_t span_of(uint64_t off, size_t len, size_t *alen)
{
	uint64_t aoff = off & ~(uint64_t)(ALIGN - 1);

	*alen = ((size_t)(off - aoff) + len + ALIGN - 1) & ~(size_t)(ALIGN - 1);
	return aoff;
}

/* What of a span read of @got bytes lies from @off on, at most @len. */
static ssize_t from_off(ssize_t got, size_t skip, size_t len)
{
	size_t have = got > (ssize_t)skip ? (size_t)got - skip : 0;

	return (ssize_t)(have < len ? have : len);
}

ssize_t span_local(int fd, uint64_t off, size_t len, int drop, char **buf, size_t *skip)
{
	size_t alen;
	uint64_t aoff = span_of(off, len, &alen);
	ssize_t got;

	if (posix_memalign((void **)buf, ALIGN, alen))
		return -ENOMEM;
	got = durable_pread_fd(fd, *buf, alen, (off_t)aoff);
	if (drop)
		posix_fadvise(fd, (off_t)aoff, (off_t)alen, POSIX_FADV_DONTNEED);
	if (got < 0) {
		free(*buf);
		return got;
	}
	*skip = (size_t)(off - aoff);
	return from_off(got, *skip, len);
}

ssize_t span_nas(struct wfs *w, int fd, uint64_t off, size_t len, int drop, char **buf,
		 size_t *skip)
{
	size_t alen;
	uint64_t aoff = span_of(off, len, &alen);
	ssize_t got = nas_pread(w, fd, alen, (off_t)aoff, drop, (void **)buf);

	if (got < 0)
		return got;
	*skip = (size_t)(off - aoff);
	return from_off(got, *skip, len);
}

ssize_t span_nas_into(struct wfs *w, int fd, uint64_t off, size_t len, int drop, char *dst)
{
	size_t have = 0;

	while (have < len) {
		char *buf;
		size_t skip;
		ssize_t n = span_nas(w, fd, off + have, len - have, drop, &buf, &skip);

		if (n < 0)
			return n;
		memcpy(dst + have, buf + skip, (size_t)n);
		free(buf); /* (a read of no bytes has its buffer too) */
		if (n == 0)
			break;
		have += (size_t)n;
	}
	return (ssize_t)have;
}

/* Bytes [@off, @off + @len) of the partial copy into @dst. */
static int read_local(const struct part_src *src, char *dst, uint64_t off, size_t len)
{
	char *buf;
	size_t skip;
	ssize_t n = span_local(src->local_fd, off, len, !src->local_direct, &buf, &skip);

	if (n == -ENOMEM)
		return (int)n;
	if (n >= 0) {
		if ((size_t)n == len)
			memcpy(dst, buf + skip, len);
		free(buf);
	}
	/* a listed range is always there: a copy that cannot give it is bad */
	return n == (ssize_t)len ? 0 : -EUCLEAN;
}

/* Bytes [@off, @off + @len) of the NAS file into @dst (the caller cut
 * @len at the size the file had): read on where a read comes back short
 * (span_nas_into), and fewer of them than that means the file is shorter
 * than when it was copied: changed, -EIO. */
static int read_nas(struct wfs *w, const struct part_src *src, char *dst, uint64_t off, size_t len)
{
	ssize_t n;

	if (src->nas_fd < 0)
		return -EIO;
	n = span_nas_into(w, src->nas_fd, off, len, !src->nas_direct, dst);
	if (n < 0)
		return (int)n;
	return (size_t)n == len ? 0 : -EIO;
}

int part_read(struct wfs *w, const struct part_src *src, const struct brange *segs,
	      size_t nseg, char *out, uint64_t off, size_t len)
{
	uint64_t pos = off, end = off + len;
	int r = 0;

	for (size_t i = 0; r == 0 && pos < end; i++) {
		/* the NAS up to the next local part (or the end), then the part */
		uint64_t a = i < nseg ? segs[i].off : end;

		if (a > pos)
			r = read_nas(w, src, out + (pos - off), pos, (size_t)(a - pos));
		if (r == 0 && i < nseg)
			r = read_local(src, out + (a - off), a, (size_t)segs[i].len);
		pos = i < nseg ? a + segs[i].len : end;
	}
	return r;
}
