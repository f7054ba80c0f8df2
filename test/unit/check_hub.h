/* check_hub.h - for a unit test whose NAS hub lives under one directory
 * (@top) and whose store is one at a time (@the_store): the short helpers
 * test_space and test_adopt share, each a call of check_store.h's with
 * those two filled in.  Include once, in the test's one .c. */
#ifndef WFS_CHECK_HUB_H
#define WFS_CHECK_HUB_H

#include "check_store.h"

#include <string.h>

static char top[PATH_MAX];
static struct store *the_store;

/* @n bytes of @seed's pattern at top/@rel. */
static inline void put(const char *rel, size_t n, unsigned seed)
{
	check_put_pattern(top, rel, n, seed);
}

static inline void mkdirs(const char *rel)
{
	check_mkdirs(top, rel);
}

/* The store's blob for top/@rel, named @id. */
static inline struct blob *blob_named(const char *rel, const char *id)
{
	return check_blob(the_store, top, rel, id, 1);
}

/* The blob at @rel, named by its file name. */
static inline struct blob *blob_at(const char *rel)
{
	return blob_named(rel, strrchr(rel, '/') + 1);
}

/* What the store says of @b now (one static copy: read it before the next
 * call). */
static inline const struct blob_info *info(struct blob *b)
{
	static struct blob_info in;

	blob_info(the_store, b, &in);
	return &in;
}

/* @b promoted explicitly; its state once settled (30 s at most). */
static inline enum blob_state promote(struct blob *b)
{
	store_promote(the_store, b, 0, 1);
	return store_wait_settled(the_store, b, 30000);
}

static inline const char *st(struct blob *b)
{
	return blob_state_name(blob_state(b));
}

#endif
