/* control.c - the control server; see control.h. */
#include "control.h"
#include "ns.h"
#include "path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- collecting the blobs under a path ---- */

struct blob_set {
	struct blob **v;
	size_t n, cap;
};

static int set_add(struct blob_set *set, struct blob *b)
{
	if (set->n == set->cap) {
		size_t cap = set->cap ? set->cap * 2 : 64;
		struct blob **v = realloc(set->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		set->v = v;
		set->cap = cap;
	}
	set->v[set->n++] = b;
	return 0;
}

static int ptr_cmp(const void *a, const void *b)
{
	const void *x = *(void *const *)a, *y = *(void *const *)b;

	return x < y ? -1 : x > y;
}

/* Sort and drop duplicates: two names of one NAS file are one blob. */
static void set_unique(struct blob_set *set)
{
	size_t w = 0;

	if (!set->n)
		return;
	qsort(set->v, set->n, sizeof(*set->v), ptr_cmp);
	for (size_t i = 0; i < set->n; i++)
		if (!w || set->v[w - 1] != set->v[i])
			set->v[w++] = set->v[i];
	set->n = w;
}

/* Walking a directory, leave out what changes on the NAS or is not data:
 * refs move, markers and file lists are tiny, locks are the clients'.  A
 * path named explicitly is always taken. */
static int worth_copying(const char *rel)
{
	const char *slash = strchr(rel, '/');
	const char *area = slash ? slash + 1 : NULL;

	if (!slash)
		return strchr(rel, '-') != NULL && strstr(rel, "--") != NULL; /* repos only */
	if (strchr(area, '/'))
		return 1;
	return strcmp(area, "refs") && strcmp(area, ".no_exist") && strcmp(area, "trees");
}

/* Every blob @rel is or contains: files, resolved links to files, and
 * everything under a directory.  Links to directories are not followed. */
static int collect(struct control *c, const char *rel, struct blob_set *set, int depth)
{
	struct ns_entry *e = malloc(sizeof(*e));
	struct stat st;
	int r;

	if (!e)
		return -ENOMEM;
	r = ns_classify(c->roots, rel, e);
	if (r < 0)
		goto out;
	if (e->kind == NS_FILE ||
	    (e->kind == NS_LINK && e->link_state == NS_LINK_RESOLVED && e->backing[0])) {
		if (stat(e->backing, &st) == 0 && S_ISREG(st.st_mode)) {
			struct blob *b = store_blob(c->store, e->backing, &st, e->blob_id);

			r = b ? set_add(set, b) : -ENOMEM;
		}
	} else if (e->kind == NS_DIR && depth < 64) {
		DIR *d = opendir(e->backing);
		struct dirent *de;

		if (!d) {
			r = -errno;
			goto out;
		}
		while ((de = readdir(d)) && r == 0) {
			char child[PATH_MAX];

			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			if (path_join(rel, de->d_name, child, sizeof(child)) < 0 ||
			    !worth_copying(child))
				continue;
			r = collect(c, child, set, depth + 1);
			if (r == -ENOENT)
				r = 0; /* vanished or hidden */
		}
		closedir(d);
	}
out:
	free(e);
	return r;
}

/* ---- replies ---- */

static json_t *error_reply(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static json_t *error_reply(int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:s, s:s}", "ok", 0, "error", msg, "errno",
			 strerrorname_np(err) ? strerrorname_np(err) : "EIO");
}

static json_t *blob_json(struct control *c, struct blob *b)
{
	struct blob snap;

	blob_snapshot(c->store, b, &snap);
	return json_pack("{s:s, s:s, s:s, s:I, s:I, s:b, s:s}", "key", b->key, "id", snap.id,
			 "state", blob_state_name(snap.state), "size", (json_int_t)snap.size,
			 "bytes_done", (json_int_t)(snap.state == BLOB_LOCAL ? snap.size :
						    snap.prog.bytes_done),
			 "pinned", snap.pinned, "reason", snap.reason);
}

