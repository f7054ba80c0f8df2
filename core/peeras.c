/* peeras.c - a request of another user run with its file identity
 * (peeras.h). */
#include "peeras.h"

#include <errno.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int peer_id_read(int fd, struct peer_id *p)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return -errno;
	p->uid = cred.uid;
	p->gid = cred.gid;
	len = sizeof(p->groups);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, p->groups, &len) == 0)
		p->ngroups = (int)(len / sizeof(gid_t));
	else if (errno == ERANGE) /* more than we keep: the first ones */
		p->ngroups = PEER_GROUPS_MAX;
	else
		p->ngroups = -1;
	return 0;
}

/* The thread's own: glibc's setgroups() would change every thread's. */
static int thread_setgroups(int n, const gid_t *g)
{
	return syscall(SYS_setgroups, (size_t)n, g) < 0 ? -errno : 0;
}

int peer_as_begin(const struct peer_id *p, struct peer_saved *s)
{
	int r;

	s->active = 0;
	if (geteuid() != 0)
		return 0; /* (peeras.h: runs as the daemon's own user) */
	s->fsuid = geteuid();
	s->fsgid = getegid();
	s->ngroups = getgroups(PEER_GROUPS_MAX, s->groups);
	if (s->ngroups < 0)
		return -errno;
	r = thread_setgroups(p->ngroups > 0 ? p->ngroups : 0, p->groups);
	/* (a user namespace whose setgroups is denied: the daemon's own
	 * groups stay -- root's, group 0 as a rule -- and what that group
	 * may read stays readable to the request; the rest is the peer's) */
	if (r < 0 && r != -EPERM)
		return r;
	s->groups_set = r == 0;
	/* setfsgid/setfsuid answer the previous value, not an error: read back */
	setfsgid(p->gid);
	setfsuid(p->uid);
	s->active = 1;
	if ((uid_t)setfsuid((uid_t)-1) != p->uid || (gid_t)setfsgid((gid_t)-1) != p->gid) {
		peer_as_end(s);
		return -EPERM;
	}
	return 0;
}

void peer_as_end(struct peer_saved *s)
{
	if (!s->active)
		return;
	setfsuid(s->fsuid);
	setfsgid(s->fsgid);
	if (s->groups_set)
		(void)thread_setgroups(s->ngroups, s->groups);
	s->active = 0;
}
