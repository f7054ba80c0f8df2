#!/usr/bin/env python3
"""Opens that outlive a demotion of the copy they read.

A local copy is demoted -- its source changed on the NAS (`wfsctl verify`),
or the copy itself is corrupt (`wfsctl verify --full`) -- while a file is
open.  Neither that open nor any later one may read the demoted copy's
bytes once the daemon has said the blob is on the NAS again.

  PassthroughHeld  an open A passed through to the copy (the kernel reads
                   it) is held across the demotion.  The kernel lets an
                   inode with passthrough opens take no other kind of open
                   and no other backing file, so a new open of A's inode
                   cannot join A's backing (the demoted copy) and cannot be
                   served any other way either: it is refused with ESTALE,
                   one log line naming the path, and the kernel's open(2)
                   of a path then looks it up again and reaches a new inode
                   that reads the NAS.  So an open B by path reads the
                   NAS's bytes at once; a reopen of A's own inode
                   (/proc/self/fd) gets ESTALE; once A is closed, opens
                   read the NAS's bytes.  For a source renamed over (new
                   bytes) and for a corrupt copy (source unchanged).
  DaemonServedHeld an open A made while the blob is on the NAS is served by
                   the daemon, which reads whatever copy is verified at
                   each read.  Across promote, demote, promote again it
                   must read the copy verified now, never the descriptor of
                   the copy it met first: for a source renamed over (the
                   new copy has other bytes) and for a corrupt copy
                   demoted and copied again (the new copy has the same
                   content hash, so the same path in LOCAL_STORE); and a
                   copy A could not open (removed behind the store's back:
                   demoted by that read) does not keep A on the NAS once
                   the next copy serves; nor does a copy A could not open
                   because the daemon was out of descriptors then (EMFILE):
                   the next read, descriptors back, reads the copy.

The mount's entry_timeout is long, so the kernel keeps A's dentry and a
path open meets A's inode unless the daemon sends it elsewhere.  Waits are
on what the daemon reports (xattrs, wfsctl, its log), never sleeps.
"""

import errno
import os
import resource
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, errname, run_wfsctl, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--demoted"
NAMES = ("pt-renamed.safetensors", "pt-corrupt.safetensors",
         "ds-renamed.safetensors", "ds-corrupt.safetensors", "ds-missing.safetensors",
         "ds-nofile.safetensors")
SIZE = {n: 3 * MiB + 4321 + 17 * i for i, n in enumerate(NAMES)}  # a copy's size names its file
OLD = {n: wfstest.det_bytes("old " + n, SIZE[n]) for n in NAMES}
NEW = {n: wfstest.det_bytes("new " + n, SIZE[n]) for n in NAMES}  # same size: no size check helps
LOG_WAIT = 10        # s: the daemon's log line reaches its file


class Fix:
    base = hub = rev = local = mnt = mount = None


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    Fix.base = wfstest.make_base("wfs-it-demoted-")
    unittest.addModuleCleanup(remove_base)
    Fix.hub = os.path.join(Fix.base, "hub")
    # real files in the snapshot: new bytes under the same name are a
    # changed source, not a content address that no longer matches
    Fix.rev = wfstest.make_hf_repo(Fix.hub, REPO, OLD, real=NAMES)
    Fix.local = os.path.join(Fix.base, "local")
    Fix.mnt = os.path.join(Fix.base, "mnt")
    os.mkdir(Fix.mnt)
    Fix.mount = wfstest.ForegroundMount(Fix.hub, Fix.local, Fix.mnt,
                                        ("auto_promote=off", "entry_timeout=3600")).start()
    unittest.addModuleCleanup(stop_wfs)
    wfstest.wait_ctl(Fix.mnt)


def stop_wfs():
    problems = Fix.mount.stop()
    if problems:
        raise AssertionError("stopping wfs: %s; log:\n%s"
                             % ("; ".join(problems), Fix.mount.log()[-3000:]))
    Fix.mount.cleanup()


def remove_base():
    under = [p for p in wfstest.mount_points() if p == Fix.base or p.startswith(Fix.base + "/")]
    if under:
        raise AssertionError("not removing %s: still mounted: %s" % (Fix.base, under))
    shutil.rmtree(Fix.base, ignore_errors=True)


def what(got, name):
    if got == NEW[name]:
        return "the new NAS bytes"
    if got == OLD[name]:
        return "the old bytes"
    return "wrong bytes (%d of them)" % len(got)


def pread_all(fd):
    return os.pread(fd, 4 * MiB, 0)


