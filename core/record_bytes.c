/* record_bytes.c - the bytes the record keeps of small NAS files (refs,
 * markers, file lists), read with the attributes of the file they came
 * from: see record_int.h, record_read_bytes. */
#include "record_int.h"
#include "clock.h"
#include "durable.h"
#include "nasgate.h"
#include "nasopen.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* One read of @n's file whole, at most @max bytes (+1: a longer one is
 * told), into *@buf, its length in *@k, its attributes as read in *@st.
 * 0; 1 when the file changed as it was read (its attributes before and
 * after, or the bytes got and its size, disagree: a client rewriting it in
 * place -- huggingface_hub truncates a refs file and writes it); 3 for a
 * refs file found empty (caught between the two, most likely); 2 when it
 * is not one to keep any more (as record_read_bytes' 1), or -errno. */
static int read_once(const struct hub_roots *roots, struct rnode *n, size_t max, char *buf,
		     ssize_t *k, struct stat *st)
{
	struct stat before;
	int fd = nas_open(roots, n->backing, 0), changed;

	/* Not there: deleted since the walk, or the whole NAS gone from under
	 * the build (unmounted, its empty mount point seen: -ENOMEDIUM, the
	 * build fails).  Taken for deleted, every ref and marker read after
	 * it would be left out of the record, and with the NAS down a reader
	 * could no longer resolve "main". */
	if (fd == -ENOENT || fd == -ENOTDIR)
		fd = nas_missing_or_gone(roots->path[0], 1, fd);
	if (fd < 0)
		return fd == -ENOENT || fd == -ELOOP || fd == -ESTALE || fd == -ENXIO ||
		       fd == -EISDIR || fd == -ENOTDIR || fd == -EACCES || fd == -EXDEV ? 2 : fd;
	if (fstat(fd, &before) < 0 || (*k = durable_read_fd(fd, buf, max + 1)) < 0 ||
	    fstat(fd, st) < 0) {
		int e = -errno;

		close(fd);
		return *k < 0 ? (int)*k : e;
	}
	close(fd);
	changed = !same_file_state(&before, st) || ((size_t)*k <= max && *k != st->st_size);
	return changed ? 1 : *k == 0 && record_is_ref(n->path) ? 3 : 0;
}

int record_read_bytes(const struct hub_roots *roots, struct rnode *n, size_t max)
{
	char *buf = malloc(max + 1), *fit;
	struct stat st;
	ssize_t k = 0;
	int r = 1;

	if (!buf)
		return -ENOMEM;
	for (int tries = 0; (r == 1 || r == 3) && tries < 3; tries++)
		r = read_once(roots, n, max, buf, &k, &st);
	if (r == 3)
		r = 0; /* empty at every read: the NAS's ref as it is */
	if (r || (size_t)k > max) {
		free(buf);
		return r == 1 ? -EAGAIN : r == 2 ? 1 : r ? r : 2;
	}
	fit = realloc(buf, k ? (size_t)k : 1);
	n->data = fit ? fit : buf;
	n->data_len = (size_t)k;
	n->has_data = 1;
	n->st.st_ino = st.st_ino;
	n->st.st_size = (off_t)k; /* what a reader will get */
	n->st.st_mtim = st.st_mtim;
	n->st.st_ctim = st.st_ctim;
	return 0;
}
