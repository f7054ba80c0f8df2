/* noring.c - run a command with calls refused as a container may refuse
 * them: io_uring (Docker's default seccomp profile since 25.0, or the
 * sysctl kernel.io_uring_disabled=2), openat2 (profiles older than the
 * call), or the ioctl that gives the kernel a passthrough backing file.
 *
 *   noring [--enter-only | --openat2=ENOSYS|EPERM | --backing-open=EPERM]
 *          COMMAND [ARG...]
 *
 * Installs a seccomp filter under which io_uring_setup, io_uring_enter and
 * io_uring_register fail with EPERM and every other call is allowed, then
 * execs COMMAND.  With --enter-only, only io_uring_enter fails: a ring is
 * made, and nothing submitted on it ever reaches the kernel (a profile
 * that lists one call of the three; what a program must not take a ring
 * made for one that works).  With --openat2=ERRNO, io_uring is allowed and
 * openat2 alone fails with ERRNO: ENOSYS as on a kernel before 5.6 or under
 * a profile that answers calls it does not know so, EPERM as Docker's
 * profile did before 20.10 (its default answer to any call not listed).
 * With --backing-open=EPERM, the ioctl that hands the kernel a passthrough
 * backing file fails as the kernel fails it for a daemon whose
 * CAP_SYS_ADMIN is not the initial user namespace's (a rootless container).
 * The filter is inherited by every thread and child (the daemon's fork
 * into the background included) and cannot be removed.  Only the sysctl
 * would refuse io_uring without a filter, and it is the machine's: the
 * tests beside this one use io_uring.  The tests use it to run the daemon
 * where it must do without (test_noring.py) and core/nasopen.c's own walk
 * (the unit tests nasopen_walk*).
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define NORING_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NORING_ARCH AUDIT_ARCH_AARCH64
#else
#error "noring: add this architecture's AUDIT_ARCH_ value"
#endif

#define REFUSE(nr, err)                                          \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),         \
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((err) & SECCOMP_RET_DATA))
/* another architecture's calls (a 32-bit binary) have other numbers:
 * refused all rather than misread; then the call's number loaded */
#define CHECK_ARCH_LOAD_NR                                                              \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),        \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NORING_ARCH, 1, 0),                         \
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

static const struct {
	const char *flag; /* NULL: no flag given */
	struct sock_fprog prog;
} modes[] = {
	{ NULL, PROG(io_uring_all) },
	{ "--enter-only", PROG(enter_only) },
	{ "--openat2=ENOSYS", PROG(openat2_enosys) },
	{ "--openat2=EPERM", PROG(openat2_eperm) },
	{ "--backing-open=EPERM", PROG(backing_open_eperm) },
};

int main(int argc, char **argv)
{
	size_t m = 0;

	if (argc > 1 && !strncmp(argv[1], "--", 2) && strcmp(argv[1], "--help")) {
		for (m = 1; m < sizeof(modes) / sizeof(modes[0]); m++)
			if (!strcmp(argv[1], modes[m].flag))
				break;
		if (m == sizeof(modes) / sizeof(modes[0])) {
			fprintf(stderr, "noring: unknown option %s (see --help)\n", argv[1]);
			return 2;
		}
		argc--;
		argv++;
	}
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fprintf(argc < 2 ? stderr : stdout,
			"usage: noring [--enter-only | --openat2=ENOSYS|EPERM | --backing-open=EPERM]\n"
			"              COMMAND [ARG...]\n"
			"Run COMMAND with io_uring_setup, io_uring_enter and io_uring_register\n"
			"refused (EPERM) by a seccomp filter, as a container's default profile does.\n"
			"--enter-only: io_uring_enter alone refused (rings are made, nothing\n"
			"submitted on them reaches the kernel).\n"
			"--openat2=ERRNO: io_uring allowed, openat2 alone refused with ERRNO (a kernel\n"
			"before 5.6, or a profile older than the call).\n"
			"--backing-open=EPERM: io_uring allowed, the ioctl FUSE_DEV_IOC_BACKING_OPEN\n"
			"alone refused (passthrough where CAP_SYS_ADMIN is not the initial namespace's).\n");
		return argc < 2 ? 2 : 0;
	}
	/* a filter without CAP_SYS_ADMIN needs no_new_privs; with it, it
	 * costs nothing here (the daemon gains no privileges by exec) */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		fprintf(stderr, "noring: PR_SET_NO_NEW_PRIVS: %s\n", strerror(errno));
		return 1;
	}
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &modes[m].prog) < 0) {
		fprintf(stderr, "noring: cannot install the seccomp filter: %s\n", strerror(errno));
		return 1;
	}
	execvp(argv[1], argv + 1);
	fprintf(stderr, "noring: %s: %s\n", argv[1], strerror(errno));
	return 127;
}
