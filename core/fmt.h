/* fmt.h - byte counts for people ("1.5 GiB"), the one formatter of the
 * daemon's messages and wfsctl's tables (wfsctl compiles this file too).
 */
#ifndef WFS_FMT_H
#define WFS_FMT_H

#include <stddef.h>
#include <stdint.h>

/* "512 B", "1.0 KiB", ..., "3.2 EiB" (powers of 1024, one decimal); returns @buf. */
const char *fmt_bytes(uint64_t n, char *buf, size_t sz);

#endif
