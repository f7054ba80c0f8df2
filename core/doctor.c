/* doctor.c - see doctor.h. */
#include "doctor.h"
#include "peeras.h"
#include "nasopen.h"
#include "ns.h"
#include "path.h"
#include "reply.h"
#include "stopby.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#define DOCTOR_MAX_LISTED 1000 /* a broken hub can have many; the count is exact */

/* The flagged blobs: the first REPLY_FLAGGED_MAX listed, all counted. */
struct flagged_list {
	json_t *list;
	json_int_t total;
};

struct findings {
	struct store *s;
	json_t *links;
	struct flagged_list flagged; /* scoped to the walk: the flagged blobs its files name */
	json_t *seen;    /* ... by key, each once (a blob has many names); NULL: not scoped */
	json_int_t entries, problems;
};

static void flagged(void *arg, const struct blob_info *b)
{
	struct flagged_list *f = arg;

	if ((b->state == BLOB_MISMATCH || b->state == BLOB_FAILED) &&
	    f->total++ < REPLY_FLAGGED_MAX)
		json_array_append_new(f->list, json_pack("{s:o, s:o, s:s, s:o}", "key",
			reply_path(b->key), "id", reply_path(b->id), "state",
			blob_state_name(b->state), "reason", reply_path(b->reason)));
}

/* The blob a file of the walk names, if verification flagged it. */
static void look_blob(struct findings *f, const struct ns_entry *e)
{
	struct blob_info in;
	struct blob *b;

	if (!e->backing[0] || json_object_get(f->seen, e->backing) ||
	    !(b = store_find(f->s, e->backing)))
		return;
	/* _nocheck: a NAS name need not be UTF-8; the set is never sent */
	json_object_set_new_nocheck(f->seen, e->backing, json_true());
	blob_info(f->s, b, &in);
	flagged(&f->flagged, &in);
}

static int look(void *arg, const char *rel, const struct ns_entry *e)
{
	struct findings *f = arg;

	f->entries++;
	if (e->kind == NS_LINK && e->link_state != NS_LINK_RESOLVED) {
		f->problems++;
		if (json_array_size(f->links) < DOCTOR_MAX_LISTED)
			json_array_append_new(f->links, json_pack("{s:o, s:o, s:s}", "path",
				reply_path(rel), "target", reply_path(e->target), "problem",
				ns_link_state_name(e->link_state)));
	}
	if (f->seen && (e->kind == NS_FILE || (e->kind == NS_LINK &&
					      e->link_state == NS_LINK_RESOLVED)))
		look_blob(f, e);
	return 0;
}

json_t *doctor_reply(const struct hub_roots *roots, struct store *s, const char *rel)
{
	/* The whole mount: every flagged blob the store knows, named in the
	 * tree or not; a PATH: those its files name, so that a clean part of
	 * the hub exits 0 whatever another repo holds. */
	int others = peer_as_other(); /* (another user: only what its walk met, peeras.h) */
	struct findings f = { .s = s, .links = json_array(), .flagged.list = json_array(),
			      .seen = *rel || others ? json_object() : NULL };
	json_t *rep = NULL;
	int r;

	if (!f.links || !f.flagged.list || ((*rel || others) && !f.seen))
		goto out;
	/* A PATH that is not there (a typo), or a listing that broke off, is
	 * an error: "checked 0 entries", exit 0, would say all is well. */
	r = ns_walk(roots, rel, 0, look, &f);
	if (r < 0) {
		rep = reply_error(-r, "%s: %s", *rel ? rel : "/", strerror(-r));
		goto out;
	}
	if (!*rel && !others)
		store_each(s, flagged, &f.flagged);
	rep = json_pack("{s:b, s:I, s:I, s:O, s:O, s:I}", "ok", 1, "entries", f.entries,
			"link_problems", f.problems, "links", f.links, "flagged", f.flagged.list,
			"flagged_total", f.flagged.total);
out:
	json_decref(f.links);
	json_decref(f.flagged.list);
	json_decref(f.seen);
	return rep;
}

