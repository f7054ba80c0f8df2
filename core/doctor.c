/* doctor.c - see doctor.h. */
#include "doctor.h"
#include "ns.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DOCTOR_MAX_LISTED 1000 /* a broken hub can have many; the count is exact */

struct walk {
	const struct hub_roots *roots;
	struct ns_entry *e;
	json_t *links;
	json_int_t entries, problems;
};

static void walk(struct walk *w, const char *rel, int depth)
{
	char child[PATH_MAX];
	struct dirent *de;
	DIR *d;

	if (ns_classify(w->roots, rel, w->e) < 0)
		return;
	w->entries++;
	if (w->e->kind == NS_LINK && w->e->link_state != NS_LINK_RESOLVED) {
		w->problems++;
		if (json_array_size(w->links) < DOCTOR_MAX_LISTED)
			json_array_append_new(w->links, json_pack("{s:s, s:s, s:s}", "path", rel,
				"target", w->e->target, "problem",
				ns_link_state_name(w->e->link_state)));
		return;
	}
	if (w->e->kind != NS_DIR || depth > 64)
		return;
	d = opendir(w->e->backing);
	while (d && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (path_join(rel, de->d_name, child, sizeof(child)) == 0)
			walk(w, child, depth + 1);
	}
	if (d)
		closedir(d);
}

static void flagged(void *arg, const struct blob *b)
{
	json_t *list = arg;

	if (b->state == BLOB_MISMATCH || b->state == BLOB_FAILED)
		json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s}", "key", b->key,
			"id", b->id, "state", blob_state_name(b->state), "reason", b->reason));
}

json_t *doctor_reply(const struct hub_roots *roots, struct store *s, const char *rel)
{
	struct walk w = { .roots = roots, .links = json_array() };
	json_t *flags = json_array();

	w.e = malloc(sizeof(*w.e));
	if (!w.e || !w.links || !flags) {
		free(w.e);
		json_decref(w.links);
		json_decref(flags);
		return NULL;
	}
	if (hub_check_parents(roots, rel) == 0)
		walk(&w, rel, 0);
	free(w.e);
	store_each(s, flagged, flags);
	return json_pack("{s:b, s:I, s:I, s:o, s:o}", "ok", 1, "entries", w.entries,
			 "link_problems", w.problems, "links", w.links, "flagged", flags);
}
