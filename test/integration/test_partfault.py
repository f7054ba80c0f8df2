#!/usr/bin/env python3
"""Partial copies (`wfsctl promote --range`) when the NAS fails, on the
fault-injecting NAS of test_nasfault.py (faultnas.FaultNAS: test/faultfs).

  Frozen           a file with two verified local ranges, the local record
                   synced, caches dropped, then the NAS frozen (`hang`):
                   preads and mmap page faults inside the ranges return the
                   right bytes within LOCAL_WAIT; reads outside every range
                   (pread, mmap) fail EIO within FAIL_WAIT; a read
                   straddling a range's edge fails EIO when it starts on
                   NAS bytes, and stops at the edge (a short read; the next
                   read, from the edge, EIO) when it starts on local ones;
                   status says nas down and lists the file as partial with
                   its ranges and the bytes served from them; `ok`: nas up,
                   and the outside and straddling bytes read right on the
                   descriptor opened during the outage and on a new one,
                   no remount
  FirstOpenOutage  ranges promoted through the control socket alone (the
                   mount never saw the name), the record synced, then the
                   NAS gone (`fail ENOTCONN`): the first lookup and open of
                   the file succeed from the record (state partial), reads
                   in the ranges are right (pread, mmap), outside them and
                   across an edge EIO (or short, as above); the NAS back,
                   the rest of the file reads right
  NasOpenHung      the file opened while the NAS was gone (no NAS
                   descriptor yet), the NAS back, then frozen: the open's
                   first read of NAS bytes hangs opening the NAS file, and
                   its preads inside the ranges read right meanwhile, before
                   the open's deadline (they waited on that open's lock until
                   it passed); the NAS healthy, the hung read ends.  The
                   same with the open's NAS descriptor dead (the NAS
                   vanished and back): the NAS read's open again hangs
  EioInRange       EIO from the NAS inside a range being copied: promote
                   --range --wait exits 1 naming the read error and its
                   offset; the ranges are what they were (the failed one
                   never serves: its bad bytes still fail EIO through the
                   mount); the range healed, the same promote succeeds and
                   the range then serves with the NAS gone
  ManyRanges       160 adjacent 1 KiB local ranges (each requested alone,
                   so kept apart), more than one plan of a read holds
                   (fs/file.c: PART_SEGS), then the NAS gone: O_DIRECT
                   preads spanning them (one READ each) and a buffered one
                   read right; a read starting before them EIO; the NAS
                   back, the bytes around them read right

Each test has a mount and LOCAL_STORE of its own (independent of the
others and of their order).  Every call that could hang runs in a thread
with a bounded join; waits are on the daemon's reported state, never
sleeps; tearDown puts the NAS back to health first.
"""

import errno
import itertools
import mmap
import os
import re
import signal
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_json, errname, run_wfsctl, state_of  # noqa: E402

FIX = wfstest.HubFixture(options=(), scale_mib=16, many=0, mount=False)
NAS = None
REPO = "models--acme--standard"

NAS_TIMEOUT_MS = 500
LOCAL_WAIT = 5      # s: bytes inside local ranges read right within this, whatever the NAS does
FAIL_WAIT = 5       # s: bytes that need the NAS fail EIO within this (deadline 0.5 s + slack)
DOWN_WAIT = 5       # s: status says nas down
WAIT_COPIED = 60    # s: many small ranges copied (under ASan too)
UP_WAIT = 15        # s: the prober backs off to 2 s between looks (+ its deadline + slack)
HUNG_TIMEOUT_MS = 2000  # NasOpenHung: the longest NAS deadline wfs takes

KiB, MiB = 1 << 10, 1 << 20
NO_CACHE = ("entry_timeout=0", "attr_timeout=0", "negative_timeout=0", "blob_timeout=0")
_seq = itertools.count()


def setUpModule():
    global NAS
    NAS = faultnas.module_nas(FIX)


def tearDownModule():
    faultnas.stop_nas(NAS, FIX)


# ------------------------------------------------------------------ helpers

bounded, heal_stragglers = faultnas.bounded, faultnas.heal_stragglers
pread_file = faultnas.pread_file


def _mmap_copy(path, off, n):
    fd = os.open(path, os.O_RDONLY)
    mm = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
    return bytes(mm[off:off + n])


