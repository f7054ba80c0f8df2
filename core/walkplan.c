/* walkplan.c - which directory a tree walk will list next.  See walkplan.h. */
#include "walkplan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SUB_NONE, SUB_NAMED, SUB_BEGUN };

struct plan_level {
	char *rel;             /* the directory */
	char **names;          /* its subdirectories, in listing order */
	unsigned char *state;  /* SUB_* of each */
	size_t n;
	long last;             /* the index begun last, or -1 */
	int dir;               /* +1 listing order, -1 reverse, 0 not known yet */
};

struct walk_plan {
	struct plan_level lv[WALK_PLAN_DEPTH];
	unsigned depth;
};

static void level_free(struct plan_level *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->state);
	free(l->rel);
	memset(l, 0, sizeof(*l));
}

static void pop_to(struct walk_plan *p, unsigned depth)
{
	while (p->depth > depth)
		level_free(&p->lv[--p->depth]);
}

struct walk_plan *walk_plan_new(void)
{
	return calloc(1, sizeof(struct walk_plan));
}

void walk_plan_free(struct walk_plan *p)
{
	if (!p)
		return;
	pop_to(p, 0);
	free(p);
}

/* Is @rel the child @name of @dir?  (@dir "" is the root.) */
static const char *child_name(const char *dir, const char *rel)
{
	size_t dl = strlen(dir);

	if (!dl)
		return strchr(rel, '/') ? NULL : rel;
	if (strncmp(rel, dir, dl) || rel[dl] != '/' || strchr(rel + dl + 1, '/'))
		return NULL;
	return rel + dl + 1;
}

/* The index of @name in @l, looked for first beside the last one begun
 * (where a walk's next one is), then everywhere. */
static long find_sub(const struct plan_level *l, const char *name)
{
	long near[2] = { l->last + 1, l->last - 1 };

	for (int k = 0; k < 2; k++)
		if (near[k] >= 0 && (size_t)near[k] < l->n && !strcmp(l->names[near[k]], name))
			return near[k];
	for (size_t i = 0; i < l->n; i++)
		if (!strcmp(l->names[i], name))
			return (long)i;
	return -1;
}

static void mark_begun(struct plan_level *l, long i)
{
	if (l->last >= 0 && i != l->last)
		l->dir = i > l->last ? 1 : -1;
	else if (l->last < 0 && !l->dir)
		l->dir = l->n > 1 && (size_t)i == l->n - 1 ? -1 : 1;
	l->state[i] = SUB_BEGUN;
	l->last = i;
}

static int push(struct walk_plan *p, const char *rel, const char *const *subdirs, size_t n,
		int dir)
{
	struct plan_level *l;

	if (p->depth == WALK_PLAN_DEPTH) { /* the deepest levels matter: drop the root's */
		level_free(&p->lv[0]);
		memmove(&p->lv[0], &p->lv[1], sizeof(p->lv[0]) * (WALK_PLAN_DEPTH - 1));
		memset(&p->lv[WALK_PLAN_DEPTH - 1], 0, sizeof(p->lv[0]));
		p->depth--;
	}
	l = &p->lv[p->depth];
	if (n > WALK_PLAN_MAX_DIRS)
		n = 0;
	l->rel = strdup(rel);
	l->names = calloc(n ? n : 1, sizeof(*l->names));
	l->state = calloc(n ? n : 1, 1);
	l->last = -1;
	l->dir = dir;
	if (!l->rel || !l->names || !l->state) {
		level_free(l);
		return -ENOMEM;
	}
	p->depth++;
	for (; l->n < n; l->n++)
		if (!(l->names[l->n] = strdup(subdirs[l->n])))
			return -ENOMEM;
	return 0;
}

int walk_plan_begin(struct walk_plan *p, const char *rel, const char *const *subdirs, size_t n)
{
	int dir = 0, r;
	unsigned k;

	for (k = p->depth; k-- > 0;) {
		struct plan_level *l = &p->lv[k];
		const char *name;
		long i;

		if (!strcmp(l->rel, rel)) { /* listed again: a level afresh, same way */
			dir = l->dir;
			pop_to(p, k);
			break;
		}
		if ((name = child_name(l->rel, rel)) && (i = find_sub(l, name)) >= 0) {
			pop_to(p, k + 1);
			mark_begun(l, i);
			dir = l->dir;
			break;
		}
	}
	if (k == (unsigned)-1) /* under no level: a new walk */
		pop_to(p, 0);
	r = push(p, rel, subdirs, n, dir);
	if (r < 0)
		pop_to(p, 0);
	return r;
}

int walk_plan_next(struct walk_plan *p, char *rel, size_t size)
{
	for (unsigned k = p->depth; k-- > 0;) {
		struct plan_level *l = &p->lv[k];
		long i;

		if (!l->dir)
			return -ENOENT;
		i = l->last >= 0 ? l->last : (l->dir > 0 ? 0 : (long)l->n - 1);
		for (; i >= 0 && (size_t)i < l->n; i += l->dir) {
			int len;

			if (l->state[i] != SUB_NONE)
				continue;
			l->state[i] = SUB_NAMED;
			len = *l->rel ? snprintf(rel, size, "%s/%s", l->rel, l->names[i])
				      : snprintf(rel, size, "%s", l->names[i]);
			return len >= 0 && (size_t)len < size ? 0 : -ENOENT;
		}
	}
	return -ENOENT;
}
