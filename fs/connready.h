/* connready.h - what the daemon does once the kernel has applied its INIT
 * reply (passthrough.h's init_done hook): the connection's settings are
 * final then, and the mount exists. */
#ifndef WFS_CONNREADY_H
#define WFS_CONNREADY_H

/* @arg: the struct wfs.  Raises the mount's read-ahead (-o readahead_kb)
 * and starts the io_uring threads (-o fuse_uring, fs/uring.h) when the INIT
 * reply asked for them; each failure is logged, none stops the mount. */
void connection_ready(void *arg);

#endif
