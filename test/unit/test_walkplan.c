/* test_walkplan.c - core/walkplan.c: the directory a walk lists next.
 *
 * Walkers are simulated over trees held here: one in listing order (fts,
 * find: pre-order, children first to last) and one that pushes a
 * directory's subdirectories on a stack and pops the last (Python's
 * os.walk-like loops, the bench's).  Each directory visited is told to the
 * plan as its listing begins; the plan's prediction is then compared with
 * the directory the walker really lists next. */
#include "check.h"
#include "walkplan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A tree: a directory's subdirectories are the paths one component below
 * it, in the order listed here (its "listing order"). */
struct tree {
	const char *const *dirs;
	size_t n;
};

/* The subdirectories of @rel, full paths in @full and names in @names
 * (either may be NULL), in listing order. */
static size_t subdirs_of(const struct tree *t, const char *rel, const char **full,
			 const char **names)
{
	size_t k = 0, rl = strlen(rel);

	for (size_t i = 0; i < t->n; i++) {
		const char *d = t->dirs[i], *name = d + (rl ? rl + 1 : 0);

		if (!*d || (rl && (strncmp(d, rel, rl) || d[rl] != '/')) || strchr(name, '/'))
			continue;
		if (full)
			full[k] = d;
		if (names)
			names[k] = name;
		k++;
	}
	return k;
}

/* The order a walker lists the tree's directories in: @reverse 0 for fts,
 * 1 for the stack walker.  Returns how many (all of them). */
static size_t walk_order(const struct tree *t, int reverse, const char **order)
{
	const char *stack[256];
	size_t sp = 0, n = 0;

	stack[sp++] = "";
	while (sp) {
		const char *d = stack[--sp], *subs[64];
		size_t k = subdirs_of(t, d, subs, NULL);

		order[n++] = d;
		/* fts lists children first to last: they go on the stack last
		 * to first; the stack walker pushes them in order */
		for (size_t i = 0; i < k; i++)
			stack[sp++] = subs[reverse ? i : k - 1 - i];
	}
	return n;
}

/* Walk @t, telling the plan; count the predictions right and wrong.  The
 * only directory a plan may not foresee is the root's first child (no
 * direction yet); every other prediction must be right. */
static void check_walk(struct check_count *c, const struct tree *t, int reverse, const char *what)
{
	struct walk_plan *p = walk_plan_new();
	const char *order[256], *subs[64];
	size_t n = walk_order(t, reverse, order);
	char next[256];
	int unknown = 0;

	CHECK(c, p != NULL, "walk_plan_new");
	if (!p)
		return;
	for (size_t i = 0; i < n; i++) {
		size_t k = subdirs_of(t, order[i], NULL, subs);
		int r;

		CHECK(c, walk_plan_begin(p, order[i], subs, k) == 0, "%s: begin %s", what, order[i]);
		r = walk_plan_next(p, next, sizeof(next));
		if (i + 1 == n) {
			CHECK(c, r == -ENOENT, "%s: after the last directory (%s) the plan names %s",
			      what, order[i], r == 0 ? next : "?");
		} else if (r == -ENOENT) {
			unknown++;
			CHECK(c, i == 0, "%s: no prediction after %s (want %s)", what, order[i],
			      order[i + 1]);
		} else {
			CHECK(c, r == 0 && !strcmp(next, order[i + 1]),
			      "%s: after %s the plan names %s, the walk lists %s", what, order[i], next,
			      order[i + 1]);
		}
	}
	CHECK(c, unknown <= 1, "%s: %d directories not foreseen", what, unknown);
	walk_plan_free(p);
}

static void test_walkers(struct check_count *c)
{
	static const char *const hub[] = {
		"", "blobs", "blobs/4d", "blobs/a0", "models--o--m", "models--o--m/blobs",
		"models--o--m/refs", "models--o--m/snapshots", "models--o--m/snapshots/r1",
		"models--o--m/snapshots/r1/original", "models--o--m/snapshots/r2",
		"datasets--o--d", "datasets--o--d/blobs", "datasets--o--d/snapshots",
		"datasets--o--d/snapshots/r", "datasets--o--d/snapshots/r/p0",
		"datasets--o--d/snapshots/r/p1", "datasets--o--d/snapshots/r/p2",
		".locks",
	};
	const struct tree t = { hub, sizeof(hub) / sizeof(hub[0]) };

	check_walk(c, &t, 0, "fts order");
	check_walk(c, &t, 1, "stack order");
}

/* A plain listing (ls) names nothing: its subdirectories cost no NAS
 * work.  Neither does a directory under no level of the plan (another
 * walk): it starts afresh. */
static void test_no_direction(struct check_count *c)
{
	struct walk_plan *p = walk_plan_new();
	const char *subs[] = { "a", "b", "c" };
	char next[64];

	CHECK(c, walk_plan_begin(p, "repo/snapshots", subs, 3) == 0, "begin");
	CHECK(c, walk_plan_next(p, next, sizeof(next)) == -ENOENT, "ls: the plan names %s", next);
	CHECK(c, walk_plan_begin(p, "repo/snapshots/b", NULL, 0) == 0, "begin b");
	/* b is neither first nor last: forwards */
	CHECK(c, walk_plan_next(p, next, sizeof(next)) == 0 && !strcmp(next, "repo/snapshots/c"),
	      "after b: %s", next);
	/* named once, not again; a is behind the walk */
	CHECK(c, walk_plan_next(p, next, sizeof(next)) == -ENOENT, "named twice: %s", next);
	CHECK(c, walk_plan_begin(p, "other", subs, 3) == 0, "begin other");
	CHECK(c, walk_plan_next(p, next, sizeof(next)) == -ENOENT, "a new walk: %s", next);
	/* a path that does not fit is not named */
	CHECK(c, walk_plan_begin(p, "other/a", NULL, 0) == 0, "begin other/a");
	CHECK(c, walk_plan_next(p, next, 7) == -ENOENT, "other/b (8 bytes) in 7");
	walk_plan_free(p);
}

/* Deeper than the plan's levels: the deepest ones are kept, and the walk
 * there is still foreseen. */
static void test_deep(struct check_count *c)
{
	struct walk_plan *p = walk_plan_new();
	char rel[4096] = "", next[4096];
	const char *two[] = { "d", "e" };

	for (int i = 0; i < WALK_PLAN_DEPTH + 8; i++) {
		CHECK(c, walk_plan_begin(p, rel, two, 2) == 0, "begin %s", rel);
		strcat(rel, *rel ? "/d" : "d");
	}
	/* rel is the last begun's child "d": begin it, then its sibling "e"
	 * comes next (its parent's level, direction from the levels below) */
	CHECK(c, walk_plan_begin(p, rel, NULL, 0) == 0, "begin deepest");
	CHECK(c, walk_plan_next(p, next, sizeof(next)) == 0 &&
	      !strcmp(next + strlen(next) - 2, "/e") && strlen(next) == strlen(rel),
	      "deepest: %s", next);
	walk_plan_free(p);
}

int main(void)
{
	struct check_count c = { 0, 0 };

	test_walkers(&c);
	test_no_direction(&c);
	test_deep(&c);
	printf("walkplan: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
