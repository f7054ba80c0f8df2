/* control_server.c - the control socket: one poll thread and a fixed pool
 * of CONTROL_WORKERS workers, the limits on what clients may hold
 * (control.h), and stop.  What a request means and who may make it is
 * control.c.
 *
 * The poll thread accepts (or refuses, with a reply, past the caps), reads
 * each request line, answers at once what needs no worker (malformed,
 * unknown, not permitted), queues the rest and sends the replies the
 * workers leave in control.done.  It never waits for a client, so a client
 * that never sends, never reads, or sends a byte at a time costs a slot
 * until its deadline, never a thread.
 */
#include "control_int.h"
#include "clock.h"
#include "peeras.h"
#include "reply.h"
#include "stopby.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

enum conn_state {
	CONN_READING,  /* the poll thread's: the request line is coming */
	CONN_WORKING,  /* the workers': queued, running, or the reply in control.done */
	CONN_WRITING,  /* the poll thread's: the reply is going out */
};

/* One client.  @fd, @uid, @privileged, @slot are set at accept and read-only
 * after; the others belong to whoever owns it now (struct control). */
struct control_conn {
	int fd, slot;
	uid_t uid;
	struct peer_id peer;        /* who connected: another user's walks run as it (peeras.h) */
	int privileged;             /* root or the mount's owner */
	enum conn_state state;      /* written by the poll thread only */
	int64_t deadline;           /* CLOCK_MONOTONIC ms: the request or the reply by then */
	char *buf;                  /* the request so far; then the reply line */
	size_t len, cap, off;       /* @off: bytes of the reply sent */
	json_t *req;                /* the request, for its worker */
	const struct control_op *o;
	struct control_conn *next;  /* in control.queue or control.done */
};

/* Accepts per wake-up at most (and the listen backlog): a connect flood
 * cannot keep the poll thread from the clients it has. */
#define ACCEPT_BURST 64
/* How often a worker looks again at requests the limits hold back. */
#define QUEUE_LOOK_MS 200
/* When accept fails for want of descriptors or memory, the listener is left
 * alone this long (it stays readable: polling it would spin). */
#define ACCEPT_PAUSE_MS 100

static void wake_poll(struct control *c)
{
	/* the pipe is non-blocking: when it is full a wake-up is pending anyway */
	(void)!write(c->wake[1], "w", 1);
}

/* The first queued request the limits let run now (with c->lock). */
static struct control_conn *take_request(struct control *c)
{
	for (struct control_conn **pp = &c->queue; *pp; pp = &(*pp)->next) {
		struct control_conn *k = *pp;

		k->o = control_recheck(c, k->o);
		if ((!k->privileged && c->running_other >= CONTROL_WORKERS_OTHER) ||
		    (control_op_long(k->o) && c->running_slow >= CONTROL_WORKERS_SLOW))
			continue;
		*pp = k->next;
		k->next = NULL;
		return k;
	}
	return NULL;
}