class Base(unittest.TestCase):
    def use(self, name):
        """The file this test works on (one per test: each starts on the NAS)."""
        self.name = name
        self.rel = os.path.join(REPO, "snapshots", Fix.rev, name)
        self.path = os.path.join(Fix.mnt, self.rel)
        self.nas = os.path.join(Fix.hub, self.rel)
        self.assertEqual(state_of(self.path), "nas", "%s at the start" % name)

    def log_tail(self):
        return Fix.mount.log()[-3000:]

    def promote(self, why):
        ctl_check(self, ["promote", "--wait", self.path])
        self.assertEqual(state_of(self.path), "local", "after promote --wait (%s)" % why)

    def the_copy(self):
        """The path of this file's copy in LOCAL_STORE/data (the only one of its size)."""
        size = SIZE[self.name]
        copies = [rel for rel, st in wfstest.store_files(Fix.local).items() if st.st_size == size]
        self.assertEqual(len(copies), 1, "copies of %d bytes in LOCAL_STORE/data: %s"
                         % (size, copies))
        return os.path.join(Fix.local, "data", copies[0])

    def rename_new_over_source(self):
        tmp = self.nas + ".new"
        with open(tmp, "wb") as f:
            f.write(NEW[self.name])
            os.fsync(f.fileno())
        os.rename(tmp, self.nas)

    def corrupt_copy(self):
        """Flip bytes of the copy in place (inside the sampled head)."""
        copy = self.the_copy()
        with open(copy, "r+b") as f:
            f.seek(4096)
            f.write(bytes(b ^ 0xFF for b in OLD[self.name][4096:4096 + 8192]))
            os.fsync(f.fileno())
        return copy

    def verify(self, full):
        rc, out, err = run_wfsctl(["verify"] + (["--full"] if full else []) + [self.path],
                                  timeout=60)
        self.assertEqual(rc, 1, "wfsctl verify%s of a demoted copy: exit %s\nstdout: %s\nstderr: %s"
                         % (" --full" if full else "", rc, out, err))
        self.assertIn("1 demoted", out, "wfsctl verify stdout")
        self.assertEqual(state_of(self.path), "nas", "user.wfs.state after the demotion")


# ------------------------------------------------------------------ 1

class PassthroughHeld(Base):
    """Bug: a new open joined the held open's backing, the demoted copy."""

    def setUp(self):
        if not wfstest.kernel_has_fuse_passthrough():
            wfstest.skip_or_fail("kernel %s has no FUSE passthrough (Linux >= 6.9 needed)"
                          % os.uname().release)

    def held_across_demotion(self, demote, want):
        self.promote("before A")
        a = os.open(self.path, os.O_RDONLY)
        try:
            self.assertEqual(wfstest.passthrough_opens(self.path), 1,
                             "open A of a local copy was not passed through")
            self.assertEqual(pread_all(a), OLD[self.name], "A before the demotion")
            demote()
            wfstest.drop_caches()

            # B, by path: the NAS's bytes, read through the daemon
            b = os.open(self.path, os.O_RDONLY)
            try:
                bfd = "/proc/self/fd/%d" % b
                d0 = wfstest.daemon_reads(bfd)
                got = pread_all(b)
                d1 = wfstest.daemon_reads(bfd)
                b_pt = wfstest.passthrough_opens(bfd)
            finally:
                os.close(b)
            self.assertTrue(got == want, "open B by path, A held on the demoted copy, read %s"
                            % what(got, self.name))
            self.assertEqual(b_pt, 0, "B's inode is passed through (to the demoted copy?)")
            self.assertGreater(d1, d0, "B's reads did not reach the daemon")

            # a reopen of A's own inode cannot be served at all
            err = wfstest.errno_of(os.open, "/proc/self/fd/%d" % a, os.O_RDONLY)
            self.assertEqual(err, errno.ESTALE, "reopen of A's inode (held on the demoted copy): %s"
                             % errname(err))

            def lines():
                return [ln for ln in Fix.mount.log().splitlines()
                        if self.rel in ln and "Stale file handle" in ln]
            self.assertTrue(wfstest.wait_until(lines, LOG_WAIT),
                            "no log line names %s and ESTALE:\n%s" % (self.rel, self.log_tail()))
        finally:
            os.close(a)

        # A closed: a new open reads the NAS's bytes
        self.assertEqual(state_of(self.path), "nas")
        got = wfstest.read_file(self.path)
        self.assertTrue(got == want, "an open after A closed read %s" % what(got, self.name))

    def test_source_renamed_over(self):
        def demote():
            self.rename_new_over_source()
            self.verify(full=False)
        self.use("pt-renamed.safetensors")
        self.held_across_demotion(demote, NEW[self.name])

    def test_copy_corrupt(self):
        self.use("pt-corrupt.safetensors")

        def demote():
            copy = self.corrupt_copy()
            self.verify(full=True)
            self.assertFalse(os.path.exists(copy), "the corrupt copy is still in LOCAL_STORE")
        self.held_across_demotion(demote, OLD[self.name])


# ------------------------------------------------------------------ 2