def mmap_slice(path, off, n):
    """Bytes [off, off+n) of the file copied out of a shared mapping (page
    faults, not read(2)), in a forked child: a fault the kernel cannot fill
    is SIGBUS, which would kill the test runner.  Returns the bytes; raises
    OSError(EIO) when the child died of SIGBUS."""
    kind, val = wfstest.in_child(_mmap_copy, path, off, n)
    if kind == "signal" and val == signal.SIGBUS:
        raise OSError(errno.EIO, "mmap read: child died of SIGBUS")
    if kind == "signal":
        raise RuntimeError("mmap child died of signal %d" % val)
    if kind == "errno":
        raise OSError(val, os.strerror(val))
    if kind == "exc":
        raise RuntimeError("mmap child: " + val)
    return val


def direct_pread(path, off, n):
    """open O_DIRECT, pread n bytes at off into an aligned buffer, close."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        with mmap.mmap(-1, n) as buf:
            got = os.preadv(fd, [buf], off)
            return bytes(buf[:got])
    finally:
        os.close(fd)


def snapshot_of(blob_rel):
    """The snapshot link (follow=file) of REPO's main revision that resolves
    to the blob `blob_rel`: the name a loader opens."""
    with open(FIX.n(REPO + "/refs/main")) as f:
        rev = f.read().strip()
    pre = "%s/snapshots/%s/" % (REPO, rev)
    for e in FIX.entries:
        if e["path"].startswith(pre) and e.get("nas_real") == blob_rel and e["type"] == "link":
            return e
    raise AssertionError("no snapshot link of %s in %s" % (blob_rel, pre))


def biggest_blob():
    blobs = [e for e in FIX.entries if e["type"] == "file" and e["path"].startswith(REPO + "/blobs/")]
    return max(blobs, key=lambda e: e["size"])


class PartOnFaultNAS(unittest.TestCase):
    """A fresh wfs mount (its own LOCAL_STORE and mount point) over the
    faultfs NAS for each test."""

    OPTIONS = NO_CACHE + ("auto_promote=off", "nas_timeout=%d" % NAS_TIMEOUT_MS)
    maxDiff = None

    def setUp(self):
        if not NAS.alive():
            NAS.restore()
        NAS.reset()
        name = "%s-%d" % (self._testMethodName, next(_seq))
        self.local = os.path.join(FIX.gen, "local-" + name)
        self.mnt = os.path.join(FIX.gen, "mnt-" + name)
        os.mkdir(self.mnt)
        self.mount = wfstest.ForegroundMount(NAS.mnt, self.local, self.mnt, self.OPTIONS).start()
        self.addCleanup(self.stop_mount)
        self.sock = os.path.join(os.path.realpath(self.local), "wfs.sock")
        self.blob = biggest_blob()
        self.key = os.path.join(NAS.mnt, self.blob["nas_real"])  # the daemon's key: its NAS path
        with open(FIX.n(self.blob["nas_real"]), "rb") as f:
            self.want = f.read()
        self.assertGreaterEqual(len(self.want), 7 * MiB, "the fixture's biggest blob is too small")

    def stop_mount(self):
        # the NAS healthy first: a reader blocked by a failed test goes on
        if not NAS.alive():
            NAS.restore()
        NAS.reset()
        heal_stragglers()
        problems = self.mount.stop()
        if problems:
            log = self.mount.log()
            self.mount.cleanup()
            raise AssertionError("teardown: %s\nwfs log:\n%s" % ("; ".join(problems), log[-3000:]))
        self.mount.cleanup()

    def m(self, rel):
        return os.path.join(self.mnt, rel)

    # ---- the daemon

    def status(self):
        return ctl_json(self, ["--socket", self.sock, "status"], timeout=30)

    def wait_nas(self, want, timeout):
        return faultnas.wait_nas_state(self, self.sock, want, timeout)

    def part(self):
        """The blob's "part" object (progress request): what is local."""
        rep = wfstest.ctl_request(self.sock, {"op": "progress", "keys": [self.key]}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), "progress of %s: %s" % (self.key, rep))
        b = rep["blobs"][0]
        self.assertIn("part", b, "progress of %s has no part object: %s" % (self.key, b))
        return b["part"]

    def sync_record(self):
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), "sync: %s" % rep)

    def promote(self, target, ranges, *extra):
        """wfsctl promote --range ... --wait TARGET: (rc, stdout, stderr)."""
        args = list(extra) + ["promote"]
        for off, ln in ranges:
            args += ["--range", "%d:%d" % (off, ln)]
        return run_wfsctl(args + ["--wait", target], timeout=60)

    def promote_ok(self, target, ranges, *extra):
        rc, out, err = self.promote(target, ranges, *extra)
        self.assertEqual(rc, 0, "promote --range %s --wait %s: exit %s\nstdout: %s\nstderr: %s"
                         % (ranges, target, rc, out, err))
        part = self.part()
        self.assertEqual(part["ranges"], [list(r) for r in ranges], part)
        self.assertFalse(part["copying"] or part["unproven"], part)

    # ---- checks

    def assert_reads(self, fn, path, off, n, what, timeout=LOCAL_WAIT, drop=False):
        """fn(path or fd, off, n) returns the right bytes within timeout
        (drop: the file's cached pages dropped first, in the same bounded
        call, so the read reaches the daemon)."""
        if drop:
            fn = uncached(fn)
        r = bounded(fn, path, off, n, timeout=timeout)
        self.assertTrue(r["done"], "%s [%d, %d): still blocked after %d s" % (what, off, off + n, timeout))
        self.assertIsNone(r["errno"], "%s [%d, %d): %s after %.2f s"
                          % (what, off, off + n, errname(r["errno"]), r["took"]))
        self.assertNotIn("exc", r, "%s [%d, %d): %s" % (what, off, off + n, r.get("exc")))
        self.assertTrue(r["value"] == self.want[off:off + n], "%s [%d, %d): wrong bytes"
                        % (what, off, off + n))
        return r["took"]

    def assert_eio(self, fn, path, off, n, what, timeout=FAIL_WAIT):
        r = bounded(fn, path, off, n, timeout=timeout)
        self.assertTrue(r["done"], "%s [%d, %d): still blocked after %d s (must fail EIO)"
                        % (what, off, off + n, timeout))
        self.assertEqual(r["errno"], errno.EIO, "%s [%d, %d): %s after %.2f s, expected EIO"
                         % (what, off, off + n, r.get("exc") or errname(r["errno"]), r["took"]))
        return r["took"]


    def assert_short(self, fd, path, off, n, edge):
        """A pread of [off, off+n) that starts inside a range and ends past
        its edge (the NAS down; the file's pages dropped first): the bytes
        up to the edge, a short read; then a pread from the edge: EIO."""
        wfstest.drop_pages(path)
        r = bounded(fd_pread, fd, off, n, timeout=FAIL_WAIT)
        what = "pread straddling the range end %d" % edge
        self.assertTrue(r["done"], "%s [%d, %d): still blocked after %d s" % (what, off, off + n, FAIL_WAIT))
        self.assertIsNone(r["errno"], "%s [%d, %d): %s, expected a short read"
                          % (what, off, off + n, errname(r["errno"])))
        self.assertEqual(len(r["value"]), edge - off, "%s [%d, %d): read %d bytes, expected the %d "
                         "up to the edge" % (what, off, off + n, len(r["value"]), edge - off))
        self.assertTrue(r["value"] == self.want[off:edge], "%s: wrong bytes" % what)
        self.assert_eio(fd_pread, fd, edge, n - (edge - off), "pread from the range end")