/* ---- the scan at mount (doctor.h) ---- */

#define SCAN_GROUPS 4 /* directories the line names; escapes elsewhere are counted */

struct scan_group {
	char dir[PATH_MAX]; /* the escapes counted here all lead below it */
	long n;
};

struct scan {
	struct doctor_scan *d;
	long entries, escapes, elsewhere;
	int cut; /* stopped at DOCTOR_SCAN_MAX */
	int ngroups;
	struct scan_group group[SCAN_GROUPS], swap;
	struct hub_res res;
};

/* Would "-o root=@dir" be a sensible suggestion: not "/", not a directory
 * holding NAS_HUB itself (that would open everything beside it to
 * readers), not a system directory (a link into /proc or /dev is no
 * blob store). */
static int suggestible(const struct hub_roots *roots, const char *dir)
{
	static const char *const system_dirs[] = { "/proc", "/sys", "/dev", "/run" };

	if (!strcmp(dir, "/") || path_under(dir, roots->path[0]))
		return 0;
	for (size_t i = 0; i < sizeof(system_dirs) / sizeof(system_dirs[0]); i++)
		if (path_under(system_dirs[i], dir))
			return 0;
	return 1;
}

/* The deepest directory that holds both absolute normalised @a and @b. */
static void common_dir(const char *a, const char *b, char *out, size_t sz)
{
	size_t keep = 0;

	for (size_t i = 0;; i++) {
		if ((a[i] == '/' || !a[i]) && (b[i] == '/' || !b[i]))
			keep = i;
		if (!a[i] || !b[i] || a[i] != b[i])
			break;
	}
	snprintf(out, sz, "%.*s", keep ? (int)keep : 1, a);
}

/* A link that left the roots for @real: count it with the directory it
 * leads into, widening a group's directory to hold it where sensible. */
static void note_escape(struct scan *sc, const char *real)
{
	const struct hub_roots *roots = sc->d->roots;
	char dir[PATH_MAX], common[PATH_MAX];
	char *slash;

	sc->escapes++;
	snprintf(dir, sizeof(dir), "%s", real);
	slash = strrchr(dir, '/');
	if (slash)
		slash[slash == dir] = '\0'; /* its directory; "/a" -> "/" */
	if (!suggestible(roots, dir)) {
		sc->elsewhere++;
		return;
	}
	for (int i = 0; i < sc->ngroups; i++) {
		common_dir(sc->group[i].dir, dir, common, sizeof(common));
		if (suggestible(roots, common)) {
			strcpy(sc->group[i].dir, common);
			sc->group[i].n++;
			return;
		}
	}
	if (sc->ngroups == SCAN_GROUPS) {
		sc->elsewhere++;
		return;
	}
	strcpy(sc->group[sc->ngroups].dir, dir);
	sc->group[sc->ngroups++].n = 1;
}

static int scan_entry(void *arg, const char *rel, const struct ns_entry *e)
{
	struct scan *sc = arg;

	if (atomic_load_explicit(&sc->d->stop, memory_order_relaxed))
		return 1;
	if (++sc->entries > DOCTOR_SCAN_MAX) {
		sc->entries--;
		sc->cut = 1;
		return 1;
	}
	if (e->kind != NS_LINK || e->link_state != NS_LINK_ESCAPE)
		return 0;
	/* the classification keeps the link text, not where the chain left */
	if (hub_resolve(sc->d->roots, rel, NULL, NULL, &sc->res) == 0 &&
	    sc->res.kind == HUB_RES_ESCAPE) {
		note_escape(sc, sc->res.real);
	} else { /* changed since: still counted */
		sc->escapes++;
		sc->elsewhere++;
	}
	return 0;
}

