#!/usr/bin/env python3
"""The daemon confined as a container may confine it: test/confine runs it
under a seccomp filter that refuses io_uring (EPERM from io_uring_setup,
_enter and _register, as Docker's default profile since 25.0), openat2, or
the ioctl of a passthrough backing file, or with /sys read-only.  Every
part that uses one has a way without it; these run them all at once.

  NoRing    under `confine --no-io-uring`: the start-up log says io_uring is not available
            and why; a NAS blob reads right (whole, and 4 KiB preads at
            random offsets) with every NAS read handed to a NAS thread
            (stats nas_reads.handed_off grows, .ring stays 0); promote
            --wait makes a verified copy with plain reads and writes, whose
            bytes in LOCAL_STORE and through the mount equal the NAS's; the
            daemon stops cleanly.
  NoEnter   the same under `confine --no-io-uring-enter`: io_uring_setup works,
            io_uring_enter is refused, so a ring is made and nothing goes
            through it -- a ring made must not be taken for one that works
            (NAS reads then failed EPERM, copies failed; the daemon now
            sends a no-op through each ring it makes).
  WithRing  the same unconfined: no such line, and the NAS reads made
            on the ring (.ring grows, .handed_off stays 0) -- what tells
            the two routes apart, so that NoRing cannot pass on the ring.
  NoOpenat2 under `confine --openat2=EPERM`, as a seccomp profile older than
            openat2 refuses it (Docker's answers any call it does not list
            with EPERM): NAS files open by the daemon's own walk (no link
            followed), local copies by a plain open; the blob reads right
            from the NAS and, once promoted, from its copy (every open of
            either failed EPERM before).
  NoBacking under `confine --no-backing-open`, as the kernel refuses a
            passthrough backing file to a daemon without the initial user
            namespace's CAP_SYS_ADMIN (a rootless container): one warning
            line; the promoted blob, opened again and again, reads right,
            served by the daemon (daemon_reads grows, passthrough opens 0).
  RoSys     under `confine --ro-sys`, /sys read-only as a container's: the
            mount's read-ahead stays the kernel's 128 KiB (a cold mmap of a
            NAS blob at about half speed); one warning naming the bdi file
            and the reason, stats showing the value in effect, what was
            asked and why not, and the value an operator then writes from
            outside.  WithRing checks the read-ahead raised where /sys is
            writable, KernelReadahead that -o readahead_kb=0 leaves the
            kernel's alone and stats says so.
"""

import hashlib
import os
import random
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--confined"
CONFIG = wfstest.det_bytes("confined config", 5000)
BIG = wfstest.det_bytes("confined big", 6 * MiB + 12345)
NOT_AVAILABLE = "io_uring is not available"


