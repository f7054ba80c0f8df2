/* startnas.c - see startnas.h. */
#include "startnas.h"

#include "startpaths.h"
#include "wfs.h"
#include "thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* No gate yet (its threads would not survive fuse_daemonize's fork): a
 * thread of its own makes the start's NAS calls, waited for nas_timeout at
 * most, in a block it and main hold (the last to let go frees it; past the
 * deadline, main's hold is w->check_left: freed in the fork's child). */
struct nas_check {
	const struct wfs_opts *o;
	struct hub_roots roots;
	struct ns_entry root;
	char what[PATH_MAX + 64]; /* which path failed, for the message */
	int r;
	int gone;                 /* nas_root_gone(NAS_HUB) == 1 */
	_Atomic int holds;        /* 2, then 1 once the thread or main let go */
};

void startnas_release(struct nas_check *c)
{
	if (atomic_fetch_sub(&c->holds, 1) == 1)
		free(c);
}

static void *nas_check_thread(void *arg)
{
	struct nas_check *c = arg;
	const struct wfs_opts *o = c->o;
	struct stat st;
	int r = 0;

	pthread_setname_np(pthread_self(), "wfs-nascheck");
	snprintf(c->what, sizeof(c->what), "NAS_HUB %s", o->nas);
	/* the type first: root's access(X_OK) on a file without an x bit
	 * says EACCES, which would hide "not a directory" */
	if (stat(o->nas, &st) < 0)
		r = -errno;
	else if (!S_ISDIR(st.st_mode))
		r = -ENOTDIR;
	else if (access(o->nas, R_OK | X_OK) < 0)
		r = -errno;
	else
		r = hub_roots_add(&c->roots, o->nas);
	for (int i = 0; r == 0 && i < o->n_extra_roots; i++) {
		snprintf(c->what, sizeof(c->what), "-o root=%s", o->extra_roots[i]);
		r = hub_roots_add(&c->roots, o->extra_roots[i]);
	}
	if (r == 0) {
		snprintf(c->what, sizeof(c->what), "NAS_HUB %s: cannot read the root", o->nas);
		r = ns_classify(&c->roots, "", &c->root);
	}
	if (r == 0)
		c->gone = nas_root_gone(c->roots.path[0]) == 1;
	c->r = r;
	startnas_release(c);
	return NULL;
}

int startnas_check(struct wfs *w, struct ns_entry *root, int *empty, char *what, size_t wsz)
{
	struct nas_check *c = calloc(1, sizeof(*c));
	struct timespec dl;
	pthread_t t;
	int r;

	if (!c)
		return -ENOMEM;
	c->o = &w->opt;
	c->r = -EINPROGRESS;
	atomic_init(&c->holds, 2);
	if ((r = thread_start(&t, NULL, nas_check_thread, c))) {
		free(c);
		return r;
	}
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += w->opt.nas_timeout_ms / 1000;
	dl.tv_nsec += (long)(w->opt.nas_timeout_ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	if (pthread_timedjoin_np(t, NULL, &dl) != 0) {
		pthread_detach(t);
		snprintf(what, wsz, "NAS_HUB %s: no answer within %u ms", w->opt.nas,
			 w->opt.nas_timeout_ms);
		w->check_left = c;
		return -ETIMEDOUT;
	}
	r = c->r;
	snprintf(what, wsz, "%s", c->what);
	if (r == 0) {
		w->roots = c->roots;
		*root = c->root;
		*empty = c->gone;
	}
	free(c);
	return r;
}

int startnas_record_is_of_nas(struct wfs *w, const char *rec_nas)
{
	char abs_nas[PATH_MAX];

	return (abs_lexical(w->opt.nas, abs_nas, sizeof(abs_nas)) == 0 &&
		!strcmp(abs_nas, rec_nas)) || (w->roots.n && !strcmp(w->roots.path[0], rec_nas));
}

int startnas_from_record(struct wfs *w, struct ns_entry *root, const char *what, int err)
{
	char rec_nas[PATH_MAX];
	struct record_entry *re;
	int r;

	if (!record_has_any(&w->record)) {
		fprintf(stderr, "wfs: %s: %s (and LOCAL_STORE %s holds no record of local "
			"revisions to serve meanwhile)\n", what, strerror(-err), w->opt.local);
		return -1;
	}
	record_nas(&w->record, rec_nas, sizeof(rec_nas));
	if (!startnas_record_is_of_nas(w, rec_nas)) {
		fprintf(stderr, "wfs: %s: %s; LOCAL_STORE %s has a record of local revisions, but "
			"of NAS_HUB %s, not this one: refusing to serve it\n", what,
			strerror(-err), w->opt.local, rec_nas);
		return -1;
	}
	memset(&w->roots, 0, sizeof(w->roots));
	w->roots.n = 1;
	snprintf(w->roots.path[0], sizeof(w->roots.path[0]), "%s", rec_nas);
	/* Links into further roots are followed once the NAS is back; their
	 * canonical paths cannot be asked now. */
	for (int i = 0; i < w->opt.n_extra_roots && w->roots.n < HUB_MAX_ROOTS; i++)
		if (abs_lexical(w->opt.extra_roots[i], w->roots.path[w->roots.n],
				sizeof(w->roots.path[0])) == 0)
			w->roots.n++;
	re = malloc(sizeof(*re));
	if (!re || (r = record_lookup(&w->record, "", re)) < 0 || re->e.kind != NS_DIR) {
		free(re);
		fprintf(stderr, "wfs: %s: %s; the record in LOCAL_STORE %s has no root\n", what,
			strerror(-err), w->opt.local);
		return -1;
	}
	*root = re->e;
	free(re);
	fprintf(stderr, "wfs: %s: %s; serving the local revisions recorded in %s/%s until it "
		"answers\n", what, strerror(-err), w->opt.local, RECORD_FILE);
	return 0;
}
