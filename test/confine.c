/* confine.c - run a command with calls refused as a container may refuse
 * them, by a seccomp filter:
 *
 *   confine --no-io-uring | --no-io-uring-enter | --openat2=ENOSYS|EPERM |
 *           --no-backing-open | --ro-sys  COMMAND [ARG...]
 *
 * --no-io-uring: io_uring_setup, io_uring_enter and io_uring_register fail
 * with EPERM, as under Docker's default seccomp profile (since 25.0) or the
 * sysctl kernel.io_uring_disabled=2.  --no-io-uring-enter: io_uring_enter
 * alone fails: a ring is made, and nothing submitted on it ever reaches
 * the kernel (a profile that lists one call of the three; what a program
 * must not take a ring made for one that works).  --openat2=ERRNO: openat2
 * alone fails with ERRNO: ENOSYS as on a kernel before 5.6 or under a
 * profile that answers calls it does not list so, EPERM as Docker's
 * profile answers them (it listed openat2 only from 20.10).
 * --no-backing-open: the ioctl that gives the kernel a passthrough backing
 * file fails EPERM, as the kernel fails it for a daemon whose
 * CAP_SYS_ADMIN is not the initial user namespace's (a rootless
 * container).  --ro-sys is no filter: COMMAND runs in a mount namespace of
 * its own where /sys is read-only, as in a container (Docker mounts it
 * so); whatever it mounts reaches the caller's namespace only below a
 * shared mount (the tests bind their directory shared first).  Every other
 * call is allowed; the filter is inherited by
 * every thread and child (the daemon's fork into the background included)
 * and cannot be removed.  Only the sysctl would refuse io_uring without a
 * filter, and it is the machine's: the tests beside these use io_uring.
 * The tests run the daemon under it (test_confined.py, test_uring.py) and
 * unit tests of the parts that must do without (ringread_noenter,
 * nasopen_walk_*).
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define CONFINE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define CONFINE_ARCH AUDIT_ARCH_AARCH64
#else
#error "confine: add this architecture's AUDIT_ARCH_ value"
#endif

#define REFUSE(nr, err)                                          \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),         \
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((err) & SECCOMP_RET_DATA))
/* another architecture's calls (a 32-bit binary) have other numbers:
 * refused all rather than misread; then the call's number loaded */
#define CHECK_ARCH_LOAD_NR                                                              \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),        \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CONFINE_ARCH, 1, 0),                         \
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),     \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define ALLOW_THE_REST BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define PROG(f) { .len = sizeof(f) / sizeof((f)[0]), .filter = (f) }

static struct sock_filter io_uring_all[] = {
	CHECK_ARCH_LOAD_NR,
	REFUSE(__NR_io_uring_setup, EPERM),
	REFUSE(__NR_io_uring_enter, EPERM),
	REFUSE(__NR_io_uring_register, EPERM),
	ALLOW_THE_REST,
};
static struct sock_filter enter_only[] = {
	CHECK_ARCH_LOAD_NR,
	REFUSE(__NR_io_uring_enter, EPERM),
	ALLOW_THE_REST,
};
static struct sock_filter openat2_enosys[] = {
	CHECK_ARCH_LOAD_NR,
	REFUSE(__NR_openat2, ENOSYS),
	ALLOW_THE_REST,
};
static struct sock_filter openat2_eperm[] = {
	CHECK_ARCH_LOAD_NR,
	REFUSE(__NR_openat2, EPERM),
	ALLOW_THE_REST,
};

/* FUSE_DEV_IOC_BACKING_OPEN, _IOW(229, 1, struct fuse_backing_map): the
 * ioctl that gives the kernel a backing file for passthrough (not in
 * Debian 12's headers).  The command is the call's second argument; its
 * low 32 bits are compared (little-endian: the first word). */
#define BACKING_OPEN 0x4010e501u
static struct sock_filter backing_open_eperm[] = {
	CHECK_ARCH_LOAD_NR,
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, 3),
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, BACKING_OPEN, 0, 1),
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	ALLOW_THE_REST,
};

/* A mount namespace of our own (its mounts copies of the caller's, in the
 * same peer groups), /sys read-only in it: the remount changes this copy's
 * flag alone, never the caller's. */
static int ro_sys(void)
{
	if (unshare(CLONE_NEWNS) < 0) {
		fprintf(stderr, "confine: unshare(CLONE_NEWNS): %s\n", strerror(errno));
		return -1;
	}
	if (mount(NULL, "/sys", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0) {
		fprintf(stderr, "confine: remount /sys read-only: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

static const struct {
	const char *flag;
	struct sock_fprog prog; /* .len 0: no filter */
	int (*setup)(void);     /* or NULL */
} modes[] = {
	{ "--no-io-uring", PROG(io_uring_all), NULL },
	{ "--no-io-uring-enter", PROG(enter_only), NULL },
	{ "--openat2=ENOSYS", PROG(openat2_enosys), NULL },
	{ "--openat2=EPERM", PROG(openat2_eperm), NULL },
	{ "--no-backing-open", PROG(backing_open_eperm), NULL },
	{ "--ro-sys", { 0 }, ro_sys },
};
#define N_MODES (sizeof(modes) / sizeof(modes[0]))

static const char usage[] =
	"usage: confine MODE COMMAND [ARG...]\n"
	"Run COMMAND confined as a container may confine it: under a seccomp\n"
	"filter that refuses what MODE says (every other call allowed), or with\n"
	"/sys read-only.  MODE:\n"
	"  --no-io-uring        io_uring_setup, _enter, _register fail EPERM (Docker's\n"
	"                       default profile since 25.0, kernel.io_uring_disabled)\n"
	"  --no-io-uring-enter  io_uring_enter alone fails EPERM (rings are made,\n"
	"                       nothing submitted on them reaches the kernel)\n"
	"  --openat2=ENOSYS     openat2 fails ENOSYS (a kernel before 5.6)\n"
	"  --openat2=EPERM      openat2 fails EPERM (a profile older than the call)\n"
	"  --no-backing-open    the ioctl FUSE_DEV_IOC_BACKING_OPEN fails EPERM (no\n"
	"                       CAP_SYS_ADMIN in the initial namespace: passthrough refused)\n"
	"  --ro-sys             no filter: a mount namespace of its own with /sys\n"
	"                       read-only (as a container's); mounts made in it show in\n"
	"                       the caller's only below a shared mount\n";

static int install_filter(const struct sock_fprog *prog)
{
	/* a filter without CAP_SYS_ADMIN needs no_new_privs; with it, it
	 * costs nothing here (the daemon gains no privileges by exec) */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		fprintf(stderr, "confine: PR_SET_NO_NEW_PRIVS: %s\n", strerror(errno));
		return -1;
	}
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog) < 0) {
		fprintf(stderr, "confine: cannot install the seccomp filter: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	size_t m = 0;

	if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		fputs(usage, stdout);
		return 0;
	}
	while (argc > 1 && m < N_MODES && strcmp(argv[1], modes[m].flag))
		m++;
	if (argc < 3 || m == N_MODES) {
		if (argc > 1 && m == N_MODES)
			fprintf(stderr, "confine: unknown mode %s\n", argv[1]);
		fputs(usage, stderr);
		return 2;
	}
	if (modes[m].setup && modes[m].setup() < 0)
		return 1;
	if (modes[m].prog.len && install_filter(&modes[m].prog) < 0)
		return 1;
	execvp(argv[2], argv + 2);
	fprintf(stderr, "confine: %s: %s\n", argv[2], strerror(errno));
	return 127;
}