/* Validate and normalise the request's "paths" (or "path"), then collect. */
static json_t *gather(struct control *c, json_t *req, struct blob_set *set)
{
	json_t *paths = json_object_get(req, "paths"), *p;
	json_t *one = json_object_get(req, "path");
	size_t i;

	if (!paths && one)
		paths = one;
	if (!paths)
		paths = json_string("");
	else
		json_incref(paths);
	if (json_is_string(paths)) {
		json_t *arr = json_array();

		json_array_append_new(arr, paths);
		paths = arr;
	}
	if (!json_is_array(paths)) {
		json_decref(paths);
		return error_reply(EINVAL, "\"paths\" must be a list of mount-relative paths");
	}
	json_array_foreach(paths, i, p) {
		char norm[PATH_MAX];
		const char *rel = json_string_value(p);
		int r;

		if (!rel || rel[0] == '/' || path_normalize(rel, norm, sizeof(norm)) < 0) {
			json_t *e = error_reply(EINVAL, "%s: not a path inside the mount %s",
						rel ? rel : "(not a string)", c->mount);

			json_decref(paths);
			return e;
		}
		r = collect(c, norm, set, 0);
		if (r < 0) {
			json_t *e = error_reply(-r, "%s: %s", *norm ? norm : "/", strerror(-r));

			json_decref(paths);
			return e;
		}
	}
	json_decref(paths);
	set_unique(set);
	return NULL;
}

static json_t *op_promote(struct control *c, json_t *req)
{
	struct blob_set set = {0};
	int pin = json_is_true(json_object_get(req, "pin"));
	int dry = json_is_true(json_object_get(req, "dry_run"));
	json_t *err = gather(c, req, &set), *list;
	struct store_usage u;
	uint64_t need = 0;

	if (err)
		goto out;
	for (size_t i = 0; i < set.n; i++) {
		struct blob snap;

		blob_snapshot(c->store, set.v[i], &snap);
		if (snap.state != BLOB_LOCAL && snap.state != BLOB_MISMATCH)
			need += snap.size;
		if (!dry && snap.state != BLOB_MISMATCH)
			store_promote(c->store, set.v[i], pin, 1);
	}
	list = json_array();
	for (size_t i = 0; i < set.n; i++)
		json_array_append_new(list, blob_json(c, set.v[i]));
	store_usage(c->store, &u);
	err = json_pack("{s:b, s:o, s:I, s:I, s:b}", "ok", 1, "blobs", list, "bytes_to_copy",
			(json_int_t)need, "space_available", (json_int_t)u.free_bytes, "dry_run", dry);
out:
	free(set.v);
	return err;
}

static json_t *op_progress(struct control *c, json_t *req)
{
	json_t *keys = json_object_get(req, "keys"), *k, *list = json_array();
	size_t i;

	if (!json_is_array(keys)) {
		json_decref(list);
		return error_reply(EINVAL, "\"keys\" must be a list");
	}
	json_array_foreach(keys, i, k) {
		const char *key = json_string_value(k);
		struct blob *b = key ? store_find(c->store, key) : NULL;

		if (b)
			json_array_append_new(list, blob_json(c, b));
		else
			json_array_append_new(list, json_pack("{s:s, s:s, s:s}", "key",
				key ? key : "", "state", "unknown", "reason", "no such blob"));
	}
	return json_pack("{s:b, s:o}", "ok", 1, "blobs", list);
}

static json_t *op_each(struct control *c, json_t *req, const char *op)
{
	struct blob_set set = {0};
	int force = json_is_true(json_object_get(req, "force"));
	int full = json_is_true(json_object_get(req, "full"));
	json_t *err = gather(c, req, &set), *skipped = json_array(), *demoted = json_array();
	json_int_t count = 0;

	if (err)
		goto out;
	for (size_t i = 0; i < set.n; i++) {
		struct blob *b = set.v[i];
		char reason[512];

		if (!strcmp(op, "evict")) {
			int r = store_evict(c->store, b, force);

			if (r == -EBUSY)
				json_array_append_new(skipped, json_pack("{s:s, s:s, s:s}", "key", b->key,
					"id", b->id, "reason", "pinned (evict --force to drop it)"));
			else if (r > 0)
				count++;
		} else if (!strcmp(op, "pin") || !strcmp(op, "unpin")) {
			store_pin(c->store, b, !strcmp(op, "pin"));
			count++;
		} else {
			struct blob snap;

			blob_snapshot(c->store, b, &snap);
			if (snap.state != BLOB_LOCAL)
				continue;
			count++;
			if (store_verify(c->store, b, full, reason, sizeof(reason)) > 0)
				json_array_append_new(demoted, json_pack("{s:s, s:s, s:s}", "key",
					b->key, "id", b->id, "reason", reason));
		}
	}
	if (!strcmp(op, "evict"))
		err = json_pack("{s:b, s:I, s:O}", "ok", 1, "evicted", count, "skipped", skipped);
	else if (!strcmp(op, "verify"))
		err = json_pack("{s:b, s:I, s:O}", "ok", 1, "checked", count, "demoted", demoted);
	else
		err = json_pack("{s:b, s:I}", "ok", 1, "count", count);
out:
	json_decref(skipped);
	json_decref(demoted);
	free(set.v);
	return err;
}

