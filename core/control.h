/* control.h - the control server: JSON lines over a unix socket.
 *
 * One request object per line, one reply object per line (the protocol is
 * in README.md "Control protocol").  Requests that change state need the
 * peer (SO_PEERCRED) to be root or the mount's owner.  A malformed or
 * oversized request gets an error reply; nothing a client sends can stop
 * the server.
 */
#ifndef WFS_CONTROL_H
#define WFS_CONTROL_H

#include "resolve.h"
#include "store.h"

struct pins;

#include <pthread.h>
#include <sys/types.h>

#define CONTROL_MAX_REQUEST (64 * 1024)

/* Fields are set before control_start and read-only after it, except
 * @active and @running (under @lock). */
struct control {
	const struct hub_roots *roots;
	struct store *store;
	struct pins *pins;  /* NULL: no ref pins */
	const char *mount, *local;
	uid_t owner;
	char sock_path[PATH_MAX];
	int listen_fd, wake[2];
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t idle;
	int active; /* clients being served */
	int running;
};

/* Bind LOCAL/wfs.sock (clients may connect at once; they wait for
 * control_start()), then serve it from a thread.  Both return -errno. */
int control_bind(struct control *c);
int control_start(struct control *c);
void control_stop(struct control *c);

/* Handle one request line (exposed for tests): returns a malloc'ed reply
 * line without the newline. */
char *control_handle(struct control *c, const char *line, size_t len, uid_t peer);

#endif