def uncached(fn):
    def call(path, off, n):
        wfstest.drop_pages(path)
        return fn(path, off, n)
    return call


def fd_pread(fd, off, n):
    return os.pread(fd, n, off)


def fd_direct_pread(fd, off, n):
    """pread on an O_DIRECT descriptor, into an aligned buffer."""
    with mmap.mmap(-1, n) as buf:
        got = os.preadv(fd, [buf], off)
        return bytes(buf[:got])


# ------------------------------------------------------------------ the tests

R1 = (1 * MiB, 512 * KiB)
R2 = (4 * MiB, 1 * MiB)


class Frozen(PartOnFaultNAS):
    """Two local ranges, then the NAS frozen."""

    def test_frozen_nas(self):
        snap = snapshot_of(self.blob["nas_real"])
        path = self.m(snap["path"])
        # promote --range --wait refreshes the local record before it
        # returns, as a whole promote --wait does: the name resolves once
        # the NAS is frozen
        self.promote_ok(path, [R1, R2])
        self.assertEqual(state_of(path), "partial")
        before = self.status()["nas"]
        # nothing of the file in any cache: each read below reaches the
        # daemon, each name lookup too (entry_timeout=0; dentries dropped)
        wfstest.drop_caches()
        NAS.check("hang")

        inside = [(R1[0], R1[1]), (R2[0] + 12 * KiB, 4 * KiB), (R2[0], R2[1])]
        mapped = [(R2[0] + 256 * KiB, 512 * KiB), R1]
        for o, n in inside:
            self.assert_reads(pread_file, path, o, n, "pread inside a range, NAS frozen", drop=True)
        for o, n in mapped:
            self.assert_reads(mmap_slice, path, o, n, "mmap inside a range, NAS frozen", drop=True)
        read = sum(n for _, n in inside + mapped)
        down = self.wait_nas("down", DOWN_WAIT)
        NAS.wait_hung(1)  # the daemon met the frozen NAS, and gave up on it
        self.assertGreater(down["timeouts"], before["timeouts"], down)
        st = self.status()
        partial = {p["key"]: p for p in st.get("partial", [])}
        self.assertIn(self.key, partial, "status partial while the NAS is down: %s" % st.get("partial"))
        self.assertEqual(partial[self.key]["ranges"], [list(R1), list(R2)], partial[self.key])
        self.assertGreaterEqual(partial[self.key]["served_local_bytes"], read,
                                "the reads inside the ranges were not served from them: %s"
                                % partial[self.key])

        # one descriptor opened while the NAS is down, kept past its return
        r = bounded(os.open, path, os.O_RDONLY, timeout=LOCAL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "open during the outage: %s"
                        % (errname(r["errno"]) if r["done"] else "blocked"))
        fd = r["value"]
        try:
            self.assert_reads(fd_pread, fd, R1[0] + 100, 5000, "pread (unaligned) inside R1, open fd")
            outside = [(0, 4096, "before every range"), (3 * MiB, 64 * KiB, "between the ranges"),
                       (len(self.want) - 4096, 4096, "past every range")]
            for o, n, what in outside:
                self.assert_eio(fd_pread, fd, o, n, "pread " + what)
            # straddling an edge: NAS bytes first, EIO; local bytes first,
            # the read stops at the edge (a short read, as read(2) does on
            # an error after some bytes), and a read from the edge is EIO
            straddle = [(R1[0] - 4096, 8192, "R1's start"), (R2[0] + R2[1] - 4096, 8192, "R2's end")]
            self.assert_eio(fd_pread, fd, straddle[0][0], straddle[0][1],
                            "pread straddling R1's start")
            self.assert_short(fd, path, R2[0] + R2[1] - 4096, 8192, R2[0] + R2[1])
            self.assert_eio(mmap_slice, path, 3 * MiB, 4096, "mmap between the ranges")
            # the local bytes still serve after the failed reads
            self.assert_reads(fd_pread, fd, R2[0], 64 * KiB, "pread inside R2 after the EIOs")

            NAS.check("ok")
            self.wait_nas("up", UP_WAIT)
            for o, n, what in outside + straddle:
                self.assert_reads(fd_pread, fd, o, n, "NAS back: pread (fd of the outage) " + what,
                                  timeout=FAIL_WAIT)
        finally:
            os.close(fd)
        wfstest.drop_pages(path)
        self.assert_reads(pread_file, path, 0, len(self.want), "NAS back: the whole file", timeout=30)
        self.assert_reads(mmap_slice, path, 3 * MiB, 64 * KiB, "NAS back: mmap between the ranges",
                          timeout=30)
        self.assertEqual(self.part()["ranges"], [list(R1), list(R2)])
        self.assertEqual(state_of(path), "partial")