/* ---- status ---- */

struct tally {
	json_int_t files, bytes, local_files, local_bytes;
	json_int_t per_state[BLOB_FAILED + 1];
};

static void tally_set(struct control *c, struct blob_set *set, struct tally *t)
{
	memset(t, 0, sizeof(*t));
	for (size_t i = 0; i < set->n; i++) {
		struct blob snap;

		blob_snapshot(c->store, set->v[i], &snap);
		t->files++;
		t->bytes += (json_int_t)snap.size;
		t->per_state[snap.state]++;
		if (snap.state == BLOB_LOCAL) {
			t->local_files++;
			t->local_bytes += (json_int_t)snap.size;
		}
	}
}

static json_t *tally_json(const struct tally *t)
{
	json_t *states = json_object();

	for (int st = 0; st <= BLOB_FAILED; st++)
		if (t->per_state[st])
			json_object_set_new(states, blob_state_name((enum blob_state)st),
					    json_integer(t->per_state[st]));
	return json_pack("{s:I, s:I, s:I, s:I, s:o}", "files", t->files, "bytes", t->bytes,
			 "local_files", t->local_files, "local_bytes", t->local_bytes,
			 "states", states);
}

/* One repo: totals, and one line per revision. */
static json_t *repo_json(struct control *c, const char *repo)
{
	char snaps[PATH_MAX], path[PATH_MAX * 2];
	struct blob_set set = {0};
	struct tally t;
	json_t *o, *revs = json_array();
	DIR *d;
	struct dirent *de;

	collect(c, repo, &set, 0);
	set_unique(&set);
	tally_set(c, &set, &t);
	o = tally_json(&t);
	json_object_set_new(o, "repo", json_string(repo));
	snprintf(snaps, sizeof(snaps), "%s/snapshots", repo);
	snprintf(path, sizeof(path), "%s/%s", c->roots->path[0], snaps);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		char rel[PATH_MAX * 2];
		json_t *r;

		if (de->d_name[0] == '.')
			continue;
		snprintf(rel, sizeof(rel), "%s/%s", snaps, de->d_name);
		set.n = 0;
		collect(c, rel, &set, 0);
		set_unique(&set);
		tally_set(c, &set, &t);
		r = tally_json(&t);
		json_object_set_new(r, "rev", json_string(de->d_name));
		json_array_append_new(revs, r);
	}
	if (d)
		closedir(d);
	json_object_set_new(o, "revisions", revs);
	free(set.v);
	return o;
}

struct sums {
	json_int_t local_bytes, nas_bytes, opens;
	json_t *copies, *flagged;
};

static void sum_blob(void *arg, const struct blob *b)
{
	struct sums *s = arg;

	s->local_bytes += (json_int_t)b->local_bytes;
	s->nas_bytes += (json_int_t)b->nas_bytes;
	s->opens += (json_int_t)b->opens;
	if (b->state == BLOB_COPYING || b->state == BLOB_VERIFYING)
		json_array_append_new(s->copies, json_pack("{s:s, s:s, s:s, s:I, s:I}", "key",
			b->key, "id", b->id, "state", blob_state_name(b->state),
			"bytes_done", (json_int_t)b->prog.bytes_done, "size", (json_int_t)b->size));
	if (b->state == BLOB_MISMATCH || b->state == BLOB_FAILED)
		json_array_append_new(s->flagged, json_pack("{s:s, s:s, s:s, s:s}", "key", b->key,
			"id", b->id, "state", blob_state_name(b->state), "reason", b->reason));
}

