/* ranges.c - the `eio` and `cut` ranges of faultfs's source files: what a
 * read meets, what a write remaps (faultfs.h). */
#include "faultfs.h"

#include <pthread.h>

/* Does a read of [off, off+size) of (dev, ino) overlap an eio range? */
int eio_hit(dev_t dev, ino_t ino, uint64_t off, uint64_t size)
{
	int hit = 0;

	pthread_mutex_lock(&g.lock);
	g.reads++;
	for (unsigned i = 0; i < g.n_eio && !hit; i++) {
		const struct eio_range *e = &g.eio[i];

		hit = !e->cut && e->dev == dev && e->ino == ino && off < e->off + e->len &&
		      e->off < off + size;
	}
	pthread_mutex_unlock(&g.lock);
	return hit;
}

/* g.lock held: the part of eio range @e that [off, end) did not write is
 * what stays bad.  0; 1 when none is left (the caller drops @e); -1 when
 * the write fell inside it and there is no slot for its second piece (it
 * stays whole, as a disk out of spare sectors keeps its bad one). */
static int eio_trim(struct eio_range *e, uint64_t off, uint64_t end)
{
	uint64_t e_end = e->off + e->len;

	if (off > e->off && end < e_end) {
		if (g.n_eio == MAX_EIO)
			return -1;
		g.eio[g.n_eio++] = (struct eio_range){ e->dev, e->ino, end, e_end - end, 0 };
		e->len = off - e->off;
	} else if (off > e->off) {
		e->len = off - e->off;
	} else if (end < e_end) {
		e->off = end;
		e->len = e_end - end;
	} else {
		return 1;
	}
	return 0;
}

void eio_written(dev_t dev, ino_t ino, uint64_t off, uint64_t len)
{
	uint64_t end = off + len;

	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.n_eio; i++) {
		struct eio_range *e = &g.eio[i];

		if (e->cut || e->dev != dev || e->ino != ino || end <= e->off ||
		    e->off + e->len <= off)
			continue;
		/* (a second piece goes last: it starts at end, never hit again) */
		if (eio_trim(e, off, end) == 1)
			g.eio[i--] = g.eio[--g.n_eio];
	}
	pthread_mutex_unlock(&g.lock);
}

/* @size, or less when a cut of (dev, ino) lies inside [off, off+size):
 * the cut is then used up (the read after it, from anywhere, is whole). */
size_t cut_size(dev_t dev, ino_t ino, uint64_t off, size_t size)
{
	pthread_mutex_lock(&g.lock);
	for (unsigned i = 0; i < g.n_eio; i++) {
		const struct eio_range *e = &g.eio[i];

		if (e->cut && e->dev == dev && e->ino == ino && off < e->off &&
		    e->off < off + size) {
			size = (size_t)(e->off - off);
			g.eio[i--] = g.eio[--g.n_eio];
		}
	}
	pthread_mutex_unlock(&g.lock);
	return size;
}
