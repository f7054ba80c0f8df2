/* resolve.h - follow a NAS link chain without ever leaving the allowed roots.
 *
 * The daemon runs as root, so following a link that leads outside the NAS
 * tree would hand readers files they could not read themselves.  The walk
 * is done one component at a time with lstat(); every link text is checked
 * lexically against the roots *before* anything it names is touched.
 */
#ifndef WFS_RESOLVE_H
#define WFS_RESOLVE_H

#include <limits.h>
#include <sys/stat.h>

#define HUB_MAX_ROOTS 8
#define HUB_MAX_HOPS 40 /* as the kernel's MAXSYMLINKS */

/* Root 0 is NAS_HUB; the others are extra read-only roots links may use.
 * Every path is canonical (realpath) without a trailing '/'.  @given is a
 * root as it was named (absolute, normalised) when a link outside the roots
 * made it differ (/home/u/hub for /data/home/u/hub), else "": an absolute
 * link text written with that spelling (a hub-level store's links, made
 * on a host that names the hub so) leads into the root too. */
struct hub_roots {
	int n;
	char path[HUB_MAX_ROOTS][PATH_MAX];
	char given[HUB_MAX_ROOTS][PATH_MAX];
};

enum hub_res_kind {
	HUB_RES_FILE,     /* a regular file inside a root */
	HUB_RES_DIR,      /* a directory inside a root */
	HUB_RES_OTHER,    /* a fifo, socket or device: never served */
	HUB_RES_DANGLING, /* some component does not exist */
	HUB_RES_LOOP,     /* more than HUB_MAX_HOPS links */
	HUB_RES_ESCAPE,   /* a link leads outside every root */
};

struct hub_res {
	enum hub_res_kind kind;
	int root;            /* root of the target (FILE, DIR, OTHER) */
	char real[PATH_MAX]; /* absolute physical path of the target; ESCAPE:
			      * the normalised path the chain left the roots for */
	struct stat st;      /* lstat of the target */
	int hops;            /* links followed */
	/* The chain searched a directory that grants some class no search
	 * (not all of 0111) and that is not above @rel itself, whose directories the
	 * kernel checks against the reader as it looks @rel up in the mount:
	 * shown as a file, the target would be open to readers who could not
	 * reach it on the NAS (ns.c shows such a chain as a link instead). */
	int closed;
	char via[NAME_MAX + 1]; /* see hub_resolve() */
};

/* Add a root; canonicalises @path (and keeps its own spelling in @given
 * when that differs).  Returns -errno. */
int hub_roots_add(struct hub_roots *roots, const char *path);

/* Resolve @rel (relative to root 0; "" is the root itself).  The
 * directories above @rel must be physical directories of the NAS (no
 * links): the FUSE lookup path guarantees it, other callers check it with
 * hub_check_parents().  When @via_dir
 * (relative to root 0) is given, out->via receives the name of the first
 * point of the chain that is a direct child of @via_dir, or "" if the chain
 * never passes there.  @entry_st, when not NULL, is the caller's lstat of
 * @rel itself (saves the walk that syscall).  Returns 0 with out->kind set, or -errno for errors
 * that say nothing about the link (EACCES, EIO, ENAMETOOLONG). */
int hub_resolve(const struct hub_roots *roots, const char *rel, const char *via_dir,
		const struct stat *entry_st, struct hub_res *out);

/* 0 when every directory above @rel (relative to root 0) is a directory and
 * not a link, -ENOENT otherwise: a path given by a client must not reach
 * through a link the namespace would not follow. */
int hub_check_parents(const struct hub_roots *roots, const char *rel);

/* @lex (absolute, normalised, PATH_MAX) under no root but under a root's
 * given name: rewritten under its canonical one.  0 or -ENAMETOOLONG. */
int hub_respell(const struct hub_roots *roots, char *lex);

/* The root (the longest match) the absolute, normalised path @abs lies in:
 * its index, with *@rest the part below it ("" or "a/b"); -1 if none. */
int hub_root_of(const struct hub_roots *roots, const char *abs, const char **rest);

#endif