static json_t *control_status(struct control *c, json_t *req)
{
	const char *path = json_string_value(json_object_get(req, "path"));
	char norm[PATH_MAX], repo[PATH_MAX];
	struct sums sums = { .copies = json_array(), .flagged = json_array() };
	struct store_usage u;
	json_t *repos = json_array();

	if (path && (path[0] == '/' || path_normalize(path, norm, sizeof(norm)) < 0)) {
		json_decref(repos);
		json_decref(sums.copies);
		json_decref(sums.flagged);
		return error_reply(EINVAL, "%s: not a path inside the mount %s", path, c->mount);
	}
	if (path && *norm) {
		struct ns_entry *e = malloc(sizeof(*e));
		int r = e ? ns_classify(c->roots, norm, e) : -ENOMEM;

		free(e);
		if (r < 0) {
			json_decref(repos);
			json_decref(sums.copies);
			json_decref(sums.flagged);
			return error_reply(-r, "%s: %s", norm, strerror(-r));
		}
		snprintf(repo, sizeof(repo), "%.*s", (int)strcspn(norm, "/"), norm);
		json_array_append_new(repos, repo_json(c, repo));
	} else {
		DIR *d = opendir(c->roots->path[0]);
		struct dirent *de;

		while (d && (de = readdir(d)))
			if (de->d_name[0] != '.' && strstr(de->d_name, "--") &&
			    de->d_type == DT_DIR)
				json_array_append_new(repos, repo_json(c, de->d_name));
		if (d)
			closedir(d);
	}
	store_each(c->store, sum_blob, &sums);
	store_usage(c->store, &u);
	return json_pack("{s:b, s:s, s:s, s:s, s:o, s:o, s:{s:I, s:I, s:I}, s:o, "
			 "s:{s:I, s:I, s:I, s:I, s:I}}",
		"ok", 1, "nas", c->roots->path[0], "local", c->local, "mount", c->mount,
		"repos", repos, "copies", sums.copies,
		"served", "local_bytes", sums.local_bytes, "nas_bytes", sums.nas_bytes,
		"opens", sums.opens,
		"flagged", sums.flagged,
		"store", "blobs", (json_int_t)u.blobs, "bytes", (json_int_t)u.bytes,
		"free_bytes", (json_int_t)u.free_bytes, "queued", (json_int_t)u.queued,
		"copying", (json_int_t)u.copying);
}

static int changes_state(const char *op, json_t *req)
{
	if (!strcmp(op, "promote"))
		return !json_is_true(json_object_get(req, "dry_run"));
	return !strcmp(op, "evict") || !strcmp(op, "pin") || !strcmp(op, "unpin") ||
	       !strcmp(op, "verify");
}

char *control_handle(struct control *c, const char *line, size_t len, uid_t peer)
{
	json_error_t jerr;
	json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr), *rep;
	const char *op;
	char *out;

	if (!req || !json_is_object(req)) {
		rep = error_reply(EINVAL, "malformed request: %s", req ? "not an object" : jerr.text);
	} else if (!(op = json_string_value(json_object_get(req, "op")))) {
		rep = error_reply(EINVAL, "request has no \"op\"");
	} else if (changes_state(op, req) && peer != 0 && peer != c->owner) {
		rep = error_reply(EPERM, "%s: only root or the mount's owner (uid %u) may do this",
				  op, (unsigned)c->owner);
	} else if (!strcmp(op, "status")) {
		rep = control_status(c, req);
	} else if (!strcmp(op, "promote")) {
		rep = op_promote(c, req);
	} else if (!strcmp(op, "progress")) {
		rep = op_progress(c, req);
	} else if (!strcmp(op, "evict") || !strcmp(op, "pin") || !strcmp(op, "unpin") ||
		   !strcmp(op, "verify")) {
		rep = op_each(c, req, op);
	} else {
		rep = error_reply(EINVAL, "unknown op \"%s\"", op);
	}
	json_decref(req);
	if (!rep)
		rep = error_reply(ENOMEM, "out of memory");
	out = json_dumps(rep, JSON_COMPACT);
	json_decref(rep);
	return out;
}

/* ---- the socket ---- */