class FirstOpenOutage(PartOnFaultNAS):
    """The mount meets the file's name for the first time with the NAS gone."""

    def test_first_open_while_gone(self):
        snap = snapshot_of(self.blob["nas_real"])
        # through the control socket alone, the path relative to the mount
        # root: the kernel (and the daemon's name table) never sees it
        rc, out, err = self.promote(snap["path"], [R1, R2], "--socket", self.sock)
        self.assertEqual(rc, 0, "promote --socket: exit %s\nstdout: %s\nstderr: %s" % (rc, out, err))
        self.assertEqual(self.part()["ranges"], [list(R1), list(R2)])
        self.sync_record()
        NAS.check("fail ENOTCONN")
        path = self.m(snap["path"])

        r = bounded(os.stat, path, timeout=LOCAL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "first stat of %s with the NAS gone: %s\n%s"
                        % (snap["path"], errname(r["errno"]) if r["done"] else "blocked",
                           self.mount.log()[-2000:]))
        self.assertEqual(r["value"].st_size, len(self.want))
        r = bounded(os.open, path, os.O_RDONLY, timeout=LOCAL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "first open with the NAS gone: %s"
                        % (errname(r["errno"]) if r["done"] else "blocked"))
        fd = r["value"]
        try:
            self.assertEqual(state_of(path), "partial")
            self.assert_reads(fd_pread, fd, R1[0], R1[1], "pread of R1, NAS gone")
            self.assert_reads(fd_pread, fd, R2[0] + 4096, 8192, "pread inside R2, NAS gone")
            self.assert_reads(mmap_slice, path, R2[0], R2[1], "mmap of R2, NAS gone", drop=True)
            self.assert_eio(fd_pread, fd, 2 * MiB, 4096, "pread between the ranges, NAS gone")
            self.assert_eio(fd_pread, fd, R2[0] - 4096, 8192, "pread straddling R2's start")
            self.assert_short(fd, path, R1[0] + R1[1] - 4096, 8192, R1[0] + R1[1])
            down = self.wait_nas("down", DOWN_WAIT)
            self.assertTrue(down["reason"], down)
            self.assertGreater(down["from_record"], 0, down)
            NAS.check("ok")
            self.wait_nas("up", UP_WAIT)
            self.assert_reads(fd_pread, fd, 2 * MiB, 4096, "NAS back: pread between the ranges",
                              timeout=FAIL_WAIT)
        finally:
            os.close(fd)
        self.assert_reads(pread_file, path, 0, len(self.want), "NAS back: the whole file", timeout=30)