static void *worker(void *arg)
{
	struct control *c = arg;
	struct control_conn *k = NULL;

	pthread_setname_np(pthread_self(), "wfs-ctl-work");
	pthread_mutex_lock(&c->lock);
	for (;;) {
		json_t *rep;

		while (!c->stopping && !(k = take_request(c))) {
			/* Requests held back by the limits (walks behind walks a
			 * hung NAS holds) are looked at again as the NAS goes
			 * down (control_recheck), which nothing signals here. */
			struct timespec ts = mono_timespec(mono_ms() + QUEUE_LOOK_MS);

			if (c->queue)
				pthread_cond_timedwait(&c->work, &c->lock, &ts);
			else
				pthread_cond_wait(&c->work, &c->lock);
		}
		if (c->stopping)
			break; /* control_stop drops what is still queued */
		c->running_other += !k->privileged;
		c->running_slow += control_op_long(k->o);
		pthread_mutex_unlock(&c->lock);

		/* another user's op walks the NAS as that user (peeras.h) */
		rep = control_run(c, k->o, k->req, k->privileged ? NULL : &k->peer);
		json_decref(k->req);
		k->req = NULL;
		/* NULL (out of memory): the poll thread just closes */
		k->buf = control_reply_line(rep, 1, &k->len);
		k->off = 0;

		pthread_mutex_lock(&c->lock);
		c->running_other -= !k->privileged;
		c->running_slow -= control_op_long(k->o);
		k->next = c->done;
		c->done = k;
		/* a request the limits held back may run now */
		pthread_cond_broadcast(&c->work);
		wake_poll(c);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* The poll thread's connections, by slot. */
struct server {
	struct control *c;
	struct control_conn *slot[CONTROL_MAX_CONNS];
};

static void conn_free(struct control_conn *k)
{
	close(k->fd);
	free(k->buf);
	json_decref(k->req);
	free(k);
}

static void conn_close(struct server *sv, int i)
{
	struct control_conn *k = sv->slot[i];

	atomic_fetch_sub_explicit(&sv->c->conns, 1, memory_order_relaxed);
	if (!k->privileged)
		atomic_fetch_sub_explicit(&sv->c->conns_other, 1, memory_order_relaxed);
	conn_free(k);
	sv->slot[i] = NULL;
}

/* Send what the client takes now; close once all is sent or it failed. */
static void conn_send(struct server *sv, int i)
{
	struct control_conn *k = sv->slot[i];

	while (k->buf && k->off < k->len) {
		ssize_t n = send(k->fd, k->buf + k->off, k->len - k->off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return; /* POLLOUT, or the deadline */
		if (n <= 0)
			break;
		k->off += (size_t)n;
	}
	conn_close(sv, i);
}

/* Answer with @line (malloc'ed, with its newline; NULL: just close). */
static void conn_reply(struct server *sv, int i, char *line, size_t len)
{
	struct control_conn *k = sv->slot[i];

	free(k->buf);
	k->buf = line;
	k->len = len;
	k->off = 0;
	k->state = CONN_WRITING;
	k->deadline = store_now_ms() + CONTROL_REPLY_TIMEOUT_MS;
	conn_send(sv, i);
}

/* Read what the client sent; once the request line is whole, answer it at
 * once or queue it for a worker. */
static void conn_recv(struct server *sv, int i)
{
	struct control *c = sv->c;
	struct control_conn *k = sv->slot[i], **pp;
	const struct control_op *o;
	char *nl = NULL, *line;
	json_t *req, *rep;
	size_t len = 0;

	for (;;) {
		ssize_t n;

		if (k->len == k->cap) {
			size_t cap = k->cap ? k->cap * 4 : 1024;
			char *b;

			if (k->cap >= CONTROL_MAX_REQUEST)
				break; /* too long: answered below */
			cap = cap < CONTROL_MAX_REQUEST ? cap : CONTROL_MAX_REQUEST;
			b = realloc(k->buf, cap);
			if (!b) {
				conn_close(sv, i);
				return;
			}
			k->buf = b;
			k->cap = cap;
		}
		n = recv(k->fd, k->buf + k->len, k->cap - k->len, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return; /* the rest of the line is still to come */
		if (n < 0 || (n == 0 && !k->len)) {
			conn_close(sv, i); /* gone before a byte: nothing to answer */
			return;
		}
		if (n == 0)
			break; /* the client ended its request without a newline */
		nl = memchr(k->buf + k->len, '\n', (size_t)n);
		k->len += (size_t)n;
		if (nl) {
			k->len = (size_t)(nl - k->buf);
			break;
		}
	}
	if (!nl && k->len >= CONTROL_MAX_REQUEST) {
		line = control_reply_line(reply_error(E2BIG, "request larger than %d bytes",
						      CONTROL_MAX_REQUEST), 1, &len);
		conn_reply(sv, i, line, len);
		return;
	}
	o = control_check(c, k->buf, k->len, k->uid, &req, &rep);
	free(k->buf);
	k->buf = NULL;
	k->len = k->cap = 0;
	if (!o) {
		line = control_reply_line(rep, 1, &len);
		conn_reply(sv, i, line, len);
		return;
	}
	k->req = req;
	k->o = o;
	k->state = CONN_WORKING;
	pthread_mutex_lock(&c->lock);
	for (pp = &c->queue; *pp; pp = &(*pp)->next)
		;
	*pp = k;
	/* one is enough: the workers waiting are alike */
	pthread_cond_signal(&c->work);
	pthread_mutex_unlock(&c->lock);
}

static void conn_timeout(struct server *sv, int i)
{
	struct control_conn *k = sv->slot[i];
	char *line;
	size_t len = 0;

	atomic_fetch_add_explicit(&sv->c->timed_out, 1, memory_order_relaxed);
	if (k->state == CONN_READING) {
		/* say why, if the client listens; never waited for */
		line = control_reply_line(reply_error(ETIMEDOUT,
			"no complete request line within %d s", CONTROL_REQUEST_TIMEOUT_MS / 1000),
			1, &len);
		if (line)
			(void)!send(k->fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		free(line);
	}
	conn_close(sv, i);
}

/* Why a connection from @uid is refused (0: admitted into *@slot), with
 * the message in @msg. */
static int admit(struct server *sv, uid_t uid, int *slot, char *msg, size_t sz)
{
	int free_slot = -1, same = 0, other = 0;

	for (int i = 0; i < CONTROL_MAX_CONNS; i++) {
		struct control_conn *k = sv->slot[i];

		if (!k) {
			free_slot = free_slot < 0 ? i : free_slot;
			continue;
		}
		same += k->uid == uid;
		other += !k->privileged;
	}
	if (free_slot < 0)
		snprintf(msg, sz, "too many connections (at most %d at once): try again later",
			 CONTROL_MAX_CONNS);
	else if (!control_privileged(sv->c, uid) && same >= CONTROL_MAX_CONNS_PER_UID)
		snprintf(msg, sz, "too many connections from uid %u (at most %d at once): "
			 "try again later", (unsigned)uid, CONTROL_MAX_CONNS_PER_UID);
	else if (!control_privileged(sv->c, uid) && other >= CONTROL_MAX_CONNS_OTHER)
		snprintf(msg, sz, "too many connections from users other than root and the "
			 "mount's owner (at most %d at once): try again later",
			 CONTROL_MAX_CONNS_OTHER);
	else {
		*slot = free_slot;
		snprintf(msg, sz, "out of memory: try again later"); /* if calloc fails */
		return 0;
	}
	return -EAGAIN;
}

static void accept_some(struct server *sv, int64_t *pause_until)
{
	struct control *c = sv->c;

	for (int n = 0; n < ACCEPT_BURST; n++) {
		struct peer_id peer = { 0 };
		struct control_conn *k;
		char msg[256], *line;
		size_t len = 0;
		int i, fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0 && (errno == EINTR || errno == ECONNABORTED))
			continue;
		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				*pause_until = store_now_ms() + ACCEPT_PAUSE_MS;
			return;
		}
		atomic_fetch_add_explicit(&c->accepted, 1, memory_order_relaxed);
		if (peer_id_read(fd, &peer) < 0) {
			close(fd);
			continue;
		}
		k = admit(sv, peer.uid, &i, msg, sizeof(msg)) < 0 ? NULL : calloc(1, sizeof(*k));
		if (!k) {
			/* a fresh socket's buffer takes the line: never waited for */
			line = control_reply_line(reply_error(EAGAIN, "%s", msg), 1, &len);
			if (line)
				(void)!send(fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT);
			free(line);
			close(fd);
			atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
			continue;
		}
		k->fd = fd;
		k->slot = i;
		k->uid = peer.uid;
		k->peer = peer;
		k->privileged = control_privileged(c, peer.uid);
		k->state = CONN_READING;
		k->deadline = store_now_ms() + CONTROL_REQUEST_TIMEOUT_MS;
		sv->slot[i] = k;
		atomic_fetch_add_explicit(&c->conns, 1, memory_order_relaxed);
		if (!k->privileged)
			atomic_fetch_add_explicit(&c->conns_other, 1, memory_order_relaxed);
	}
}

/* Replies the workers finished: start sending them.  Returns 1 when the
 * server is stopping. */
static int take_done(struct server *sv)
{
	struct control *c = sv->c;
	struct control_conn *k, *next;
	char drain[64];
	int stop;

	while (read(c->wake[0], drain, sizeof(drain)) > 0)
		;
	pthread_mutex_lock(&c->lock);
	stop = c->stopping;
	k = stop ? NULL : c->done;
	if (!stop)
		c->done = NULL;
	pthread_mutex_unlock(&c->lock);
	for (; k; k = next) {
		next = k->next;
		k->next = NULL;
		k->state = CONN_WRITING;
		k->deadline = store_now_ms() + CONTROL_REPLY_TIMEOUT_MS;
		conn_send(sv, k->slot);
	}
	return stop;
}

static void *serve(void *arg)
{
	struct server sv = { .c = arg };
	struct control *c = sv.c;
	struct pollfd pfd[CONTROL_MAX_CONNS + 2];
	int at[CONTROL_MAX_CONNS + 2];
	int64_t pause_until = 0;

	pthread_setname_np(pthread_self(), "wfs-ctl");
	for (;;) {
		int64_t now = store_now_ms(), next = pause_until > now ? pause_until : -1;
		nfds_t n = 2;

		pfd[0] = (struct pollfd){ .fd = c->wake[0], .events = POLLIN };
		/* a negative fd is left out: the listener while paused */
		pfd[1] = (struct pollfd){ .fd = pause_until > now ? -1 : c->listen_fd,
					  .events = POLLIN };
		for (int i = 0; i < CONTROL_MAX_CONNS; i++) {
			struct control_conn *k = sv.slot[i];

			if (!k || k->state == CONN_WORKING)
				continue;
			pfd[n] = (struct pollfd){ .fd = k->fd,
				.events = k->state == CONN_READING ? POLLIN : POLLOUT };
			at[n++] = i;
			if (next < 0 || k->deadline < next)
				next = k->deadline;
		}
		if (poll(pfd, n, next < 0 ? -1 : next <= now ? 0 : (int)(next - now)) < 0)
			continue; /* EINTR: the set is rebuilt */
		if (pfd[0].revents && take_done(&sv))
			break;
		for (nfds_t j = 2; j < n; j++) {
			if (!pfd[j].revents)
				continue;
			if (sv.slot[at[j]]->state == CONN_READING)
				conn_recv(&sv, at[j]);
			else
				conn_send(&sv, at[j]);
		}
		now = store_now_ms();
		for (int i = 0; i < CONTROL_MAX_CONNS; i++)
			if (sv.slot[i] && sv.slot[i]->state != CONN_WORKING &&
			    sv.slot[i]->deadline <= now)
				conn_timeout(&sv, i);
		if (pfd[1].revents)
			accept_some(&sv, &pause_until);
	}
	/* What is the poll thread's goes now; what the workers hold, control_stop
	 * drops once they are done. */
	for (int i = 0; i < CONTROL_MAX_CONNS; i++)
		if (sv.slot[i] && sv.slot[i]->state != CONN_WORKING)
			conn_close(&sv, i);
	return NULL;
}

/* 0666 on the socket bind just made, never on what a link there names
 * (chmod follows one): the file opened without following, checked to be
 * a socket, and changed through its descriptor's /proc name.  Without
 * /proc, by its path: the store is the daemon's own (startpaths.c), so no
 * other user can have put a link there. */
static int sock_chmod(const char *path)
{
	char proc[64];
	struct stat st;
	int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC), r = -1;

	if (fd < 0)
		return -1;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (fstat(fd, &st) < 0)
		;
	else if (!S_ISSOCK(st.st_mode))
		errno = EEXIST;
	else
		r = chmod(proc, 0666) == 0 || (errno == ENOENT && chmod(path, 0666) == 0) ? 0 : -1;
	close(fd);
	return r;
}

int control_bind(struct control *c)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int r, ro;

	if (snprintf(c->sock_path, sizeof(c->sock_path), "%s/wfs.sock", c->local) >=
	    (int)sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, c->sock_path);
	c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->listen_fd < 0)
		return -errno;
	/* A stale socket: the store lock says we own it.  One left by a daemon
	 * whose store turned read-only (ext4's errors=remount-ro after a disk
	 * error) cannot go: the store is read-only, whatever bind says. */
	ro = unlink(c->sock_path) < 0 && errno == EROFS;
	/* 0666: any local user may ask what is read-only (status, stats, doctor,
	 * progress, a dry run); every request that changes state is checked
	 * against the peer's SO_PEERCRED (control_check). */
	if (bind(c->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    sock_chmod(c->sock_path) < 0 || listen(c->listen_fd, ACCEPT_BURST) < 0 ||
	    pipe2(c->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		r = errno == EADDRINUSE && ro ? -EROFS : -errno;
		close(c->listen_fd);
		c->listen_fd = -1;
		return r;
	}
	return 0;
}

static void close_socket(struct control *c)
{
	close(c->listen_fd);
	close(c->wake[0]);
	close(c->wake[1]);
	unlink(c->sock_path);
	c->listen_fd = -1;
}

int control_start(struct control *c)
{
	pthread_condattr_t mono;
	int r;

	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&mono);
	pthread_condattr_setclock(&mono, CLOCK_MONOTONIC);
	pthread_cond_init(&c->work, &mono); /* the timed waits are on it */
	pthread_condattr_destroy(&mono);
	c->queue = c->done = NULL;
	c->running_other = c->running_slow = c->stopping = 0;
	c->nworkers = 0;
	r = thread_start(&c->thread, NULL, serve, c);
	if (r) {
		pthread_cond_destroy(&c->work);
		pthread_mutex_destroy(&c->lock);
		return r;
	}
	c->running = 1;
	c->thread_running = 1;
	while (c->nworkers < CONTROL_WORKERS &&
	       !(r = thread_start(&c->workers[c->nworkers], NULL, worker, c)))
		c->nworkers++;
	if (r) {
		control_stop(c);
		return r;
	}
	return 0;
}

void control_stop_tell(struct control *c)
{
	if (!c->running)
		return;
	pthread_mutex_lock(&c->lock);
	c->stopping = 1;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->lock);
	wake_poll(c);
}

