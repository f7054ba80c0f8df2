/* fuse_abi.h - the kernel FUSE layouts the daemon speaks itself where
 * libfuse 3.14 cannot: passthrough.c's edits of INIT and OPEN replies,
 * uring.c's rings (and test/bench/fuseprobe.c, which speaks both ways).
 * They are those of the kernel's include/uapi/linux/fuse.h, protocol 7.42
 * and later; the system's header predates most of them. */
#ifndef WFS_FUSE_ABI_H
#define WFS_FUSE_ABI_H

#include <stdint.h>

#define FUSE_ABI_INIT_EXT (1u << 30)            /* INIT flags: flags2 is read */
#define FUSE_ABI_INIT2_OVER_IO_URING (1u << 9) /* FUSE_OVER_IO_URING is bit 41 */

/* Every request's and every reply's header. */
struct in_header {
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};

struct out_header {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};

/* ---- FUSE over io_uring ---- */

/* The IORING_OP_URING_CMD commands on /dev/fuse. */
#define FUSE_ABI_URING_REGISTER 1u
#define FUSE_ABI_URING_COMMIT_AND_FETCH 2u

/* A ring entry's header buffer: the kernel writes a request's in header
 * and its opcode's fixed argument here, the daemon the reply's out
 * header. */
struct uring_req_header {
	char in_out[128];
	char op_in[128];
	struct {
		uint64_t flags;
		uint64_t commit_id;
		uint32_t payload_sz; /* bytes in the payload buffer, either way */
		uint32_t padding;
		uint64_t reserved;
	} ent;
};

/* In the command area of a 128-byte SQE. */
struct uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

#endif