class NasOpenHung(PartOnFaultNAS):
    """A file opened during an outage has no NAS descriptor: its first read
    of NAS bytes once the NAS is back opens one.  With that open hung (a
    NAS deadline longer than the test waits), reads of the open's local
    ranges go on meanwhile, before the hung open's deadline."""

    # the kernel's caches on: a blob's attributes are kept (blob_timeout),
    # where with every timeout 0 each read asks the NAS for them first
    OPTIONS = ("auto_promote=off", "nas_timeout=%d" % HUNG_TIMEOUT_MS)

    def local_reads_beside(self, fd):
        """With the NAS frozen, a read of NAS bytes on @fd hangs in the
        NAS open it makes; reads of the ranges on @fd read right
        meanwhile, before that open's deadline; the NAS healthy, the NAS
        read ends."""
        timeouts = faultnas.nas_of_stats(self, self.sock)["timeouts"]
        NAS.check("hang")
        nas_read = bounded(fd_direct_pread, fd, 2 * MiB, 64 * KiB, timeout=0)
        NAS.wait_hung(1)
        self.assert_reads(fd_direct_pread, fd, R1[0], 64 * KiB,
                          "pread of R1 while the open's NAS open hangs")
        self.assert_reads(fd_direct_pread, fd, R2[0] + 64 * KiB, 64 * KiB,
                          "pread in R2 while the open's NAS open hangs")
        # read before the hung open's deadline passed: they waited on
        # nothing of the NAS's (they waited for that deadline once)
        nas = faultnas.nas_of_stats(self, self.sock)
        self.assertEqual((nas["timeouts"], nas_read["done"]), (timeouts, False),
                         "the local reads came after the NAS open's deadline: %s, %s"
                         % (nas, nas_read))
        NAS.check("ok")
        nas_read["thread"].join(FAIL_WAIT)
        self.assertTrue(nas_read["done"], "the NAS read still blocked with the NAS healthy")
        if nas_read["errno"] is None:  # (EIO if its deadline passed first)
            self.assertTrue(nas_read["value"] == self.want[2 * MiB:2 * MiB + 64 * KiB],
                            "the NAS read, once the NAS answered: wrong bytes")

    def test_local_ranges_read_while_the_nas_open_hangs(self):
        snap = snapshot_of(self.blob["nas_real"])
        rc, out, err = self.promote(snap["path"], [R1, R2], "--socket", self.sock)
        self.assertEqual(rc, 0, "promote --socket: exit %s\nstdout: %s\nstderr: %s" % (rc, out, err))
        self.sync_record()
        NAS.check("fail ENOTCONN")
        path = self.m(snap["path"])
        r = bounded(os.open, path, os.O_RDONLY | os.O_DIRECT, timeout=LOCAL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "open with the NAS gone: %s"
                        % (errname(r["errno"]) if r["done"] else "blocked"))
        fd = r["value"]
        try:
            self.wait_nas("down", DOWN_WAIT)
            NAS.check("ok")
            self.wait_nas("up", UP_WAIT)
            self.local_reads_beside(fd)
        finally:
            NAS.check("ok")
            os.close(fd)

    def test_local_ranges_read_while_a_dead_nas_descriptor_is_reopened(self):
        """The open's NAS descriptor dies with the NAS mount (vanished and
        back): the next NAS read opens the file again, and that open
        hangs."""
        self.promote_ok(self.m(self.blob["path"]), [R1, R2])
        path = self.m(self.blob["path"])
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            self.assert_reads(fd_direct_pread, fd, 2 * MiB, 64 * KiB, "a NAS read, the NAS up")
            NAS.vanish()
            self.assert_eio(fd_direct_pread, fd, 3 * MiB, 64 * KiB, "a NAS read, the NAS gone")
            self.wait_nas("down", DOWN_WAIT)
            NAS.restore()
            self.wait_nas("up", UP_WAIT)
            self.local_reads_beside(fd)
            self.assertRegex(self.mount.log(), r"its NAS descriptor died; opened again")
        finally:
            NAS.check("ok")
            os.close(fd)


