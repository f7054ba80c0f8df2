/* fetch_bench.h - `test_fetch --bench`: promotion speed against the
 * SHA-256 rate, measured in the same run.
 *
 *   test_fetch --bench SRC_DIR DST_DIR [--mib N] [--files K] [--workers W]
 *              [--repeat R] [--no-id]
 *
 * K files of N MiB (pseudo-random bytes, named by their SHA-256, made once
 * under SRC_DIR/bench-N-K and reused) are copied into DST_DIR by W threads
 * (as the store's copy workers: each takes the next file), R times.  Before
 * each round: sync, caches dropped (when root), then the SHA-256 rate of one
 * core and of all cores (OpenSSL over a 1 MiB buffer in memory) measured.
 * Prints each round and the medians: MB/s (total bytes / wall time), its
 * ratio to one-core SHA-256 (K = 1) or to all-core SHA-256 (K > 1), the CPU
 * the process used, and how busy the machine's cores were.  --no-id: no
 * content address (XXH3 only).  Use a memory-backed rig for figures (an ext4
 * on `losetup --direct-io=on` over a tmpfs file for each of SRC_DIR and
 * DST_DIR). */
#ifndef WFS_FETCH_BENCH_H
#define WFS_FETCH_BENCH_H

/* Run the bench on test_fetch's arguments (argv[1] is "--bench").
 * Returns the exit status: 0; 1 when a copy failed; 2 when the bench
 * could not run (bad arguments, a source file not made, no memory). */
int fetch_bench(int argc, char **argv);

#endif
