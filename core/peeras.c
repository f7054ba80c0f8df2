/* peeras.c - a request of another user run with its file identity
 * (peeras.h). */
#include "peeras.h"

#include <errno.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The identity this thread left for a peer's (peer_as_begin), while it
 * runs as that peer; NULL otherwise.  Per thread by nature, as the
 * identity itself is: what a thread it starts takes back (thread.c). */
static __thread const struct peer_self *as_left;

int peer_id_read(int fd, struct peer_id *p)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	memset(p, 0, sizeof(*p));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return -errno;
	p->uid = cred.uid;
	p->gid = cred.gid;
	len = sizeof(p->groups);
	/* (ERANGE, more groups than we keep: nothing was copied; none is
	 * taken, the peer's uid and gid alone decide) */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, p->groups, &len) == 0)
		p->ngroups = (int)(len / sizeof(gid_t));
	return 0;
}

/* The thread's own: glibc's setgroups() would change every thread's. */
static int thread_setgroups(int n, const gid_t *g)
{
#ifdef SYS_setgroups32
	long r = syscall(SYS_setgroups32, (size_t)n, g);
#else
	long r = syscall(SYS_setgroups, (size_t)n, g);
#endif
	return r < 0 ? -errno : 0;
}

int peer_self_read(struct peer_self *s)
{
	memset(s, 0, sizeof(*s));
	if (geteuid() != 0)
		return 0; /* (peeras.h: runs as the daemon's own user) */
	s->fsuid = (uid_t)setfsuid((uid_t)-1);
	s->fsgid = (gid_t)setfsgid((gid_t)-1);
	s->ngroups = getgroups(PEER_GROUPS_MAX, s->groups);
	if (s->ngroups < 0)
		return -errno;
	s->valid = 1;
	return 0;
}

void peer_self_take(const struct peer_self *s)
{
	if (!s->valid)
		return;
	setfsuid(s->fsuid); /* first: the file capabilities come back with 0 */
	setfsgid(s->fsgid);
	(void)thread_setgroups(s->ngroups, s->groups); /* (denied: as it was) */
}

int peer_as_begin(const struct peer_id *p, struct peer_self *s)
{
	int r = peer_self_read(s);

	if (r < 0 || !s->valid)
		return r;
	r = thread_setgroups(p->ngroups, p->groups);
	/* (a user namespace whose setgroups is denied: the daemon's own
	 * groups stay -- root's, group 0 as a rule -- and what that group
	 * may read stays readable to the request; the rest is the peer's) */
	if (r < 0 && r != -EPERM) {
		s->valid = 0;
		return r;
	}
	/* setfsgid/setfsuid answer the previous value, not an error: read back */
	setfsgid(p->gid);
	setfsuid(p->uid);
	if ((uid_t)setfsuid((uid_t)-1) != p->uid || (gid_t)setfsgid((gid_t)-1) != p->gid) {
		peer_as_end(s);
		return -EPERM;
	}
	as_left = s;
	return 0;
}

void peer_as_end(struct peer_self *s)
{
	/* (groups it could not set at the start, it cannot now: as they were) */
	peer_self_take(s);
	s->valid = 0;
	as_left = NULL;
}

const struct peer_self *peer_as_left(void)
{
	return as_left;
}

int peer_as_other(void)
{
	return (uid_t)setfsuid((uid_t)-1) != geteuid();
}
