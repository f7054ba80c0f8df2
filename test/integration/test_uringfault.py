#!/usr/bin/env python3
"""The NAS failing under a mount that takes its requests through io_uring
(-o fuse_uring=on), where a NAS read is made on the ring thread's own ring
and waited for there with the deadline: test_nasfault's outage round trips
again -- the local revision keeps reading right, the rest fails EIO within
the deadline, and everything comes back by itself; and test_stophung's stop
with a read left hanging in the NAS, here on a ring thread's ring (its
buffer kept until the daemon ends: the sanitizer builds see it freed once,
at the end)."""

import errno
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_nasfault as nf  # noqa: E402  (a module: its test classes are not run here)
import test_stophung as sh  # noqa: E402
import test_uring as tu     # noqa: E402
import wfstest              # noqa: E402

SAVED = {}


def setUpModule():
    SAVED["enable"] = tu.enable_uring()
    wfstest.set_up_or_undo(nf.setUpModule, tearDownModule)  # (the machine's switch, the mount)


def tearDownModule():
    try:
        nf.tearDownModule()
    finally:
        tu.restore_uring(SAVED.get("enable"))


class OutageOverRings(nf.Outage):
    OPTIONS = nf.Outage.OPTIONS + ("fuse_uring=on",)

    def roundtrip(self, begin, end, frozen):
        before = tu.ring_requests(self, self.mnt)
        super().roundtrip(begin, end, frozen)
        self.assertGreater(tu.ring_requests(self, self.mnt), before,
                           "no request came through a ring")


class RingReadDeadline(nf.WfsOnFaultNAS):
    """The kernel's caches on (unlike the outage tests): a read of an open
    blob reaches the daemon as a READ alone, no GETATTR first, so the NAS
    call that meets the frozen NAS is the ring's own read."""

    OPTIONS = tuple(o for o in nf.WfsOnFaultNAS.OPTIONS if o not in nf.NO_CACHE) + ("fuse_uring=on",)

    def test_read_of_open_file_when_nas_freezes(self):
        """A file opened while the NAS answered: its next read is made on a
        ring (no NAS thread), and with the NAS frozen it must still end in
        EIO within the deadline, mark the NAS down, and leave the local
        revision reading right."""
        e = max(self.unused, key=lambda x: x["size"])
        self.assertGreater(e["size"], 2 * 4096, e)
        self.unused.remove(e)
        before = self.nas()
        fd = os.open(self.m(e["path"]), os.O_RDONLY)
        try:
            # no read-ahead: the last page is read only when asked for
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            with open(nf.FIX.n(e["path"]), "rb") as g:
                self.assertEqual(os.pread(fd, 4096, 0), g.read(4096))
            nf.NAS.check("hang")
            r = nf.bounded(os.pread, fd, 4096, e["size"] - 4096, timeout=nf.FAIL_WAIT)
            self.assertTrue(r["done"], "a read still blocked %d s after the NAS froze" % nf.FAIL_WAIT)
            self.assertEqual(r["errno"], errno.EIO, r)
            down = self.wait_nas("down", nf.DOWN_WAIT)
            self.assertGreater(down["timeouts"], before["timeouts"], down)
            self.check_local_revision("a ring's read left hanging in the NAS")
            nf.NAS.check("ok")
            self.wait_nas("up", nf.UP_WAIT)
            with open(nf.FIX.n(e["path"]), "rb") as g:
                g.seek(e["size"] - 4096)
                self.assertEqual(os.pread(fd, 4096, e["size"] - 4096), g.read(4096))
        finally:
            os.close(fd)


class ReadInFlightOverRings(sh.ReadInFlight):
    """test_stophung's ReadInFlight with the READ taken by a ring thread:
    its NAS read, left hanging on that thread's ring, outlives the thread."""

    extra_options = ["fuse_uring=on"]

    def sigterm_and_exit(self):
        self.assertGreater(tu.ring_requests(self, self.mnt), 0, "no request came through a ring")
        return super().sigterm_and_exit()


if __name__ == "__main__":
    wfstest.main()
