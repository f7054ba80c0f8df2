/* check_store.h - what the unit tests that keep a store (test_space,
 * test_room, test_bandwidth) share beside check.h, which knows no store. */
#ifndef WFS_CHECK_STORE_H
#define WFS_CHECK_STORE_H

#include "check.h"
#include "store.h"

#include <limits.h>

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

#endif