class Routes:
    """A hub with REPO, a daemon in the foreground (mount_class), its NAS
    reads counted by route."""

    mount_class = None
    options = []

    def setUp(self):
        wfstest.require_mount_capability()
        wfstest.require_wfsctl()
        self.base = wfstest.make_base("wfs-it-confined-")
        self.addCleanup(shutil.rmtree, self.base, True)
        self.prepare_base()
        hub = os.path.join(self.base, "hub")
        self.rev = wfstest.make_hf_repo(hub, REPO, {"config.json": CONFIG,
                                                    "model.safetensors": BIG})
        self.local = os.path.join(self.base, "local")
        self.mnt = os.path.join(self.base, "mnt")
        os.mkdir(self.mnt)
        self.m = self.mount_class(hub, self.local, self.mnt,
                                  ["auto_promote=off"] + self.options).start()
        self.addCleanup(self.stop)

    def stop(self):
        if self.m:
            problems = self.m.stop()
            self.m.cleanup()
            self.m = None
            self.assertEqual(problems, [], "stopping the daemon")

    def prepare_base(self):
        pass

    def readahead(self):
        """stats' "readahead"; the bdi file that the test's own /sys shows
        for the mount (by its device, as os.stat sees it), and its value."""
        got = ctl_json(self, ["stats", self.mnt])["metrics"]["readahead"]
        dev = os.stat(self.mnt).st_dev
        bdi = "/sys/class/bdi/%d:%d/read_ahead_kb" % (os.major(dev), os.minor(dev))
        with open(bdi) as f:
            return got, bdi, int(f.read())

    def p(self, name):
        return os.path.join(self.mnt, REPO, "snapshots", self.rev, name)

    def routes(self):
        got = ctl_json(self, ["stats", self.mnt])["metrics"]["nas_reads"]
        return got["ring"], got["handed_off"]

    def read_from_nas(self):
        """The blob read through the mount, whole and at random 4 KiB
        offsets (its own descriptor, no read-ahead): right bytes."""
        path = self.p("model.safetensors")
        self.assertEqual(state_of(path), "nas")
        with open(path, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(),
                             hashlib.sha256(BIG).hexdigest(), "the NAS blob read whole")
        rng = random.Random(7)
        fd = os.open(path, os.O_RDONLY)
        try:
            # the whole read's pages out of the mount's cache: these reach the daemon
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for _ in range(64):
                off = rng.randrange(len(BIG) // 4096) * 4096
                self.assertEqual(os.pread(fd, 4096, off), BIG[off:off + 4096],
                                 "4 KiB at %d" % off)
        finally:
            os.close(fd)


class NoRing(Routes, unittest.TestCase):
    mount_class = wfstest.NoRingMount

    def setUp(self):
        wfstest.require_confine()
        super().setUp()

    def test_reads_and_promotes_without_io_uring(self):
        # the mount shows before the daemon starts its threads; the control
        # socket answers only once they are (the line written before)
        self.assertEqual(wfstest.route_of(self, self.mnt, "io_uring"),
                         ("refused", "Operation not permitted"))
        said = [l for l in self.m.log().splitlines() if NOT_AVAILABLE in l]
        self.assertEqual(len(said), 1, "the start-up log should say once that io_uring is "
                         "not available; log:\n%s" % self.m.log()[-3000:])
        self.assertIn("Operation not permitted", said[0])
        self.read_from_nas()
        ring, handed = self.routes()
        self.assertEqual(ring, 0, "a NAS read made on a ring under a filter refusing io_uring")
        self.assertGreater(handed, 0, "no NAS read handed to a NAS thread")

        ctl_check(self, ["promote", "--wait", self.p("model.safetensors")])
        self.assertEqual(state_of(self.p("model.safetensors")), "local")
        copies = {}
        for rel in wfstest.store_files(self.local):
            with open(os.path.join(self.local, "data", rel), "rb") as f:
                copies[hashlib.sha256(f.read()).hexdigest()] = rel
        self.assertIn(hashlib.sha256(BIG).hexdigest(), copies,
                      "no copy in LOCAL_STORE/data with the blob's bytes: %s" % copies)
        with open(self.p("model.safetensors"), "rb") as f:
            self.assertEqual(f.read(), BIG, "the promoted blob through the mount")
        with open(self.p("config.json"), "rb") as f:
            self.assertEqual(f.read(), CONFIG)


class NoEnter(NoRing):
    mount_class = wfstest.NoEnterMount


class WithRing(Routes, unittest.TestCase):
    mount_class = wfstest.ForegroundMount

    def test_reads_on_the_ring(self):
        self.assertEqual(wfstest.route_of(self, self.mnt, "io_uring"), ("on", None))
        self.assertNotIn(NOT_AVAILABLE, self.m.log())  # (read once the threads run)
        self.assertEqual(wfstest.route_of(self, self.mnt, "fuse_uring"), ("off", None))
        if wfstest.kernel_has_fuse_passthrough():
            self.assertEqual(wfstest.route_of(self, self.mnt, "passthrough"), ("on", None))
        self.read_from_nas()
        ring, handed = self.routes()
        self.assertGreater(ring, 0, "no NAS read made on a ring")
        self.assertEqual(handed, 0, "a NAS read handed off with io_uring available")
        got, bdi, now = self.readahead()
        self.assertEqual(got, {"kb": 4096, "bytes": 4096 << 10, "wanted": 4096, "error": None,
                               "path": bdi})
        self.assertEqual(now, 4096)


class KernelReadahead(Routes, unittest.TestCase):
    """-o readahead_kb=0: the kernel's read-ahead left alone, and shown."""

    mount_class = wfstest.ForegroundMount
    options = ["readahead_kb=0"]

    def test_readahead_left_to_the_kernel(self):
        got, bdi, now = self.readahead()
        self.assertEqual(got, {"kb": now, "bytes": now << 10, "wanted": None, "error": None,
                               "path": bdi})
        out, _ = ctl_check(self, ["stats", self.mnt])
        self.assertIn("read-ahead      %d KiB (the kernel's: -o readahead_kb=0)\n" % now, out)
        self.assertNotIn("read-ahead of", self.m.log())


class NoOpenat2(Routes, unittest.TestCase):
    mount_class = wfstest.NoOpenat2Mount

    def setUp(self):
        wfstest.require_confine()
        super().setUp()

    def test_reads_and_promotes_without_openat2(self):
        self.read_from_nas()
        ring, _ = self.routes()
        self.assertGreater(ring, 0, "io_uring is allowed here: NAS reads on the ring")
        self.assertNotIn(NOT_AVAILABLE, self.m.log())  # (read once the threads run)
        ctl_check(self, ["promote", "--wait", self.p("model.safetensors")])
        self.assertEqual(state_of(self.p("model.safetensors")), "local")
        with open(self.p("model.safetensors"), "rb") as f:
            self.assertEqual(f.read(), BIG, "the promoted blob through the mount")
        with open(self.p("config.json"), "rb") as f:
            self.assertEqual(f.read(), CONFIG)
        self.assertNotIn("Operation not permitted", self.m.log())


class NoBacking(Routes, unittest.TestCase):
    mount_class = wfstest.NoBackingMount

    def setUp(self):
        wfstest.require_confine()
        if not wfstest.kernel_has_fuse_passthrough():
            wfstest.skip_or_fail("kernel %s has no FUSE passthrough (Linux >= 6.9 needed)"
                                 % os.uname().release)
        super().setUp()

    def test_local_copy_served_by_the_daemon(self):
        path = self.p("model.safetensors")
        # offered and asked for at INIT: refused only once a backing file is
        self.assertEqual(wfstest.route_of(self, self.mnt, "passthrough"), ("on", None))
        ctl_check(self, ["promote", "--wait", path])
        self.assertEqual(state_of(path), "local")
        # held open to the end: the count lives on the kernel's inode, which
        # a drop_caches beside this test (test/run's solo lane) could drop
        keep = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, keep)
        before = wfstest.daemon_reads(path)
        for i in range(3):
            fd = os.open(path, os.O_RDONLY)
            try:
                # whatever an earlier round left in the mount's cache goes:
                # these reads reach the daemon (or, wrongly, a backing file)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                with os.fdopen(os.dup(fd), "rb") as f:
                    self.assertEqual(hashlib.sha256(f.read()).hexdigest(),
                                     hashlib.sha256(BIG).hexdigest(), "round %d" % i)
                self.assertEqual(wfstest.passthrough_opens(path), 0,
                                 "an open served by the kernel where the backing was refused")
            finally:
                os.close(fd)
        self.assertGreater(wfstest.daemon_reads(path), before,
                           "the local copy's reads never reached the daemon")
        said = [l for l in self.m.log().splitlines() if "passthrough refused" in l]
        self.assertEqual(len(said), 1, "one warning for the refused passthrough; log:\n%s"
                         % self.m.log()[-3000:])
        self.assertIn("Operation not permitted", said[0])
        self.assertEqual(wfstest.route_of(self, self.mnt, "passthrough"),
                         ("refused", "Operation not permitted"))
        out, _ = ctl_check(self, ["stats", self.mnt])
        self.assertIn("passthrough refused (Operation not permitted)", out)
        with open(self.p("config.json"), "rb") as f:
            self.assertEqual(f.read(), CONFIG)


