/* test_snapshot.c - an index write that runs out of memory anywhere.
 *
 * The index is written from a snapshot of the table whose memory is made
 * before the store's lock is taken (core/store_snapshot.c), then filled
 * under it; what was not made before is made under the lock.  Whichever
 * allocation fails -- one, two in a row (the memory made before the lock,
 * then its stand-in under it), or every one from some point on -- the
 * write must say -ENOMEM and leave the index on disk as it was (an index
 * short of a verified copy's record would have the next start discard
 * that copy), or write it whole; and after a restart every copy is
 * back.  Linked with --wrap=malloc,--wrap=realloc,--wrap=calloc.
 *
 * So must a start that runs out of memory while it reads the index: the
 * table read in part is never written over the index.
 */
#include "check.h"
#include "index.h"
#include "store.h"
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NBLOBS 40

static char top[PATH_MAX];

/* The Nth malloc or realloc of this thread from when alloc_fail_at is set
 * fails with ENOMEM, and the alloc_fail_more after it (-1: all);
 * alloc_fail_at is left at what remains of its count. */
static __thread int alloc_fail_at, alloc_fail_more, alloc_failing;
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static int alloc_fails(void)
{
	if (alloc_failing) {
		alloc_failing -= alloc_failing > 0;
	} else if (!alloc_fail_at || --alloc_fail_at) {
		return 0;
	} else {
		alloc_failing = alloc_fail_more;
	}
	errno = ENOMEM;
	return 1;
}

void *__wrap_malloc(size_t n)
{
	return alloc_fails() ? NULL : __real_malloc(n);
}

void *__wrap_realloc(void *p, size_t n)
{
	return alloc_fails() ? NULL : __real_realloc(p, n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	return alloc_fails() ? NULL : __real_calloc(n, size);
}

static int count_rec(void *arg, const struct index_rec *r)
{
	(*(int *)arg) += !strcmp(r->state, "local");
	return 0;
}

/* The local copies the index on disk names (-1: unreadable). */
static int index_local(struct store *s)
{
	struct index_cb cb = { .blob = count_rec };
	int n = 0;

	cb.arg = &n;
	return index_read(s->index_path, &cb) > 0 ? n : -1;
}

/* Blob @i of the NAS directory: its name, some not UTF-8 (their records
 * are written as _hex), one not named by its content (a mismatch). */
static struct blob *nas_blob(struct store *s, int i)
{
	char p[PATH_MAX + 64], body[32];
	struct stat st;

	snprintf(p, sizeof(p), "%s/nas/file-%02d%s", top, i, i % 7 ? "" : "-\xff\xfe");
	snprintf(body, sizeof(body), "blob %d\n", i);
	if (stat(p, &st) < 0) {
		check_write_file(p, body, strlen(body));
		stat(p, &st);
	}
	snprintf(body, sizeof(body), "id-%d", i);
	return store_blob(s, p, &st, i == 3 ? "0123456789012345678901234567890123456789" : body);
}

static int all_local(struct store *s)
{
	int n = 0;

	for (int i = 0; i < NBLOBS; i++)
		n += i != 3 && store_wait_settled(s, nas_blob(s, i), 30000) == BLOB_LOCAL;
	return n;
}

/* Every allocation of a write failing in turn (@more after it): the
 * writes that failed, and those that left the index otherwise than whole
 * (*@torn); *@done: a write made fewer allocations than the count, and
 * wrote the index.  @room: the strings of the last write said to be that
 * many bytes, so that the room made before the lock runs out at some
 * record (0: as they were). */
static int fail_in_turn(struct store *s, int more, size_t room, int want, int *torn, int *done)
{
	int failed = 0, r;

	*done = 0;
	for (int k = 1; k < 1000 && !*done; k++) {
		if (room)
			s->index_snap_bytes = room;
		alloc_fail_at = k;
		alloc_fail_more = more;
		r = store_write_index(s);
		*done = r == 0 && alloc_fail_at > 0;
		alloc_fail_at = alloc_fail_more = alloc_failing = 0;
		failed += r == -ENOMEM;
		*torn += (r != 0 && r != -ENOMEM) || index_local(s) != want;
	}
	return failed;
}

/* A start that runs out of memory at each allocation of its load in turn
 * (and at every one after it: the index then read in part), closed as the
 * daemon closes it: it writes no index, and the next start has every copy
 * and every file of data/.  The opens that failed; *@lost: those after
 * which a copy was gone. */
static int open_fails_in_turn(const char *local, const struct store_opts *opt, int want,
			      int *lost)
{
	char data[PATH_MAX + 16];
	int failed = 0, files, r, done = 0;
	struct store s;

	snprintf(data, sizeof(data), "%s/data", local);
	files = check_count_files(data);
	for (int k = 1; k < 5000 && !done; k++) {
		alloc_fail_at = k;
		alloc_fail_more = -1;
		r = store_open(&s, local, opt, NULL);
		done = r == 0 && alloc_fail_at > 0;
		alloc_fail_at = alloc_fail_more = alloc_failing = 0;
		failed += r == -ENOMEM;
		store_close(&s);
		if (store_open(&s, local, opt, NULL) != 0 || all_local(&s) != want ||
		    check_count_files(data) != files)
			++*lost;
		store_close(&s);
	}
	return done ? failed : -1;
}

int main(void)
{
	struct check_count c = { 0 };
	struct store_opts opt = { .workers = 2 };
	struct store s;
	char local[PATH_MAX + 16], nas[PATH_MAX + 16];
	int want = NBLOBS - 1, torn = 0, done, failed[3], tiny;

	snprintf(top, sizeof(top), "/var/tmp/wfs-snapshot-XXXXXX");
	check_tmpdir(top);
	snprintf(nas, sizeof(nas), "%s/nas", top);
	snprintf(local, sizeof(local), "%s/local", top);
	mkdir(nas, 0755);
	mkdir(local, 0755);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0 && store_start(&s) == 0, "open");
	for (int i = 0; i < NBLOBS; i++)
		store_promote(&s, nas_blob(&s, i), i % 5 == 0, 1);
	CHECK(&c, all_local(&s) == want, "%d blobs local", want);
	CHECK(&c, store_sync(&s) == 0 && index_local(&s) == want, "the index names them: %d",
	      index_local(&s));
	for (int more = -1; more < 2; more++)
		failed[more + 1] = fail_in_turn(&s, more, 0, want, &torn, &done);
	/* the room made before running out at each field of some record in
	 * turn (a record's strings take ~150 bytes) */
	tiny = 0;
	for (size_t room = 1; room < 200; room += 3)
		tiny += fail_in_turn(&s, 1, room, want, &torn, &done);
	CHECK(&c, !torn, "no write failing at an allocation left the index otherwise than "
	      "whole: %d did", torn);
	/* the memory made before the lock: its failure alone costs nothing */
	CHECK(&c, failed[1] < failed[0] && failed[2] > 0 && tiny > failed[2] && done,
	      "writes failed: %d with all allocations from one on failing, %d with one, %d "
	      "with two, %d with two and the room made before too small; then one whole", failed[0],
	      failed[1], failed[2], tiny);
	store_close(&s);
	CHECK(&c, store_open(&s, local, &opt, NULL) == 0, "reopen");
	CHECK(&c, all_local(&s) == want, "every copy back after the restart");
	store_close(&s);
	torn = 0;
	failed[0] = open_fails_in_turn(local, &opt, want, &torn);
	CHECK(&c, failed[0] > NBLOBS && !torn, "starts out of memory at each allocation in "
	      "turn: %d failed, %d of them lost a copy", failed[0], torn);
	check_rmtree(top);
	printf("snapshot: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