static void serve_one(struct control *c, int fd)
{
	char *buf = malloc(CONTROL_MAX_REQUEST + 1), *rep = NULL;
	struct timeval tv = { .tv_sec = 5 };
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	size_t len = 0;
	char *nl = NULL;

	if (!buf)
		return;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		free(buf);
		return;
	}
	while (len < CONTROL_MAX_REQUEST && !nl) {
		ssize_t n = read(fd, buf + len, CONTROL_MAX_REQUEST - len);

		if (n <= 0)
			break;
		buf[len + (size_t)n] = '\0';
		nl = memchr(buf + len, '\n', (size_t)n);
		len += (size_t)n;
	}
	if (!nl && len >= CONTROL_MAX_REQUEST) {
		json_t *e = error_reply(E2BIG, "request larger than %d bytes", CONTROL_MAX_REQUEST);

		rep = json_dumps(e, JSON_COMPACT);
		json_decref(e);
	} else if (len > 0) {
		rep = control_handle(c, buf, nl ? (size_t)(nl - buf) : len, cred.uid);
	}
	if (rep) {
		size_t rl = strlen(rep);

		rep[rl] = '\0';
		if (write(fd, rep, rl) == (ssize_t)rl)
			(void)!write(fd, "\n", 1);
	}
	free(rep);
	free(buf);
}

struct conn {
	struct control *c;
	int fd;
};

/* One thread per client: a long "verify --full" must not hold up the
 * progress polls of a "promote --wait". */
static void *serve_conn(void *arg)
{
	struct conn *k = arg;
	struct control *c = k->c;

	serve_one(c, k->fd);
	close(k->fd);
	free(k);
	pthread_mutex_lock(&c->lock);
	c->active--;
	pthread_cond_broadcast(&c->idle);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

static void *serve(void *arg)
{
	struct control *c = arg;
	struct pollfd pfd[2] = {
		{ .fd = c->listen_fd, .events = POLLIN },
		{ .fd = c->wake[0], .events = POLLIN },
	};

	for (;;) {
		struct conn *k;
		pthread_t t;
		int fd;

		if (poll(pfd, 2, -1) < 0)
			continue;
		if (pfd[1].revents)
			break;
		fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		k = malloc(sizeof(*k));
		pthread_mutex_lock(&c->lock);
		c->active++;
		pthread_mutex_unlock(&c->lock);
		if (k) {
			k->c = c;
			k->fd = fd;
			if (pthread_create(&t, NULL, serve_conn, k) == 0) {
				pthread_detach(t);
				continue;
			}
			free(k);
		}
		serve_one(c, fd); /* no thread to be had: serve it here */
		close(fd);
		pthread_mutex_lock(&c->lock);
		c->active--;
		pthread_mutex_unlock(&c->lock);
	}
	/* The store goes away after us: wait for the clients being served. */
	pthread_mutex_lock(&c->lock);
	while (c->active)
		pthread_cond_wait(&c->idle, &c->lock);
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int control_bind(struct control *c)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int r;

	if (snprintf(c->sock_path, sizeof(c->sock_path), "%s/wfs.sock", c->local) >=
	    (int)sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, c->sock_path);
	c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->listen_fd < 0)
		return -errno;
	unlink(c->sock_path); /* a stale socket: the store lock says we own it */
	if (bind(c->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(c->sock_path, 0666) < 0 || listen(c->listen_fd, 64) < 0 ||
	    pipe2(c->wake, O_CLOEXEC) < 0) {
		r = -errno;
		close(c->listen_fd);
		c->listen_fd = -1;
		return r;
	}
	return 0;
}

int control_start(struct control *c)
{
	int r;

	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->idle, NULL);
	r = pthread_create(&c->thread, NULL, serve, c);

	if (r)
		return -r;
	c->running = 1;
	return 0;
}

void control_stop(struct control *c)
{
	if (!c->running) {
		if (c->listen_fd > 0) { /* bound, never served */
			close(c->listen_fd);
			close(c->wake[0]);
			close(c->wake[1]);
			unlink(c->sock_path);
			c->listen_fd = -1;
		}
		return;
	}
	(void)!write(c->wake[1], "x", 1);
	pthread_join(c->thread, NULL);
	close(c->listen_fd);
	close(c->wake[0]);
	close(c->wake[1]);
	unlink(c->sock_path);
	c->running = 0;
}
