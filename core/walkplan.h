/* walkplan.h - which directory a tree walk will list next.
 *
 * A reader walking a tree lists a directory, then goes down into its
 * subdirectories one at a time: in listing order (fts, find), or in
 * reverse (a walker that pushes them on a stack and pops the last).  Told
 * of each directory as its listing begins, with that listing's
 * subdirectories, a plan names the directory the walk will most likely
 * list next, so its NAS work can be done while the reader is still busy
 * with this one.
 *
 * The plan is a stack with a level per directory being walked: its
 * subdirectories in listing order, and which of them the walk has begun.
 *   - A directory whose parent is a level pops the levels above that one,
 *     is marked begun there, and sets the level's direction: the way it
 *     lies from the sibling begun before it, or for the first one begun,
 *     backwards when it is the last and forwards otherwise.
 *   - Its own level, pushed above, takes the direction of the level below
 *     (a walker keeps its order), or none.
 *   - A directory under no level starts a new plan, with no direction.
 * The next directory is the first one neither begun nor named before, from
 * the top level down, each level searched in its direction from its last
 * begun.  A level with no direction yet names nothing: a plain `ls` of a
 * directory costs no NAS work for its subdirectories.
 *
 * Knows nothing of FUSE or the NAS; not thread-safe (the caller locks).
 * Memory: the names of the subdirectories of at most WALK_PLAN_DEPTH
 * directories, at most WALK_PLAN_MAX_DIRS each (a directory with more has
 * a level that names nothing). */
#ifndef WFS_WALKPLAN_H
#define WFS_WALKPLAN_H

#include <stddef.h>

#define WALK_PLAN_DEPTH 32
#define WALK_PLAN_MAX_DIRS 4096

struct walk_plan;

/* NULL with errno set on failure. */
struct walk_plan *walk_plan_new(void);
void walk_plan_free(struct walk_plan *p);

/* The walk began listing @rel (a path relative to the walk's root, as the
 * caller names directories; "" for the root), whose subdirectories are
 * @subdirs[0..@n) in listing order.  Returns 0, or -ENOMEM (the plan is
 * then empty, and names nothing until the next begin). */
int walk_plan_begin(struct walk_plan *p, const char *rel, const char *const *subdirs, size_t n);

/* The directory the walk will most likely list next, among those neither
 * begun nor named by this function before, written to @rel (@size bytes).
 * Returns 0, or -ENOENT when the plan cannot tell (or the path does not
 * fit). */
int walk_plan_next(struct walk_plan *p, char *rel, size_t size);

#endif
