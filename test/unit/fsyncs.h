/* fsyncs.h - which paths the code under test fsyncs, for a test of the
 * order of its syncs.  Include in one file of a test linked with
 * -Wl,--wrap=fsync (the calls of core/ go through __wrap_fsync then);
 * set fsyncs_seen, run the code, clear it, ask fsynced(). */
#ifndef WFS_FSYNCS_H
#define WFS_FSYNCS_H

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { FSYNCS_MAX = 64 };
/* fsyncs_lock: any of the store's threads may fsync meanwhile */
static pthread_mutex_t fsyncs_lock = PTHREAD_MUTEX_INITIALIZER;
static char fsyncs[FSYNCS_MAX][PATH_MAX];
static int fsyncs_n, fsyncs_seen;
/* Called once (then cleared) after the next fsync of a directory, with
 * its path: a test's hook into the moment after a rename is made durable
 * (no store lock held there). */
static void (*fsyncs_dir_hook)(const char *path);

int __real_fsync(int fd);
int __wrap_fsync(int fd);
int __wrap_fsync(int fd)
{
	char link[64], dir[PATH_MAX];
	void (*hook)(const char *) = NULL;
	struct stat st;
	ssize_t n;
	int r;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	pthread_mutex_lock(&fsyncs_lock);
	if (fsyncs_seen && fsyncs_n < FSYNCS_MAX &&
	    (n = readlink(link, fsyncs[fsyncs_n], PATH_MAX - 1)) > 0)
		fsyncs[fsyncs_n++][n] = '\0';
	pthread_mutex_unlock(&fsyncs_lock);
	r = __real_fsync(fd);
	if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
		hook = __atomic_exchange_n(&fsyncs_dir_hook, NULL, __ATOMIC_ACQ_REL);
	if (hook && (n = readlink(link, dir, sizeof(dir) - 1)) > 0) {
		dir[n] = '\0';
		hook(dir);
	}
	return r;
}

/* Start (@on 1) or stop (0) noting the paths fsynced; a start forgets
 * what was noted before. */
static inline void fsyncs_watch(int on)
{
	pthread_mutex_lock(&fsyncs_lock);
	if (on)
		fsyncs_n = 0;
	fsyncs_seen = on;
	pthread_mutex_unlock(&fsyncs_lock);
}

/* Was @path fsynced while watched? */
static inline int fsynced(const char *path)
{
	int found = 0;

	pthread_mutex_lock(&fsyncs_lock);
	for (int i = 0; i < fsyncs_n && !found; i++)
		found = !strcmp(fsyncs[i], path);
	pthread_mutex_unlock(&fsyncs_lock);
	return found;
}

#endif
