/* record_side.c - the files of a repo the record keeps beside its
 * snapshots' links and blobs: refs, "no such file" markers and file lists,
 * each told by its path.  See record_int.h. */
#include "record_int.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

int record_is_ref(const char *rel)
{
	const char *slash = strchr(rel, '/');

	return slash && slash != rel && !strncmp(slash + 1, "refs/", 5);
}

enum side record_side_of(const char *rel, char *out, size_t sz)
{
	const char *slash = strchr(rel, '/'), *rev = NULL, *end = NULL;
	enum side k = SIDE_NONE;
	size_t len;
	int n;

	if (!slash || slash == rel)
		return SIDE_NONE;
	if (!strncmp(slash + 1, ".no_exist/", 10)) {
		rev = slash + 11;
		end = strchr(rev, '/');
		if (end && end != rev && end[1])
			k = SIDE_MARKER;
	} else if (!strncmp(slash + 1, "trees/", 6)) {
		rev = slash + 7;
		len = strlen(rev);
		end = rev + (len > 5 ? len - 5 : 0);
		if (len > 5 && !strchr(rev, '/') && !strcmp(end, ".json"))
			k = SIDE_TREE;
	}
	if (!k)
		return SIDE_NONE;
	n = snprintf(out, sz, "%.*s/snapshots/%.*s", (int)(slash - rel), rel, (int)(end - rev),
		     rev);
	return n > 0 && (size_t)n < sz ? k : SIDE_NONE;
}

size_t record_side_max(enum side k)
{
	return k == SIDE_TREE ? RECORD_MAX_TREE : RECORD_MAX_DATA;
}

size_t record_data_max(const char *path)
{
	char rev[PATH_MAX];

	return record_side_max(record_side_of(path, rev, sizeof(rev)));
}