class DaemonServedHeld(Base):
    """Bug: a daemon-served open kept the descriptor of the first copy it
    read, across demotion and a new promotion."""

    def held_across_two_promotions(self, demote, want):
        a = os.open(self.path, os.O_RDONLY)
        try:
            self.assertEqual(wfstest.passthrough_opens(self.path), 0, "A, on the NAS, passed through")
            self.assertEqual(pread_all(a), OLD[self.name], "A on the NAS")
            self.promote("first")
            wfstest.drop_caches()
            self.assertEqual(pread_all(a), OLD[self.name], "A on the first copy")
            first = self.the_copy()

            demote()
            self.promote("second")
            second = self.the_copy()
            wfstest.drop_caches()
            got = pread_all(a)
            self.assertTrue(got == want, "A, held across demote and promote (copies %s, then %s), "
                            "read %s" % (first, second, what(got, self.name)))
            self.assertEqual(wfstest.passthrough_opens(self.path), 0)
            fresh = wfstest.read_file(self.path)
            self.assertTrue(fresh == want, "a fresh open read %s" % what(fresh, self.name))
            self.assertEqual(state_of(self.path), "local", "a read of A demoted the good copy")
        finally:
            os.close(a)
        self.assertEqual(wfstest.read_file(self.path), want, "after A closed")
        self.assertEqual(state_of(self.path), "local")

    def test_source_renamed_over(self):
        self.use("ds-renamed.safetensors")

        def demote():
            self.rename_new_over_source()
            # an open shows the daemon the new attributes: the copy is demoted
            os.close(os.open(self.path, os.O_RDONLY))
            self.assertEqual(state_of(self.path), "nas", "after an open saw the new source")
        self.held_across_two_promotions(demote, NEW[self.name])

    def test_copy_corrupt_then_copied_again(self):
        self.use("ds-corrupt.safetensors")

        def demote():
            self.corrupt_copy()
            self.verify(full=True)
        self.held_across_two_promotions(demote, OLD[self.name])

    def test_copy_missing_then_copied_again(self):
        """A copy A could not open (gone behind the store's back) does not
        keep A off the next copy."""
        self.use("ds-missing.safetensors")
        size = SIZE[self.name]
        a = os.open(self.path, os.O_RDONLY)
        try:
            self.assertEqual(pread_all(a), OLD[self.name], "A on the NAS")
            self.promote("first")
            os.unlink(self.the_copy())
            wfstest.drop_caches()
            self.assertEqual(pread_all(a), OLD[self.name], "A, its copy gone")
            # demoted by that read, which could not open the copy (no
            # `verify --full` needed: test_damaged copy_removed_under_the_daemon)
            self.assertEqual(state_of(self.path), "nas", "user.wfs.state after A could not "
                             "open its copy")
            self.promote("second")
            wfstest.drop_caches()
            l0, n0 = wfstest.served_bytes(self, Fix.mnt)
            got = pread_all(a)
            l1, n1 = wfstest.served_bytes(self, Fix.mnt)
        finally:
            os.close(a)
        self.assertTrue(got == OLD[self.name], "A on the second copy read %s" % what(got, self.name))
        self.assertEqual((l1 - l0 >= size, n1 - n0), (True, 0),
                         "A on the second copy: served %d local bytes, %d NAS bytes (the copy it "
                         "could not open kept it on the NAS?)" % (l1 - l0, n1 - n0))

    def test_copy_opened_when_descriptors_ran_out(self):
        """A read of A while the daemon has no descriptor free goes to the
        NAS; the next read, descriptors back, reads the copy (it once kept
        A on the NAS until the copy changed: EIO once the NAS fails)."""
        self.use("ds-nofile.safetensors")
        size = SIZE[self.name]
        pid = Fix.mount.pids[0]
        a = os.open(self.path, os.O_RDONLY)
        try:
            self.assertEqual(pread_all(a), OLD[self.name], "A on the NAS")
            self.promote("first")
            wfstest.drop_caches()
            l0, n0 = wfstest.served_bytes(self, Fix.mnt)
            # (wfsctl gets no answer while the daemon cannot accept: asked
            # before and after)
            limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
            fds = {int(n) for n in os.listdir("/proc/%d/fd" % pid)}
            lowest_free = min(set(range(len(fds) + 1)) - fds)
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, limits[1]))
            try:
                got = pread_all(a)
            finally:
                resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
            l1, n1 = wfstest.served_bytes(self, Fix.mnt)
            self.assertTrue(got == OLD[self.name], "A, no descriptor free, read %s"
                            % what(got, self.name))
            self.assertEqual((l1 - l0, n1 - n0 >= size), (0, True),
                             "A, no descriptor free: served %d local bytes, %d NAS bytes"
                             % (l1 - l0, n1 - n0))
            wfstest.drop_caches()
            got = pread_all(a)
            l2, n2 = wfstest.served_bytes(self, Fix.mnt)
        finally:
            os.close(a)
        self.assertTrue(got == OLD[self.name], "A, descriptors back, read %s" % what(got, self.name))
        self.assertEqual((l2 - l1 >= size, n2 - n1), (True, 0),
                         "A, descriptors back: served %d local bytes, %d NAS bytes (the copy it "
                         "could not open once kept it on the NAS?)" % (l2 - l1, n2 - n1))
        self.assertIn("Too many open files", Fix.mount.log())
        self.assertEqual(state_of(self.path), "local")


if __name__ == "__main__":
    wfstest.main()
