/* doctor.h - what is wrong with the NAS tree, as the mount sees it: links
 * that dangle, loop or leave NAS_HUB (shown as links, never followed), and
 * blobs flagged by verification.  Read-only; for `wfsctl doctor`. */
#ifndef WFS_DOCTOR_H
#define WFS_DOCTOR_H

#include "resolve.h"
#include "store.h"

#include <jansson.h>

/* Walk @rel ("" for the whole hub) and build the reply object. */
json_t *doctor_reply(const struct hub_roots *roots, struct store *s, const char *rel);

#endif
