/* peeras.h - a control request of another user walks the NAS as that user.
 *
 * The daemon runs as root, and every user may ask it for a status, a
 * doctor or a promote dry run, each of which walks the NAS: as root, a
 * user who gets EACCES listing a repo through the mount learnt its
 * revisions, file names, sizes and blob ids through the socket.  So the
 * worker thread that runs such a request takes the peer's file-system
 * identity for its length: its fsuid, fsgid and supplementary groups, as
 * the kernel gave them at connect (SO_PEERCRED, SO_PEERGROUPS).  The NAS
 * then answers it what it answers that user (EACCES), with no permission
 * logic of ours to get wrong.
 *
 * Rules: per thread only -- setfsuid/setfsgid are, and the groups are set
 * by the raw system call (glibc's setgroups() changes every thread of the
 * process); the walks these requests make run on the calling thread (no
 * NAS call of theirs goes to a NAS thread but the gate's root probe, a
 * statvfs of NAS_HUB); nothing they open is kept past the request.
 * peer_as_end() puts root back first (a fsuid of 0 brings the file
 * capabilities back) and the groups last.  A daemon that is not root
 * cannot take another identity: its requests run as it is (its own
 * files are what it can read anyway).
 */
#ifndef WFS_PEERAS_H
#define WFS_PEERAS_H

#include <sys/types.h>

#define PEER_GROUPS_MAX 64

struct peer_id {
	uid_t uid;
	gid_t gid;
	int ngroups;                    /* -1: not known (then only uid and gid) */
	gid_t groups[PEER_GROUPS_MAX];
};

/* The identity of the peer of the connected unix socket @fd.  0 or
 * -errno (no SO_PEERCRED: the caller refuses the connection).  More
 * supplementary groups than PEER_GROUPS_MAX: the first ones. */
int peer_id_read(int fd, struct peer_id *p);

struct peer_saved {
	int active, groups_set;
	uid_t fsuid;
	gid_t fsgid;
	int ngroups;
	gid_t groups[PEER_GROUPS_MAX];
};

/* Take @p's file-system identity on this thread.  0, or -errno with
 * nothing changed (the caller refuses the request then). */
int peer_as_begin(const struct peer_id *p, struct peer_saved *s);

/* Back to the daemon's own identity (what peer_as_begin found). */
void peer_as_end(struct peer_saved *s);

#endif
