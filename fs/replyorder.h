/* replyorder.h - an order the kernel keeps that ThreadSanitizer cannot see.
 *
 * Every reply reaches the kernel before it sends a request that depends on
 * it (the RELEASE of a file comes after the replies to its OPEN and its
 * READs), so a reply happens before the taking of any later request.
 * ThreadSanitizer sees that for replies written with writev() and requests
 * read with read() on /dev/fuse, but not for replies spliced from a pipe
 * (libfuse's zero-copy READ replies) nor for requests and replies that go
 * through io_uring (uring.c): there the code says it with these.  One
 * object for all of them, as a request may come one way and the reply it
 * depends on have gone the other.  Nothing outside a -fsanitize=thread
 * build.
 */
#ifndef WFS_REPLYORDER_H
#define WFS_REPLYORDER_H

#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
extern char wfs_reply_order; /* passthrough.c; only its address is used */
#define REPLY_SENT() __tsan_release(&wfs_reply_order)
#define REQUEST_READ() __tsan_acquire(&wfs_reply_order)
#else
#define REPLY_SENT() ((void)0)
#define REQUEST_READ() ((void)0)
#endif

#endif