class ShortNasReadBesideRange(PartOnFaultNAS):
    """A read of a partial file whose NAS part comes back short inside the
    file (faultfs `cut`): read on, every byte right (it failed EIO)."""

    def test_short_nas_read_beside_a_range(self):
        snap = snapshot_of(self.blob["nas_real"])
        path = self.m(snap["path"])
        ra = (512 * KiB, 256 * KiB)
        self.promote_ok(path, [ra])
        NAS.check("cut %s %d" % (self.blob["nas_real"], ra[0] + ra[1] + 300 * KiB + 5))
        # O_DIRECT: the kernel's page cache would read a failed page again
        self.assert_reads(direct_pread, path, ra[0], ra[1] + MiB, "O_DIRECT pread of ra and "
                          "the NAS bytes after it, cut short at the NAS")
        self.assertEqual(NAS.state()["eio_ranges"], 0, "the cut was met")


class EioInRange(PartOnFaultNAS):
    """A NAS read error inside a range being copied."""

    def test_eio_then_recovery(self):
        snap = snapshot_of(self.blob["nas_real"])
        path = self.m(snap["path"])
        ra = (512 * KiB, 256 * KiB)          # copied first, fine
        rb = (2 * MiB, 2 * MiB)              # the NAS fails inside it
        bad = (3 * MiB + 12 * KiB, 4 * KiB)
        self.promote_ok(path, [ra])
        NAS.check("eio %s %d %d" % (self.blob["nas_real"], bad[0], bad[1]))
        rc, out, err = self.promote(path, [rb])
        self.assertEqual(rc, 1, "promote --range with EIO inside: exit %s\nstdout: %s\nstderr: %s"
                         % (rc, out, err))
        msg = out + err
        self.assertTrue("Input/output error" in msg or "EIO" in msg,
                        "promote's message does not name the read error:\n%s" % msg)
        m = re.search(r"offset (\d+)", msg)
        self.assertIsNotNone(m, "promote's message names no offset:\n%s" % msg)
        self.assertEqual(int(m.group(1)), bad[0],
                         "promote names offset %s, not the bad 4 KiB at %d:\n%s"
                         % (m.group(1), bad[0], msg))
        part = self.part()
        self.assertEqual(part["ranges"], [list(ra)], "ranges after the failed copy: %s" % part)
        self.assertEqual(part["local_bytes"], ra[1], part)
        self.assertTrue(part["reason"], "part.reason is empty after a failed range: %s" % part)
        self.assertEqual(state_of(path), "partial")
        # the failed range does not serve: its bad bytes come from the NAS (EIO), the rest right
        wfstest.drop_pages(path)
        self.assert_eio(pread_file, path, bad[0], bad[1], "pread of the bad bytes")
        self.assert_reads(pread_file, path, rb[0], 64 * KiB, "pread of rb's start (from the NAS)")
        self.assert_reads(pread_file, path, ra[0], ra[1], "pread of ra")

        NAS.check("clear")
        rc, out, err = self.promote(path, [rb])
        self.assertEqual(rc, 0, "promote --range after clear: exit %s\nstdout: %s\nstderr: %s"
                         % (rc, out, err))
        part = self.part()
        self.assertEqual(part["ranges"], [list(ra), list(rb)], part)
        self.assertEqual(part["local_bytes"], ra[1] + rb[1], part)
        # rb now serves locally: it reads right with the NAS gone
        self.sync_record()
        wfstest.drop_pages(path)
        NAS.check("fail ENOTCONN")
        self.assert_reads(pread_file, path, rb[0], rb[1], "pread of rb, NAS gone", drop=True)
        self.assert_eio(pread_file, path, 0, 4096, "pread before every range, NAS gone")
        NAS.check("ok")
        self.wait_nas("up", UP_WAIT)
        self.assert_reads(pread_file, path, 0, len(self.want), "NAS back: the whole file", timeout=30)


