"""faultfs on its own, no wfs: the checks test_nasfault.py relies on (it
runs them on its hub).  A test module subclasses FaultFS and sets FIX (its
HubFixture), REPO (a repo of it) and revision_entries (the snapshot entries
of REPO's kept revision and their blob entries)."""

import errno
import hashlib
import mmap
import os
import time
import unittest

import faultnas
import wfstest


class FaultFS(unittest.TestCase):
    """faultfs on its own (no wfs): what the daemon tests rely on."""

    @classmethod
    def setUpClass(cls):
        cls.nas = faultnas.FaultNAS(cls.FIX.hub, os.path.join(cls.FIX.gen, "selfnas"),
                                    os.path.join(cls.FIX.gen, "selfnas.sock")).start()

    @classmethod
    def tearDownClass(cls):
        faultnas.heal_stragglers()
        problems = cls.nas.stop()
        if problems:
            raise AssertionError("teardown: " + "; ".join(problems))

    def setUp(self):
        if not self.nas.alive():
            self.nas.restore()
        self.nas.reset()

    tearDown = setUp

    def p(self, rel):
        return os.path.join(self.nas.mnt, rel)

    def big(self):
        return max(self.revision_entries()[1], key=lambda e: e["size"])

    def test_same_tree_bytes_and_inodes(self):
        for e in self.FIX.entries:
            st, src = os.lstat(self.p(e["path"])), os.lstat(self.FIX.n(e["path"]))
            for f in ("st_ino", "st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_mtime_ns"):
                self.assertEqual(getattr(st, f), getattr(src, f), "%s: %s" % (e["path"], f))
            if e["type"] == "link":
                self.assertEqual(os.readlink(self.p(e["path"])), os.readlink(self.FIX.n(e["path"])))
        for e in self.FIX.readable():
            self.assertEqual(wfstest.sha256_file(self.p(e["path"])), (e["sha256"], e["size"]), e["path"])
        for d, names in self.FIX.children().items():
            got = {x.name: x.inode() for x in os.scandir(self.p(d))}
            want = {x.name: x.inode() for x in os.scandir(self.FIX.n(d))}
            self.assertEqual(sorted(got), names, "ls %s" % d)
            self.assertEqual(got, want, "d_ino of %s" % d)
        # O_DIRECT (as wfs opens the NAS), and another uid (allow_other)
        e = self.big()
        fd = os.open(self.p(e["path"]), os.O_RDONLY | os.O_DIRECT)
        try:
            buf = mmap.mmap(-1, 1 << 20)
            h, off = hashlib.sha256(), 0
            while True:
                n = os.preadv(fd, [buf], off)
                if n == 0:
                    break
                h.update(buf[:n])
                off += n
        finally:
            os.close(fd)
        self.assertEqual((h.hexdigest(), off), (e["sha256"], e["size"]), "O_DIRECT read")
        self.assertEqual(wfstest.as_uid(wfstest.sha256_file, self.p(e["path"])), ((e["sha256"], e["size"]), None))
        self.assertEqual(wfstest.errno_of(open, self.p(e["path"]), "r+b"), errno.EROFS)
        self.assertEqual(wfstest.errno_of(os.mkdir, self.p("newdir")), errno.EROFS)

    def test_eio_range(self):
        e = self.big()
        off, ln = 1 << 20, 4096
        self.assertGreater(e["size"], off + (1 << 20))
        self.assertEqual(self.nas.cmd("eio %s %d %d" % (e["nas_real"], off, ln)), "ok")
        self.assertEqual(self.nas.state()["eio_ranges"], 1)
        with open(self.FIX.n(e["nas_real"]), "rb") as f:
            want = f.read()
        fd = os.open(self.p(e["path"]), os.O_RDONLY)
        try:
            for o, n, bad in ((0, 65536, False), (off - 4096, 4096, False), (off - 1, 1, False),
                              (off - 1, 2, True), (off + ln - 1, 1, True), (off + 100, 10, True),
                              (off + ln, 4096, False), (off - 65536, 1 << 20, True),
                              (e["size"] - 4096, 4096, False)):
                if bad:
                    self.assertEqual(wfstest.errno_of(os.pread, fd, n, o), errno.EIO,
                                     "read [%d, %d) overlaps the range" % (o, o + n))
                else:
                    self.assertEqual(os.pread(fd, n, o), want[o:o + n], "read [%d, %d)" % (o, o + n))
            self.assertEqual(self.nas.cmd("clear"), "ok")
            self.assertEqual(os.pread(fd, 1 << 20, off - 65536), want[off - 65536:off - 65536 + (1 << 20)])
        finally:
            os.close(fd)
        other = self.FIX.by_path[self.revision_entries()[1][0]["path"]]
        self.assertEqual(wfstest.sha256_file(self.p(other["path"])), (other["sha256"], other["size"]))

    def test_cut(self):
        e = self.big()
        off = (1 << 20) + 1000
        self.assertEqual(self.nas.cmd("cut %s %d" % (e["nas_real"], off)), "ok")
        self.assertEqual(self.nas.state()["eio_ranges"], 1)
        with open(self.FIX.n(e["nas_real"]), "rb") as f:
            want = f.read()
        fd = os.open(self.p(e["path"]), os.O_RDONLY)
        try:
            self.assertEqual(os.pread(fd, 4096, 0), want[:4096], "a read before the cut: whole")
            self.assertEqual(os.pread(fd, 65536, off - 100), want[off - 100:off],
                             "the read across the cut: short, its bytes right")
            self.assertEqual(self.nas.state()["eio_ranges"], 0, "the cut used up")
            self.assertEqual(os.pread(fd, 65536, off - 100), want[off - 100:off - 100 + 65536],
                             "the next read across it: whole")
        finally:
            os.close(fd)

    def test_hang_blocks_until_ok(self):
        e = self.big()
        self.assertEqual(self.nas.cmd("hang"), "ok")
        r = faultnas.bounded(wfstest.sha256_file, self.p(e["path"]), timeout=0)
        st = self.nas.wait_hung(1)
        self.assertEqual(st["mode"], "hang")
        self.assertFalse(r["done"], "a read finished while faultfs hangs: %s" % r)
        self.assertEqual(self.nas.cmd("ok"), "ok")
        r["thread"].join(10)
        self.assertTrue(r["done"], "the read did not finish 10 s after `ok`")
        self.assertEqual(r.get("value"), (e["sha256"], e["size"]), r)
        self.assertEqual(self.nas.state()["hung"], 0)
        # a hung call released by `fail` gets that error
        self.assertEqual(self.nas.cmd("hang"), "ok")
        r = faultnas.bounded(os.stat, self.p(e["path"]), timeout=0)
        self.nas.wait_hung(1)
        self.assertEqual(self.nas.cmd("fail EIO"), "ok")
        r["thread"].join(10)
        self.assertEqual((r["done"], r["errno"]), (True, errno.EIO), r)

    def test_fail_and_vanish_give_enotconn(self):
        e = self.big()
        self.assertEqual(self.nas.cmd("fail ENOTCONN"), "ok")
        st = self.nas.state()
        self.assertEqual((st["mode"], st["errno"]), ("fail", errno.ENOTCONN))
        for fn in (os.stat, wfstest.read_file):
            self.assertEqual(wfstest.errno_of(fn, self.p(e["path"])), errno.ENOTCONN, fn.__name__)
        self.assertEqual(wfstest.errno_of(os.listdir, self.nas.mnt), errno.ENOTCONN)
        self.assertEqual(self.nas.cmd("ok"), "ok")
        self.assertEqual(wfstest.sha256_file(self.p(e["path"])), (e["sha256"], e["size"]))
        self.nas.vanish()
        for fn in (os.stat, wfstest.read_file):
            self.assertEqual(wfstest.errno_of(fn, self.p(e["path"])), errno.ENOTCONN, fn.__name__)
        self.nas.restore()
        self.assertEqual(wfstest.sha256_file(self.p(e["path"])), (e["sha256"], e["size"]))

    def test_faildir(self):
        snaps = "%s/snapshots" % self.REPO
        kids = sorted(os.listdir(self.p(snaps)))
        self.assertEqual(self.nas.cmd("faildir %s EIO" % snaps), "ok")
        self.assertEqual(self.nas.state()["faildir"], errno.EIO)
        self.assertEqual(wfstest.errno_of(os.listdir, self.p(snaps)), errno.EIO)
        self.assertEqual(wfstest.errno_of(os.lstat, self.p("%s/%s" % (snaps, kids[0]))), errno.EIO)
        os.lstat(self.p(snaps))               # the directory itself answers,
        os.listdir(self.p(self.REPO))              # and so does the rest
        self.assertTrue(self.nas.cmd("faildir %s/refs/main EIO" % self.REPO).startswith("error "))
        self.assertTrue(self.nas.cmd("faildir %s bogus" % snaps).startswith("error "))
        self.assertEqual(self.nas.cmd("clear"), "ok")
        self.assertEqual(sorted(os.listdir(self.p(snaps))), kids)
        # `hang`: a lookup in it blocks until `clear`; the rest answers meanwhile
        self.assertEqual(self.nas.cmd("faildir %s hang" % snaps), "ok")
        r = faultnas.bounded(os.lstat, self.p("%s/%s" % (snaps, kids[0])), timeout=0)
        self.nas.wait_hung(1)
        os.listdir(self.p(self.REPO))
        self.assertFalse(r["done"], "a lookup in a hung directory finished: %s" % r)
        self.assertEqual(self.nas.cmd("clear"), "ok")
        r["thread"].join(10)
        self.assertEqual((r["done"], r["errno"]), (True, None), r)
        self.assertEqual(self.nas.state()["hung"], 0)

    def test_latency_and_control_errors(self):
        e = self.big()
        self.assertEqual(self.nas.cmd("latency 100"), "ok")
        t0 = time.monotonic()
        os.stat(self.p(e["path"]))
        self.assertGreaterEqual(time.monotonic() - t0, 0.1)
        self.assertEqual(self.nas.state()["latency_ms"], 100)
        self.assertEqual(self.nas.cmd("latency 0"), "ok")
        for bad in ("bogus", "fail ENOSUCH", "fail", "eio no/such/file 0 1",
                    "eio %s 0 0" % e["nas_real"], "latency -1", "ok extra",
                    "cut %s" % e["nas_real"], "cut %s x" % e["nas_real"], "cut no/such/file 5"):
            self.assertTrue(self.nas.cmd(bad).startswith("error "), bad)
        self.assertEqual(self.nas.state()["mode"], "ok")
