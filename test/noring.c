/* noring.c - run a command with io_uring refused, as a container's default
 * seccomp profile (Docker's since 25.0) or the sysctl
 * kernel.io_uring_disabled=2 refuses it.
 *
 *   noring [--enter-only] COMMAND [ARG...]
 *
 * Installs a seccomp filter under which io_uring_setup, io_uring_enter and
 * io_uring_register fail with EPERM and every other call is allowed, then
 * execs COMMAND.  With --enter-only, only io_uring_enter fails: a ring is
 * made, and nothing submitted on it ever reaches the kernel (a profile
 * that lists one call of the three; what a program must not take a ring
 * made for one that works).  The filter is inherited by every thread and child (the
 * daemon's fork into the background included) and cannot be removed.
 * Only the sysctl would do the same without a filter, and it is the
 * machine's: the tests beside this one use io_uring.  The tests use it to
 * run the daemon where it must do without (test_noring.py).
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

#define REFUSE(nr)                                               \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),         \
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))
/* another architecture's calls (a 32-bit binary) have other numbers:
 * refused all rather than misread; then the call's number loaded */
#define CHECK_ARCH_LOAD_NR                                                              \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),        \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NORING_ARCH, 1, 0),                         \
	BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),     \
	BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))

int main(int argc, char **argv)
{
	struct sock_filter all[] = {
		CHECK_ARCH_LOAD_NR,
		REFUSE(__NR_io_uring_setup),
		REFUSE(__NR_io_uring_enter),
		REFUSE(__NR_io_uring_register),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_filter enter_only[] = {
		CHECK_ARCH_LOAD_NR,
		REFUSE(__NR_io_uring_enter),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	int only_enter = argc > 1 && !strcmp(argv[1], "--enter-only");
	struct sock_fprog prog = {
		.len = only_enter ? sizeof(enter_only) / sizeof(enter_only[0])
				  : sizeof(all) / sizeof(all[0]),
		.filter = only_enter ? enter_only : all,
	};

	argc -= only_enter;
	argv += only_enter;
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fprintf(argc < 2 ? stderr : stdout,
			"usage: noring [--enter-only] COMMAND [ARG...]\n"
			"Run COMMAND with io_uring_setup, io_uring_enter and io_uring_register\n"
			"refused (EPERM) by a seccomp filter, as a container's default profile does.\n"
			"--enter-only: io_uring_enter alone refused (rings are made, nothing\n"
			"submitted on them reaches the kernel).\n");
		return argc < 2 ? 2 : 0;
	}
	/* a filter without CAP_SYS_ADMIN needs no_new_privs; with it, it
	 * costs nothing here (the daemon gains no privileges by exec) */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		fprintf(stderr, "noring: PR_SET_NO_NEW_PRIVS: %s\n", strerror(errno));
		return 1;
	}
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) {
		fprintf(stderr, "noring: cannot install the seccomp filter: %s\n", strerror(errno));
		return 1;
	}
	execvp(argv[1], argv + 1);
	fprintf(stderr, "noring: %s: %s\n", argv[1], strerror(errno));
	return 127;
}
