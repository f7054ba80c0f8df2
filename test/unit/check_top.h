/* check_top.h - what test_store and test_demote share: the NAS files of a
 * test under one directory (@top), put there by relative path, and the
 * blobs of the stores each call names.  Include once, in the test's one
 * .c. */
#ifndef WFS_CHECK_TOP_H
#define WFS_CHECK_TOP_H

#include "check.h"
#include "store.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char top[PATH_MAX];

static inline void put(const char *rel, const char *content, size_t n)
{
	char p[PATH_MAX * 2];

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	check_write_file(p, content, n);
}

static inline enum blob_state wait_settled(struct store *s, struct blob *b)
{
	return store_wait_settled(s, b, 30000);
}

/* What the store says of @b now (a copy: valid until the next call). */
static inline const struct blob_info *info(struct store *s, struct blob *b)
{
	static struct blob_info in;

	blob_info(s, b, &in);
	return &in;
}

static inline struct blob *blob_of(struct store *s, const char *rel, const char *id)
{
	char p[PATH_MAX * 2];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", top, rel);
	if (stat(p, &st) < 0)
		return NULL;
	return store_blob(s, p, &st, id);
}

static inline int count_files(const char *dir)
{
	return check_count_files(dir);
}

static char *pattern(size_t n, unsigned seed)
{
	char *buf = malloc(n);

	if (!buf)
		exit(2);
	check_pattern_fill(buf, n, seed);
	return buf;
}

/* Set @field of @key's record in the index at @path to @v (taken). */
static inline int index_set(const char *path, const char *key, const char *field, json_t *v)
{
	json_t *root = json_load_file(path, 0, NULL), *o;
	size_t i;
	int found = 0;

	if (!root) {
		json_decref(v);
		return -1;
	}
	json_array_foreach(json_object_get(root, "blobs"), i, o)
		if (!strcmp(json_string_value(json_object_get(o, "key")), key))
			found = !json_object_set(o, field, v);
	json_decref(v);
	found = found && json_dump_file(root, path, 0) == 0;
	json_decref(root);
	return found ? 0 : -1;
}

#endif
