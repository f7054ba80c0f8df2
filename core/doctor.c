/* doctor.c - see doctor.h. */
#include "doctor.h"
#include "ns.h"
#include "path.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DOCTOR_MAX_LISTED 1000 /* a broken hub can have many; the count is exact */

struct findings {
	json_t *links;
	json_int_t entries, problems;
};

static int look(void *arg, const char *rel, const struct ns_entry *e)
{
	struct findings *f = arg;

	f->entries++;
	if (e->kind == NS_LINK && e->link_state != NS_LINK_RESOLVED) {
		f->problems++;
		if (json_array_size(f->links) < DOCTOR_MAX_LISTED)
			json_array_append_new(f->links, json_pack("{s:s, s:s, s:s}", "path", rel,
				"target", e->target, "problem", ns_link_state_name(e->link_state)));
	}
	return 0;
}

static void flagged(void *arg, const struct blob_info *b)
{
	json_t *list = arg;

	if (b->state == BLOB_MISMATCH || b->state == BLOB_FAILED)
		json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s}", "key", b->key,
			"id", b->id, "state", blob_state_name(b->state), "reason", b->reason));
}

json_t *doctor_reply(const struct hub_roots *roots, struct store *s, const char *rel)
{
	struct findings f = { .links = json_array() };
	json_t *flags = json_array();

	if (!f.links || !flags) {
		json_decref(f.links);
		json_decref(flags);
		return NULL;
	}
	ns_walk(roots, rel, 0, look, &f);
	store_each(s, flagged, flags);
	return json_pack("{s:b, s:I, s:I, s:o, s:o}", "ok", 1, "entries", f.entries,
			 "link_problems", f.problems, "links", f.links, "flagged", flags);
}