static void scan_report(struct scan *sc)
{
	const struct hub_roots *roots = sc->d->roots;
	char line[4096];
	size_t used;

	if (!sc->escapes) {
		snprintf(line, sizeof(line), "start-up: no link under the repos' blobs/ and "
			 "snapshots/ leads outside NAS_HUB %s (%ld entries looked at%s)",
			 roots->path[0], sc->entries, sc->cut ? ", the most a scan looks at" : "");
		sc->d->log(sc->d->arg, LOG_INFO, line);
		return;
	}
	/* the biggest groups first */
	for (int i = 1; i < sc->ngroups; i++)
		for (int k = i; k > 0 && sc->group[k].n > sc->group[k - 1].n; k--) {
			sc->swap = sc->group[k];
			sc->group[k] = sc->group[k - 1];
			sc->group[k - 1] = sc->swap;
		}
	used = (size_t)snprintf(line, sizeof(line), "start-up: %ld link%s under the repos' blobs/ "
				"and snapshots/ lead%s outside NAS_HUB %s and %s shown as links, "
				"never followed%s:", sc->escapes, sc->escapes == 1 ? "" : "s",
				sc->escapes == 1 ? "s" : "", roots->path[0],
				sc->escapes == 1 ? "is" : "are",
				sc->cut ? " (in the entries a scan looks at)" : "");
	for (int i = 0; i < sc->ngroups && used < sizeof(line); i++)
		used += (size_t)snprintf(line + used, sizeof(line) - used,
					 "%s %ld into %s (-o root=%s would serve them)",
					 i ? "," : "", sc->group[i].n, sc->group[i].dir,
					 sc->group[i].dir);
	if (sc->elsewhere && used < sizeof(line))
		snprintf(line + used, sizeof(line) - used, "%s %ld elsewhere",
			 sc->ngroups ? "," : "", sc->elsewhere);
	sc->d->log(sc->d->arg, LOG_NOTICE, line);
}

static void *scan_main(void *arg)
{
	struct doctor_scan *d = arg;
	struct scan *sc = calloc(1, sizeof(*sc));
	struct dirent *de;
	DIR *top = NULL;
	int fd;

	pthread_setname_np(pthread_self(), "wfs-linkscan");
	if (!sc)
		return NULL;
	sc->d = d;
	fd = nas_open(d->roots, d->roots->path[0], O_DIRECTORY);
	if (fd >= 0 && !(top = fdopendir(fd)))
		close(fd);
	while (top && (de = readdir(top)) && !sc->cut &&
	       !atomic_load_explicit(&d->stop, memory_order_relaxed)) {
		static const char *const areas[] = { "blobs", "snapshots" };

		/* repo folders; ns_walk never goes through one that is a link */
		if (!hub_is_repo_folder(de->d_name, strlen(de->d_name)))
			continue;
		for (int i = 0; i < 2; i++) {
			char rel[PATH_MAX];

			if (snprintf(rel, sizeof(rel), "%s/%s", de->d_name, areas[i]) <
			    (int)sizeof(rel))
				ns_walk(d->roots, rel, 0, scan_entry, sc);
		}
	}
	if (top)
		closedir(top);
	if (!atomic_load_explicit(&d->stop, memory_order_relaxed))
		scan_report(sc);
	free(sc);
	return NULL;
}

int doctor_scan_start(struct doctor_scan *d, const struct hub_roots *roots,
		      void (*log)(void *arg, int prio, const char *msg), void *arg)
{
	int r;

	d->roots = roots;
	d->log = log;
	d->arg = arg;
	atomic_store(&d->stop, 0);
	r = thread_start(&d->thread, NULL, scan_main, d);
	if (r)
		return r;
	d->started = 1;
	return 0;
}

void doctor_scan_stop_tell(struct doctor_scan *d)
{
	if (d->started)
		atomic_store(&d->stop, 1);
}

int doctor_scan_stop_by(struct doctor_scan *d, int64_t deadline_ms)
{
	int r;

	if (!d->started)
		return 0;
	doctor_scan_stop_tell(d);
	r = join_by(d->thread, deadline_ms);
	d->started = 0;
	return r;
}

void doctor_scan_stop(struct doctor_scan *d)
{
	doctor_scan_stop_by(d, -1);
}
