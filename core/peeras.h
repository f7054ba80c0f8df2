/* peeras.h - a control request of another user walks the NAS as that user.
 *
 * The daemon runs as root, and every user may ask it for a status, a
 * doctor or a promote dry run, each of which walks the NAS: as root, a
 * user who gets EACCES listing a repo through the mount learnt its
 * revisions, file names, sizes and blob ids through the socket.  So the
 * worker thread that runs such a request's op takes the peer's file-system
 * identity for the op's length: its fsuid, fsgid and supplementary groups,
 * as the kernel gave them at connect (SO_PEERCRED, SO_PEERGROUPS).  The
 * NAS then answers it what it answers that user (EACCES), with no
 * permission logic of ours to get wrong.
 *
 * Rules:
 *  - Per thread only: setfsuid/setfsgid are, and the groups are set by the
 *    raw system call (glibc's setgroups() changes every thread's).
 *  - Around the op alone, not what follows it: the index write a request
 *    may be followed by is the daemon's (control_run).
 *  - A thread started by a thread under another identity inherits it, for
 *    good: the NAS gate's threads, started on demand by a call (nas_call),
 *    ran as the first peer whose request started them, and every NAS call
 *    after with them.  So thread_start (thread.h) starts every thread
 *    with the identity its creator left for the peer's (peer_as_left):
 *    no thread outlives a request with the peer's identity.
 *  - peer_as_end() puts the daemon's fsuid back first (a fsuid of 0 brings
 *    the file capabilities back), the groups last.
 *  - A daemon that is not root cannot take another identity: its requests
 *    run as it is (its own files are what it can read anyway).  One whose
 *    setgroups is denied (a user namespace) keeps its own groups.
 */
#ifndef WFS_PEERAS_H
#define WFS_PEERAS_H

#include <sys/types.h>

#define PEER_GROUPS_MAX 64

struct peer_id {
	uid_t uid;
	gid_t gid;
	int ngroups; /* 0 when not known, or more than PEER_GROUPS_MAX (then
		      * uid and gid alone: never more than the peer has) */
	gid_t groups[PEER_GROUPS_MAX];
};

/* The identity of the peer of the connected unix socket @fd.  0 or
 * -errno (no SO_PEERCRED: the caller refuses the connection). */
int peer_id_read(int fd, struct peer_id *p);

/* A thread's file identity. */
struct peer_self {
	int valid;      /* read (a root daemon), and to be put back */
	uid_t fsuid;
	gid_t fsgid;
	int ngroups;
	gid_t groups[PEER_GROUPS_MAX];
};

/* This thread's file identity, when it is root's (else not valid: nothing
 * is ever taken).  0 or -errno (more than PEER_GROUPS_MAX groups). */
int peer_self_read(struct peer_self *s);

/* Take @s (peer_self_read's, of another thread) on this thread. */
void peer_self_take(const struct peer_self *s);

/* Take @p's file-system identity on this thread, the thread's own saved
 * in @s.  0, or -errno with nothing changed (the caller refuses the
 * request then). */
int peer_as_begin(const struct peer_id *p, struct peer_self *s);

/* Back to the identity peer_as_begin saved. */
void peer_as_end(struct peer_self *s);

/* The identity this thread left for the peer's (peer_as_begin's @s),
 * while it runs as the peer; NULL otherwise. */
const struct peer_self *peer_as_left(void);

/* Does this thread run as another user now (between peer_as_begin and
 * peer_as_end)?  What the store and the record know -- their copies,
 * flagged and held blobs, partial files, ref pins, local revisions -- is
 * no walk the NAS checks as that user: an op leaves it out then. */
int peer_as_other(void);

#endif