class RoSys(Routes, unittest.TestCase):
    """Under `confine --ro-sys`, /sys read-only as a container mounts it:
    the daemon cannot raise the mount's read-ahead (one warning naming the
    file and the reason; stats shows the kernel's value, what was asked and
    why not); an operator writing the file from outside is seen by stats."""

    mount_class = wfstest.RoSysMount

    def setUp(self):
        wfstest.require_confine()
        super().setUp()

    def prepare_base(self):
        # the daemon mounts in a namespace of its own: below a shared
        # mount, its mount shows in ours as well
        wfstest.sh("mount", "--bind", self.base, self.base)
        self.addCleanup(wfstest.sh, "umount", "-l", self.base)
        wfstest.sh("mount", "--make-shared", self.base)

    def test_readahead_refused_and_set_from_outside(self):
        got, bdi, now = self.readahead()
        self.assertNotEqual(now, 4096, "read-ahead raised although /sys is read-only")
        self.assertEqual(got, {"kb": now, "bytes": now << 10, "wanted": 4096,
                               "error": "Read-only file system", "path": bdi})
        said = [l for l in self.m.log().splitlines() if "read-ahead of" in l]
        self.assertEqual(len(said), 1, "one line on the read-ahead; log:\n%s"
                         % self.m.log()[-3000:])
        for part in ("[warning]", self.mnt, bdi, "Read-only file system", "4096"):
            self.assertIn(part, said[0])
        out, _ = ctl_check(self, ["stats", self.mnt])
        self.assertIn("read-ahead      %d KiB, not the 4096 asked: Read-only file system "
                      "(write 4096 to %s from outside)\n" % (now, bdi), out)
        self.read_from_nas()

        with open(bdi, "w") as f:  # what the warning tells an operator outside to do
            f.write("4096\n")
        got, _, _ = self.readahead()
        self.assertEqual(got["kb"], 4096, "stats shows the value in effect")
        out, _ = ctl_check(self, ["stats", self.mnt])
        self.assertIn("read-ahead      4096 KiB\n", out)
        prom, _ = ctl_check(self, ["stats", "--prometheus", self.mnt])
        self.assertIn("\nwfs_readahead_bytes 4194304\n", prom)


if __name__ == "__main__":
    wfstest.main()
