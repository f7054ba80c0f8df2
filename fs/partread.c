/* partread.c - reads of files with local ranges; see partread.h. */
#include "partread.h"
#include "nas.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 4096

/* Bytes [@off, @off + @len) of the partial copy into @dst, through an
 * aligned buffer when it is read O_DIRECT. */
static int read_local(const struct part_src *src, char *dst, uint64_t off, size_t len)
{
	uint64_t aoff = off & ~(uint64_t)(ALIGN - 1);
	size_t alen = ((size_t)(off - aoff) + len + ALIGN - 1) & ~(size_t)(ALIGN - 1);
	size_t got = 0;
	char *buf;

	if (posix_memalign((void **)&buf, ALIGN, alen))
		return -ENOMEM;
	while (got < alen) {
		ssize_t n = pread(src->local_fd, buf + got, alen - got, (off_t)(aoff + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (!src->local_direct) /* the FUSE inode's cache is the one copy */
		posix_fadvise(src->local_fd, (off_t)aoff, (off_t)alen, POSIX_FADV_DONTNEED);
	if (got < (size_t)(off - aoff) + len) {
		free(buf);
		return -EUCLEAN; /* a listed range is always there: the copy is bad */
	}
	memcpy(dst, buf + (off - aoff), len);
	free(buf);
	return 0;
}

/* Bytes [@off, @off + @len) of the NAS file into @dst (zeros past its end:
 * the caller cut @len at the size the file had). */
static int read_nas(struct wfs *w, const struct part_src *src, char *dst, uint64_t off, size_t len)
{
	uint64_t aoff = off & ~(uint64_t)(ALIGN - 1);
	size_t alen = ((size_t)(off - aoff) + len + ALIGN - 1) & ~(size_t)(ALIGN - 1);
	void *buf = NULL;
	ssize_t n;

	if (src->nas_fd < 0)
		return -EIO;
	n = nas_pread(w, src->nas_fd, alen, (off_t)aoff, !src->nas_direct, &buf);
	if (n < 0)
		return NAS_CANNOT_ANSWER((int)n) ? -EIO : (int)n;
	if ((size_t)n < (size_t)(off - aoff) + len) {
		free(buf);
		return -EIO; /* shorter than when it was copied: changed under us */
	}
	memcpy(dst, (char *)buf + (off - aoff), len);
	free(buf);
	return 0;
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
