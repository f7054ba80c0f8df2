/* check_store.h - what the unit tests that keep a store (test_space,
 * test_adopt, test_room, test_bandwidth, test_part, test_part_crash) share
 * beside check.h, which knows no store. */
#ifndef WFS_CHECK_STORE_H
#define WFS_CHECK_STORE_H

#include "check.h"
#include "hash.h"
#include "policy.h"
#include "store.h"

#include <limits.h>
#include <unistd.h>

/* The store's blob for the file @rel under @root, stat'ed now, named @id
 * (NULL: its file name).  A file not there: NULL, or with @must the test
 * stops (exit 2: its own fixture is wrong). */
static inline struct blob *check_blob(struct store *s, const char *root, const char *rel,
				      const char *id, int must)
{
	char p[PATH_MAX * 2];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", root, rel);
	if (stat(p, &st) < 0) {
		if (!must)
			return NULL;
		perror(p);
		exit(2);
	}
	return store_blob(s, p, &st, id ? id : strrchr(p, '/') + 1);
}

/* A policy for a store whose copies the test asks for itself: automatic
 * promotion off, no free-space floor (the test disk's own free space must
 * not decide what fits). */
static inline void check_policy_manual(struct policy_opts *pol)
{
	policy_opts_init(pol);
	pol->auto_on = 0;
	pol->min_free_pct = 0;
}

/* LOCAL_STORE @root/@name of one case, made; its path into @local. */
static inline void check_store_dir(const char *root, const char *name, char *local, size_t sz)
{
	snprintf(local, sz, "%s/%s", root, name);
	check_mkdirs(root, name);
}

/* The SHA-256 of the @n bytes check_put_pattern(.., @seed) writes (the
 * content address of a blob of them), in @out. */
static inline void check_pattern_sha(size_t n, unsigned seed, char out[65])
{
	static const char any[] = "0000000000000000000000000000000000000000000000000000000000000000";
	struct content_hash h = { 0 };
	char *buf = malloc(n ? n : 1), xxh[33];

	if (!buf)
		exit(2);
	check_pattern_fill(buf, n, seed);
	if (content_hash_init(&h, any, n) < 0)
		exit(2);
	content_hash_update(&h, buf, n);
	content_hash_final(&h, xxh, NULL);
	snprintf(out, 65, "%s", h.id_hex);
	content_hash_free(&h);
	free(buf);
}

/* Wait until no range of @b is asked for, copying or unproven (30 s at
 * most: 0 then). */
static inline int wait_parts(struct store *s, struct blob *b)
{
	int64_t end = store_now_ms() + 30000;
	struct blob_info in;

	do {
		blob_info(s, b, &in);
		if (!in.part_copying && !in.part_unproven)
			return 1;
		usleep(2000);
	} while (store_now_ms() < end);
	return 0;
}

#endif