int control_stop_by(struct control *c, int64_t deadline_ms)
{
	int left = 0;

	if (!c->running)
		return 0;
	control_stop_tell(c);
	/* A thread left behind is detached (stopby.h): its handle is dropped,
	 * never joined again by a second call. */
	if (c->thread_running)
		left |= join_by(c->thread, deadline_ms) < 0;
	c->thread_running = 0;
	/* Requests running finish (the store goes away after us) -- by the
	 * deadline: a walk of a frozen NAS is left behind. */
	for (unsigned i = 0; i < c->nworkers; i++)
		left |= join_by(c->workers[i], deadline_ms) < 0;
	c->nworkers = 0;
	if (!left)
		return 0;
	/* No new client: the socket's name goes now.  The descriptors stay
	 * open (a worker left behind still writes to the wake pipe; a number
	 * closed could be another file's by then). */
	unlink(c->sock_path);
	return -ETIMEDOUT;
}

void control_stop(struct control *c)
{
	struct control_conn *k;

	if (!c->running) {
		if (c->listen_fd > 0) /* bound, never served */
			close_socket(c);
		return;
	}
	control_stop_by(c, -1);
	while ((k = c->queue)) {
		c->queue = k->next;
		conn_free(k);
	}
	while ((k = c->done)) {
		c->done = k->next;
		if (k->buf)
			(void)!send(k->fd, k->buf, k->len, MSG_NOSIGNAL | MSG_DONTWAIT);
		conn_free(k);
	}
	close_socket(c);
	pthread_cond_destroy(&c->work);
	pthread_mutex_destroy(&c->lock);
	c->running = 0;
}
