#!/usr/bin/env python3
"""A local copy whose disk returns EIO (issue 10, item 5), for real.

LOCAL_STORE is a directory of an ext4 on a loop device whose image file
lives on faultfs --rw (faultnas.FaultDisk); faultfs's `eio` ranges over the
blocks of one copy (found with FIEMAP: a byte of the ext4 is the byte at
the same offset of the image) make the disk fail exactly those reads.  The
NAS is a plain directory: only the local side is faulty.

  FaultFsRw         faultfs --rw itself: writes, truncates, fallocate and
                    fsync of existing files land in SRC; creating, removing,
                    renaming, chmod, utimes, xattrs fail EROFS; eio ranges
                    fail reads only; `fail` fails writes too
  DaemonReads       -o passthrough=off: a read through the mount gets the
                    NAS's bytes and no error; the blob is demoted (not
                    "local"), flagged local_error in `wfsctl status`,
                    counted in `wfsctl stats` (local_read_errors), logged
                    once with the copy's path, and its copy removed; the
                    disk healed, the file still reads right
  PassthroughReads  passthrough (the default): the kernel reads the copy
                    itself, so the reader gets EIO and the daemon sees
                    nothing (documented); `wfsctl verify --full PATH` finds
                    the copy unreadable, exits 1 and demotes it; the next
                    read gets the NAS's bytes, the disk still failing
  IndexReadError    index.json's blocks fail at start-up: the index is left
                    in place and never replaced, the copy served from the
                    NAS; the disk healed, the next start-up serves the copy
                    again, not copied again

Waits are on what the daemon reports (status, xattrs, log lines), never
sleeps.  Every step's undo is registered as soon as it is done (faults
cleared, wfs unmounted, the ext4 unmounted, losetup -d, faultfs stopped),
so a failed run leaves no loop device or mount behind.
"""

import errno
import hashlib
import mmap
import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, errname, run_wfsctl, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--lfault"
FILES = {"daemon.safetensors": wfstest.det_bytes("lfault-daemon", 4 * MiB + 12345),
         "passthrough.safetensors": wfstest.det_bytes("lfault-passthrough", 4 * MiB + 6789)}
LOG_WAIT = 10        # s: the daemon's warning reaches its log


class Fix:
    base = hub = rev = disk = None


def setUpModule():
    faultnas.require_faultfs()
    wfstest.require_wfsctl()
    Fix.base = wfstest.make_base("wfs-it-lfault-")
    unittest.addModuleCleanup(remove_base)
    Fix.hub = os.path.join(Fix.base, "hub")
    Fix.rev = wfstest.make_hf_repo(Fix.hub, REPO, FILES)
    Fix.disk = faultnas.FaultDisk(Fix.base).start(unittest.addModuleCleanup)


def remove_base():
    """Last: only when nothing is mounted under it any more."""
    under = [p for p in wfstest.mount_points() if p == Fix.base or p.startswith(Fix.base + "/")]
    if under:
        raise AssertionError("not removing %s: still mounted: %s" % (Fix.base, under))
    shutil.rmtree(Fix.base, ignore_errors=True)