class ManyRanges(PartOnFaultNAS):
    """A read over more local ranges than one plan of it holds."""

    COUNT, SIZE, BASE = 160, 1 * KiB, 1 * MiB   # one 128 KiB READ spans 128 of them

    def test_read_spanning_many_ranges(self):
        snap = snapshot_of(self.blob["nas_real"])
        path = self.m(snap["path"])
        ranges = [(self.BASE + i * self.SIZE, self.SIZE) for i in range(self.COUNT)]
        # one request each: adjacent ranges asked apart are copied and
        # verified apart, and stay apart (each with its own hash)
        for r in ranges:
            rep = wfstest.ctl_request(self.sock, {"op": "promote", "paths": [snap["path"]],
                                                  "ranges": [list(r)]}, timeout=30)
            self.assertTrue(rep and rep.get("ok"), "promote %s: %s" % (r, rep))
        last = [None]

        def copied():
            last[0] = self.part()
            return last[0]["ranges"] == [list(r) for r in ranges] and not last[0]["copying"]
        self.assertTrue(wfstest.wait_until(copied, WAIT_COPIED), "ranges after %d s: %s"
                        % (WAIT_COPIED, last[0]))
        self.sync_record()
        NAS.check("fail ENOTCONN")
        span = self.COUNT * self.SIZE
        # O_DIRECT: one READ of the whole span reaches the daemon, and its
        # reply is what read(2) returns (a buffered read would retry a
        # failed read-ahead page by page, in READs of a few ranges each)
        self.assert_reads(direct_pread, path, self.BASE, span, "O_DIRECT pread over %d local "
                          "ranges, NAS gone" % self.COUNT)
        self.assert_reads(direct_pread, path, self.BASE + 8 * KiB, span - 16 * KiB,
                          "O_DIRECT pread over most of them, NAS gone")
        self.assert_reads(pread_file, path, self.BASE + 3 * self.SIZE + 100, span - 7 * self.SIZE,
                          "unaligned pread over most of them, NAS gone", drop=True)
        self.assert_eio(pread_file, path, self.BASE - 4096, 8192, "pread straddling the first's start")
        NAS.check("ok")
        self.wait_nas("up", UP_WAIT)
        self.assert_reads(pread_file, path, self.BASE - 64 * KiB, span + 128 * KiB,
                          "NAS back: around the ranges", timeout=FAIL_WAIT, drop=True)


if __name__ == "__main__":
    wfstest.main()