def read_direct(path):
    """The first 64 KiB of a file read with O_DIRECT (no page cache)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 1 << 16)
        return os.preadv(fd, [buf], 0)
    finally:
        os.close(fd)


def drop_file_pages(path):
    """The page cache of one file dropped (written out first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class FaultFsRw(unittest.TestCase):
    """faultfs --rw on its own (a small directory, not the disk)."""

    def setUp(self):
        self.src = os.path.join(Fix.base, "rw-src")
        os.makedirs(os.path.join(self.src, "dir"))
        self.data = wfstest.det_bytes("rw", 256 << 10)
        with open(os.path.join(self.src, "f"), "wb") as f:
            f.write(self.data)
        os.chmod(os.path.join(self.src, "f"), 0o644)
        self.nas = faultnas.FaultNAS(self.src, os.path.join(Fix.base, "rw-mnt"),
                                     os.path.join(Fix.base, "rw.sock"), rw=True).start()
        self.addCleanup(self.stop)

    def stop(self):
        problems = self.nas.stop()
        if problems:
            raise AssertionError("faultfs --rw: " + "; ".join(problems))

    def test_existing_files_writable_tree_fixed(self):
        m = lambda rel: os.path.join(self.nas.mnt, rel)  # noqa: E731
        src = os.path.join(self.src, "f")
        fd = os.open(m("f"), os.O_RDWR)
        try:
            self.assertEqual(os.pwrite(fd, b"x" * 5000, 70000), 5000)
            os.fsync(fd)
            want = self.data[:70000] + b"x" * 5000 + self.data[75000:]
            self.assertEqual(os.pread(fd, len(want) + 10, 0), want, "read back through faultfs")
            self.assertEqual(wfstest.read_file(src), want, "the write in SRC")
            # eio ranges fail reads, not writes
            self.nas.check("eio f 65536 4096")
            self.assertEqual(wfstest.errno_of(os.pread, fd, 4096, 65536), errno.EIO)
            self.assertEqual(os.pwrite(fd, b"y" * 4096, 65536), 4096)
            self.nas.check("clear")
            self.assertEqual(os.pread(fd, 4096, 65536), b"y" * 4096)
            self.nas.check("fail EIO")
            self.assertEqual(wfstest.errno_of(os.pwrite, fd, b"z", 0), errno.EIO)
            self.assertEqual(wfstest.errno_of(os.fsync, fd), errno.EIO)
            self.nas.check("ok")
            os.posix_fallocate(fd, 0, 1 << 20)
            self.assertEqual(os.stat(src).st_size, 1 << 20, "posix_fallocate through faultfs")
            os.ftruncate(fd, 1000)
            self.assertEqual(os.stat(src).st_size, 1000, "ftruncate through faultfs")
        finally:
            os.close(fd)
        os.truncate(m("f"), 3000)
        self.assertEqual(os.stat(src).st_size, 3000, "truncate through faultfs")
        with open(m("f"), "wb") as f:   # O_TRUNC of an existing file
            f.write(b"new")
        self.assertEqual(wfstest.read_file(src), b"new")
        st = self.nas.state()
        self.assertTrue(st["rw"], st)
        self.assertGreaterEqual(st["writes"], 3, st)
        refused = {
            "create": (open, m("new"), "wb"),
            "mkdir": (os.mkdir, m("newdir")),
            "mknod": (os.mkfifo, m("fifo")),
            "symlink": (os.symlink, "f", m("link")),
            "link": (os.link, m("f"), m("hard")),
            "unlink": (os.unlink, m("f")),
            "rmdir": (os.rmdir, m("dir")),
            "rename": (os.rename, m("f"), m("g")),
            "chmod": (os.chmod, m("f"), 0o600),
            "chown": (os.chown, m("f"), 1, 1),
            "utime": (os.utime, m("f"), (1, 1)),
            "setxattr": (os.setxattr, m("f"), "user.x", b"1"),
            "removexattr": (os.removexattr, m("f"), "user.x"),
        }
        got = {k: errname(wfstest.errno_of(*v)) for k, v in refused.items()}
        self.assertEqual(got, {k: "EROFS" for k in refused}, "faultfs --rw: changes to the tree")
        self.assertEqual(sorted(os.listdir(self.src)), ["dir", "f"])
        self.assertEqual(os.stat(src).st_mode & 0o777, 0o644)


class LocalFault(unittest.TestCase):
    """A wfs mount (foreground, its log in a file) over the plain NAS, its
    LOCAL_STORE on the faulty ext4; one file of the repo promoted."""

    OPTIONS = ()
    NAME = None

    def setUp(self):
        name = type(self).__name__.lower()
        self.local = os.path.join(Fix.disk.mnt, "local-" + name)
        self.mnt = os.path.join(Fix.base, "mnt-" + name)
        os.mkdir(self.mnt)
        self.mount = wfstest.ForegroundMount(Fix.hub, self.local, self.mnt,
                                             ("auto_promote=off",) + self.OPTIONS).start()
        self.addCleanup(self.stop_wfs)
        wfstest.wait_ctl(self.mnt)
        self.path = os.path.join(self.mnt, REPO, "snapshots", Fix.rev, self.NAME)
        data = FILES[self.NAME]
        self.want = (hashlib.sha256(data).hexdigest(), len(data))

    def stop_wfs(self):
        problems = self.mount.stop()
        if problems:
            raise AssertionError("stopping wfs: %s; log:\n%s"
                                 % ("; ".join(problems), self.mount.log()[-3000:]))
        self.mount.cleanup()

    def log_tail(self):
        return self.mount.log()[-3000:]

    # ---- steps

    def promote(self):
        """promote --wait the file; returns the path of its copy in
        LOCAL_STORE/data (the only one there)."""
        ctl_check(self, ["promote", "--wait", self.path])
        self.assertEqual(state_of(self.path), "local", "after promote --wait")
        copies = wfstest.store_files(self.local)
        self.assertEqual(len(copies), 1, "LOCAL_STORE/data after one promotion: %s" % sorted(copies))
        return os.path.join(self.local, "data", next(iter(copies)))

    def fail_copy(self, copy):
        """Every block of the copy fails EIO from now on (the undo
        registered); its cached pages are dropped, and the disk is shown
        to fail them (an O_DIRECT read of the copy)."""
        ranges = Fix.disk.fail_file(copy)
        self.addCleanup(Fix.disk.heal)
        self.assertEqual(Fix.disk.nas.state()["eio_ranges"], len(ranges))
        drop_file_pages(copy)
        self.assertEqual(wfstest.errno_of(read_direct, copy), errno.EIO,
                         "an O_DIRECT read of the copy %s with its blocks %s failing" % (copy, ranges))
        return ranges

    def read_mount(self):
        """sha256 and size of the file read through the mount, its cached
        pages dropped first: (value, None) or (None, errno)."""
        wfstest.drop_pages(self.path)
        try:
            return wfstest.sha256_file(self.path), None
        except OSError as e:
            return None, e.errno

    def assert_reads_right(self, what):
        got, err = self.read_mount()
        self.assertIsNone(err, "%s: reading %s through the mount: %s\nlog:\n%s"
                          % (what, self.path, errname(err), self.log_tail()))
        self.assertEqual(got, self.want, "%s: bytes of %s" % (what, self.path))

    def assert_demoted(self, copy, what):
        st = state_of(self.path)
        self.assertIn(st, ("nas", "failed"), "%s: user.wfs.state of %s" % (what, self.path))
        self.assertFalse(os.path.exists(copy), "%s: the unreadable copy %s is still in "
                         "LOCAL_STORE" % (what, copy))

    def local_read_errors(self):
        """`wfsctl stats --json`'s metrics.local_read_errors."""
        m = ctl_json(self, ["stats", self.mnt]).get("metrics") or {}
        n = m.get("local_read_errors")
        self.assertIsInstance(n, int, "wfsctl stats --json has no metrics.local_read_errors: %s"
                              % sorted(m))
        return n

    def flagged(self):
        """The blob's entry in `wfsctl status --json`'s "flagged" list, or None."""
        bid = os.getxattr(self.path, wfstest.XATTR_ID).decode()
        st = ctl_json(self, ["status", self.mnt])
        self.assertIn("flagged", st, "wfsctl --json status has no \"flagged\" list: %s" % sorted(st))
        mine = [f for f in st["flagged"] if f.get("id") == bid]
        return mine[0] if mine else None


class DaemonReads(LocalFault):
    """-o passthrough=off: the daemon reads the copy (O_DIRECT), meets the
    EIO, demotes the blob and answers from the NAS."""

    OPTIONS = ("passthrough=off",)
    NAME = "daemon.safetensors"

    def test_unreadable_copy_is_demoted_and_nas_bytes_served(self):
        copy = self.promote()
        self.assertEqual(self.local_read_errors(), 0, "wfsctl stats --json "
                         "metrics.local_read_errors before any fault")
        self.assert_reads_right("local, healthy disk")
        ranges = self.fail_copy(copy)

        # the reader sees nothing wrong
        self.assert_reads_right("copy's blocks failing EIO (%s)" % ranges)
        # ... the blob was demoted, its copy removed
        self.assert_demoted(copy, "after the read that met the EIO")
        # ... and the operator is told: status, stats, one log line
        f = self.flagged()
        self.assertIsNotNone(f, "wfsctl status --json does not flag the demoted blob")
        self.assertIs(f.get("local_error"), True, "status flagged entry: %s" % f)
        self.assertIn("Input/output error", f.get("reason", ""), "status flagged entry: %s" % f)
        self.assertGreaterEqual(self.local_read_errors(), 1, "wfsctl stats --json "
                                "metrics.local_read_errors after the EIO")
        names = (copy, os.path.realpath(copy))

        def lines():
            return [ln for ln in self.mount.log().splitlines() if any(p in ln for p in names)]
        wfstest.wait_until(lines, LOG_WAIT)
        got = lines()
        self.assertEqual(len(got), 1, "log lines naming the copy %s:\n%s" % (copy, self.log_tail()))
        for want in ("wfs[warning]", "failed a read", "Input/output error"):
            self.assertIn(want, got[0], "the log line naming the copy")

        # the disk healed: still the right bytes (from the NAS)
        Fix.disk.heal()
        self.assert_reads_right("disk healed")
        self.assertIn(state_of(self.path), ("nas", "failed"), "not promoted again by itself")


class PassthroughReads(LocalFault):
    """Passthrough: the kernel reads the copy, the reader gets EIO; `wfsctl
    verify --full` is what finds and demotes it."""

    NAME = "passthrough.safetensors"

    def test_reader_gets_eio_then_verify_full_demotes(self):
        if not wfstest.kernel_has_fuse_passthrough():
            wfstest.skip_or_fail("kernel %s has no FUSE passthrough (Linux >= 6.9 needed)"
                          % os.uname().release)
        copy = self.promote()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            pt = wfstest.passthrough_opens(self.path)
        finally:
            os.close(fd)
        if pt < 1:
            wfstest.skip_or_fail("the kernel refused FUSE passthrough of a copy on ext4 on a loop device "
                          "over faultfs (user.wfs.passthrough %d while open); log:\n%s"
                          % (pt, self.log_tail()))
        self.assert_reads_right("local, healthy disk")
        d0 = wfstest.daemon_reads(self.path)
        ranges = self.fail_copy(copy)

        # the kernel reads the copy itself: the reader gets EIO, the daemon
        # sees none of it (documented: README "When the NAS fails")
        got, err = self.read_mount()
        self.assertEqual(err, errno.EIO, "reading %s in passthrough with the copy's blocks %s "
                         "failing: %s" % (self.path, ranges, got if err is None else errname(err)))
        self.assertEqual(wfstest.daemon_reads(self.path), d0, "the daemon served READs of a "
                         "passthrough open")
        # The daemon sees no error of the kernel's reads today, so the copy
        # stays "local" until verify --full re-reads it, fails and demotes
        # it.  A wfs that learnt of them would demote it at once, as DESIGN
        # asks: this test passes either way.
        if state_of(self.path) == "local":
            drop_file_pages(copy)
            rc, out, err = run_wfsctl(["verify", "--full", self.path], timeout=60)
            self.assertEqual(rc, 1, "wfsctl verify --full of an unreadable copy: exit %s\n"
                             "stdout: %s\nstderr: %s" % (rc, out, err))
            self.assertIn("1 demoted", out, "wfsctl verify --full stdout")
            self.assertIn("demoted, served from the NAS again: local copy unreadable: "
                          "Input/output error", err, "wfsctl verify --full stderr")
        self.assert_demoted(copy, "after the EIO")

        # the next read: NAS bytes, no error, with the disk still failing
        self.assert_reads_right("after verify --full, the disk still failing")
        self.assertGreater(wfstest.daemon_reads(self.path), d0, "the read after the demotion "
                           "was not served by the daemon")


class IndexReadError(LocalFault):
    """index.json's blocks fail EIO at start-up: an error that says nothing
    of its content.  The index is left as it is and never replaced, so the
    copies it names are local again once the disk reads -- moved aside as
    damaged, an index naming nothing would have replaced it, and the next
    start-up would have removed them."""

    OPTIONS = ("passthrough=off",)
    NAME = "daemon.safetensors"

    def restart(self):
        self.stop_wfs()
        self.mount = wfstest.ForegroundMount(Fix.hub, self.local, self.mnt,
                                             ("auto_promote=off",) + self.OPTIONS).start()
        wfstest.wait_ctl(self.mnt)

    def test_unreadable_index_is_kept(self):
        copy = self.promote()
        ino = os.stat(copy).st_ino
        index = os.path.join(self.local, "index.json")
        self.stop_wfs()  # (the index is written at the stop)
        before = wfstest.read_file(index)
        Fix.disk.fail_file(index)
        self.addCleanup(Fix.disk.heal)
        drop_file_pages(index)
        self.assertEqual(wfstest.errno_of(read_direct, index), errno.EIO)
        self.mount = wfstest.ForegroundMount(Fix.hub, self.local, self.mnt,
                                             ("auto_promote=off",) + self.OPTIONS).start()
        wfstest.wait_ctl(self.mnt)
        self.assertIn("index %s cannot be read (Input/output error): left as it is, not read "
                      "and never replaced" % index, self.mount.log())
        self.assertEqual(state_of(self.path), "nas", "a copy the index could not vouch for")
        self.assert_reads_right("index unreadable")
        self.stop_wfs()
        Fix.disk.heal()
        self.assertFalse(os.path.exists(index + ".damaged"), "index.json moved aside")
        self.assertEqual(wfstest.read_file(index), before, "index.json after a run that could "
                         "not read it")
        self.assertEqual(os.stat(copy).st_ino, ino, "the copy in LOCAL_STORE/data")
        self.mount = wfstest.ForegroundMount(Fix.hub, self.local, self.mnt,
                                             ("auto_promote=off",) + self.OPTIONS).start()
        wfstest.wait_ctl(self.mnt)
        self.assertEqual(state_of(self.path), "local", "the disk healed: local again\nlog:\n%s"
                         % self.log_tail())
        self.assertEqual(os.stat(copy).st_ino, ino, "not copied again")
        self.assert_reads_right("index readable again")


if __name__ == "__main__":
    wfstest.main()
