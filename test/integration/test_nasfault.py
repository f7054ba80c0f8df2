#!/usr/bin/env python3
"""The daemon when its NAS fails (issue 10), on a NAS that fails on demand:
test/faultfs, a FUSE view of the generated hub (faultnas.FaultNAS), frozen
(`hang`), gone (`fail ENOTCONN`, or kill -9: a dead mount), with bad
ranges (`eio`) or slow (`latency`).

  FaultFS             faultfs itself: bytes, inode numbers and listings equal
                      to the source's; each fault does what it says
  Outage              promote --wait one revision; with the NAS frozen, gone,
                      vanished or failing EIO, that revision reads right (bytes, listing,
                      links, refs) within 10 s, non-local content and names
                      not in the record fail EIO within 5 s; status says
                      nas down; when the NAS is back, nas up and non-local
                      content reads right again, with no remount
  RecordBuild         a rebuild of the local record that meets a failing
                      directory fails and keeps the record (file and memory);
                      a directory opened before the NAS went lists the
                      record's names, and the NAS's once it is back; a
                      listing the NAS fails part way through ends in EIO,
                      never early
  LinkToDirectory     a snapshot's link to a directory of its revision
                      (packs-latest -> packs), promoted: with the NAS gone,
                      the files read through the link too
  LargeFileList       a dataset's file list trees/<rev>.json of tens of KiB
                      (more than a refs file), its revision promoted: with
                      the NAS gone it reads byte-equal, whole and at an offset
  RestartDuringOutage wfs stopped and started again while the NAS is gone:
                      it mounts, serves the local revision, says nas down;
                      NAS back: nas up, the rest of the hub shows; with
                      only blobs/ frozen (the root answers), it mounts
                      within 10 s and serves the local revision; a revision
                      whose blobs are in the hub-level store (their keys in
                      no repo), promoted and never opened, serves after a
                      restart with the NAS up, then one with it gone
  EioMidCopy          EIO in a blob's middle: promote fails naming EIO, reads
                      of that range fail EIO and others are right; the range
                      healed, promote succeeds
  FrozenMidCopy       promote --wait while the NAS freezes under one copy,
                      another queued: a line says the NAS is down and why,
                      one that it is back; both end local, exit 0
  ClosesFrozen        opens of a local blob released while the NAS hangs
                      in a file's close (two FUSE workers): the revision
                      still reads right
  SwappedWhileOpen    a local blob opened with the NAS down, evicted once
                      it is back and its NAS file replaced: the next read
                      fails EIO, never mixes the two files
  FreshAttrs          a GETATTR within attr_timeout of the attributes' NAS
                      stat (after a listing) asks the NAS nothing
  SlowNAS             20 ms a NAS call: right bytes, no errors, nas stays up
  OthersMidWalk       another user's status whose walk meets the NAS going
                      down halfway: refused (EHOSTDOWN), never answered
                      from the store's list of repos (which told that user
                      which repos have local copies)

Every call that could hang runs in a thread with a bounded join (a hang
fails the test instead of hanging it); waits are on events (status, the
faultfs state), never sleeps; tearDown puts the NAS back to health first.
"""

import errno
import json
import os
import re
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import nf_base  # noqa: E402
import nf_faultfs  # noqa: E402
import wfstest  # noqa: E402
from nf_base import (FIX, MANY_BLOBS, REPO, OTHER_REPO, LOCAL_WAIT, FAIL_WAIT, DOWN_WAIT,  # noqa: E402
                     UP_WAIT, NAS_TIMEOUT_MS, NO_CACHE, WfsOnFaultNAS, bounded, bounded_all,
                     getdents, revision_entries, SYS_GETDENTS64, sha_size_uncached)
from wfstest import ctl_check, ctl_json, errname, run_wfsctl, state_of  # noqa: E402

NAS = None  # nf_base.NAS and REV, once setUpModule has set them
REV = None


def setUpModule():
    global NAS, REV
    nf_base.setup_module()
    NAS, REV = nf_base.NAS, nf_base.REV


def tearDownModule():
    nf_base.teardown_module()


# ------------------------------------------------------------------ faultfs itself

class FaultFS(nf_faultfs.FaultFS):
    """nf_faultfs.py's checks of faultfs alone, on this module's hub."""

    FIX = FIX
    REPO = REPO
    revision_entries = staticmethod(revision_entries)


# ------------------------------------------------------------------ the daemon

class Outage(WfsOnFaultNAS):
    """Frozen, gone, vanished: the local revision keeps working, the rest
    fails fast, and everything comes back by itself."""

    def roundtrip(self, begin, end, frozen):
        before = self.nas()
        self.assertEqual(before["state"], "up", before)
        same, other = self.take_nonlocal(True), self.take_nonlocal(False)
        begin()
        self.check_local_revision("right after the NAS failed")
        self.assert_eio(same["path"])
        self.assert_eio(other["path"])
        down = self.wait_nas("down", DOWN_WAIT)
        if frozen:  # proof that the daemon met the frozen NAS, and gave up on it
            NAS.wait_hung(1)
            self.assertGreater(down["timeouts"], before["timeouts"], down)
        self.assertGreater(down["outages"], before["outages"], down)
        self.assertTrue(down["reason"], "status nas.reason is empty while down: %s" % down)
        self.check_local_revision("with the NAS down")
        self.assert_eio("%s/snapshots/%s/no-such-file.bin" % (REPO, REV), os.stat)
        self.assert_eio(OTHER_REPO, os.stat)
        self.assert_eio(OTHER_REPO, os.listdir)
        st = self.nas()
        self.assertGreater(st["from_record"], before["from_record"], st)
        self.assertGreater(st["failed_down"], before["failed_down"], st)
        self.assertEqual(st["state"], "down", st)
        # a request that walks the NAS is refused at once, and says so (it
        # once said it "waits until the NAS answers again", and exited 1)
        rc, out, err = run_wfsctl(["--socket", self.sock, "doctor"], timeout=30)
        self.assertEqual(rc, 1, "doctor with the NAS down: %s%s" % (out, err))
        self.assertIn("is refused until the NAS answers again", err)
        # a PATH under a name the mount cannot show now (EIO): the daemon
        # is asked, and says why (status), or answers for its mount
        # (stats), where wfsctl said "Input/output error" for both
        absent = os.path.join(self.mnt, "models--nas--down/snapshots")
        rc, out, err = run_wfsctl(["status", absent], timeout=30)
        self.assertEqual(rc, 1, "status of a path the NAS down hides: %s%s" % (out, err))
        self.assertIn("models--nas--down/snapshots: not in the local record, and the NAS is "
                      "down", err)
        rc, out, err = run_wfsctl(["--json", "stats", absent], timeout=30)
        self.assertEqual(rc, 0, "stats of a path the NAS down hides: %s%s" % (out, err))
        self.assertEqual(json.loads(out)["metrics"]["nas"]["state"], "down", out)
        pids = list(self.mount.pids)
        end()
        up = self.wait_nas("up", UP_WAIT)
        self.assertGreaterEqual(up["since"], down["since"], up)
        self.assert_reads_right(same)
        self.assert_reads_right(other)
        self.assertTrue(wfstest.is_mounted(self.mnt))
        self.assertEqual([p for p in pids if wfstest.pid_alive(p)], pids, "the daemon changed")

    def test_frozen_nas(self):
        self.roundtrip(lambda: NAS.check("hang"), lambda: NAS.check("ok"), frozen=True)

    def test_gone_nas(self):
        self.roundtrip(lambda: NAS.check("fail ENOTCONN"), lambda: NAS.check("ok"), frozen=False)

    def test_vanished_nas(self):
        self.roundtrip(NAS.vanish, NAS.restore, frozen=False)

    def test_failing_nas(self):
        """EIO from every call, NAS_HUB's too, on a mount just started (no
        name to look up again): the first lookup is answered from the record."""
        cls = type(self)
        problems = cls.mount.stop()
        cls.mount.cleanup()
        cls.mount = None
        self.assertEqual(problems, [], "stopping wfs")
        cls.start_wfs()
        ctl_check(self, ["--socket", self.sock, "verify"])  # no source left for the sweep
        NAS.check("fail EIO")
        e = revision_entries()[0][0]
        r = bounded(sha_size_uncached, self.m(e["path"]), timeout=LOCAL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "the first read of %s, the NAS failing "
                        "EIO: %s" % (e["path"], errname(r["errno"]) if r["done"] else "blocked"))
        self.assertEqual(r["value"], (e["sha256"], e["size"]))
        self.check_local_revision("the NAS failing EIO")
        self.assertIn("NAS_HUB itself fails", self.wait_nas("down", DOWN_WAIT)["reason"])
        NAS.check("ok")
        self.wait_nas("up", UP_WAIT)

    def test_opened_before_the_outage(self):
        """refs/main, a .no_exist marker and the file list of the local
        revision, opened while the NAS answered and read once it froze (a
        flapping NAS does this between two looks of the prober): the reads
        come from the record, within LOCAL_WAIT, bytes equal."""
        paths = [REPO + "/refs/main", "%s/trees/%s.json" % (REPO, REV)]
        paths += [e["path"] for e in FIX.entries if e["type"] == "file"
                  and e["path"].startswith("%s/.no_exist/%s/" % (REPO, REV))][:1]
        fds = [os.open(self.m(p), os.O_RDONLY) for p in paths]
        try:
            NAS.check("hang")
            res = bounded_all([(os.pread, (fd, 1 << 20, 0)) for fd in fds], LOCAL_WAIT)
        finally:
            NAS.check("ok")
            for fd in fds:
                os.close(fd)
        got = [r.get("value") if r["errno"] is None else errname(r["errno"]) for r in res]
        want = []
        for p in paths:
            with open(FIX.n(p), "rb") as f:
                want.append(f.read())
        self.assertEqual(got, want, "reads of files opened before the NAS froze; the log ends:\n%s"
                         % self.debug_state())
        self.wait_nas("up", UP_WAIT)


class ClosesFrozen(WfsOnFaultNAS):
    """The last close of a NAS file is a call to the NAS (NFSv4's CLOSE
    waits for the server; faultfs's FLUSH under `closes 1`).  Opens of
    local files, made while the NAS answered, each hold their NAS file;
    released once it froze, they must not take the FUSE workers (two here)
    with them: the revision still reads right."""

    OPTIONS = WfsOnFaultNAS.OPTIONS + ("max_threads=2",)

    def test_releases_while_frozen(self):
        snap, blobs = revision_entries()
        e = blobs[0]
        fds = [os.open(self.m(e["path"]), os.O_RDONLY) for _ in range(4)]
        NAS.check("closes 1")
        NAS.check("hang")
        for fd in fds:
            os.close(fd)  # (RELEASE is sent in the background)
        NAS.wait_hung(1)  # a close of the daemon's is in the frozen NAS
        r = bounded(sha_size_uncached, self.m(e["path"]), timeout=LOCAL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "a local file read after releases "
                        "met the frozen NAS: %s" % (errname(r["errno"]) if r["done"] else
                                                    "blocked"))
        self.assertEqual(r["value"], (e["sha256"], e["size"]))
        self.check_local_revision("with closes hung in the frozen NAS")
        # A stop with the closes still in the NAS gets to its end and says
        # so.  (The process itself ends only when they do: a FUSE client
        # waits for a FLUSH's answer through SIGKILL, where an NFS client's
        # CLOSE gives way to it.)
        cls = type(self)
        stop = bounded(cls.mount.stop, timeout=0)
        said = wfstest.wait_until(lambda: re.search(r"\d+ NAS files still closing at exit",
                                                    cls.mount.log()), 30)
        NAS.check("ok")
        stop["thread"].join(30)
        self.assertTrue(said, "the stop never got past the closes: %s" % cls.mount.log()[-2000:])
        self.assertEqual((stop["done"], stop.get("value")), (True, []), "stopping wfs")
        cls.mount.cleanup()
        cls.mount = None


class SwappedWhileOpen(WfsOnFaultNAS):
    """A local blob opened while the NAS is down, then evicted with the NAS
    back and its file there replaced by another (new inode, size and
    mtime): the open's next read of the NAS side fails EIO, never mixes the
    other file's bytes with the ones it read.  (Daemon-served, O_DIRECT:
    passed through, the kernel would read the evicted copy's file on, and
    its page cache would answer.)"""

    OPTIONS = WfsOnFaultNAS.OPTIONS + ("passthrough=off",)

    def test_nas_file_swapped_under_an_open_made_down(self):
        _snap, blobs = revision_entries()
        e = max(blobs, key=lambda b: b["size"])
        self.assertGreater(e["size"], 8192, e)
        src = FIX.n(e["path"])
        keep = src + ".kept"
        os.link(src, keep)
        self.addCleanup(os.rename, keep, src)
        with open(src, "rb") as f:
            old = f.read()
        NAS.check("fail ENOTCONN")
        fd = os.open(self.m(e["path"]), os.O_RDONLY | os.O_DIRECT)  # (it finds the NAS gone)
        try:
            self.wait_nas("down", DOWN_WAIT)
            self.assertEqual(os.pread(fd, 4096, 0), old[:4096])
            NAS.check("ok")
            self.wait_nas("up", UP_WAIT)
            tmp = src + ".new"
            with open(tmp, "wb") as f:
                f.write(b"\x5a" * (e["size"] + 1))
            os.rename(tmp, src)
            ctl_check(self, ["evict", "--force", self.m(e["path"])])
            r = bounded(os.pread, fd, 4096, 4096, timeout=FAIL_WAIT)
        finally:
            os.close(fd)
        self.assertTrue(r["done"], "the read after the swap blocked")
        self.assertEqual(r["errno"], errno.EIO, "the read after the swap gave %r"
                         % (r.get("value", b"")[:16] if r["errno"] is None else errname(r["errno"])))
        self.assertIn("the NAS file is not the one this open was shown", self.mount.log())


class RecordBuild(WfsOnFaultNAS):
    """A rebuild of the local record that meets a failing NAS part way
    keeps the record it had: a walk with holes never replaces a whole one."""

    def record_status(self):
        return ctl_json(self, ["--socket", self.sock, "status"])["record"]

    def test_walk_error_keeps_record(self):
        path = os.path.join(self.local, "record.json")
        before = self.record_status()
        with open(path, "rb") as f:
            text = f.read()
        self.assertGreater(before["files"], 0, before)
        # Lookups under snapshots/ fail; the rest of the repo answers, and
        # the gate sees nothing (EIO counts only when NAS_HUB fails too).
        NAS.check("faildir %s/snapshots EIO" % REPO)
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=30)
        self.assertIsNotNone(rep, "no reply to sync")
        self.assertFalse(rep.get("ok"), "sync succeeded with snapshots/ failing: %s" % rep)
        self.assertEqual(rep.get("errno"), "EIO", rep)
        after = self.record_status()
        self.assertEqual((after["files"], after["entries"]), (before["files"], before["entries"]),
                         "the failed rebuild changed the record")
        with open(path, "rb") as f:
            self.assertEqual(f.read(), text, "record.json changed by a failed rebuild")
        # The record kept is the one that serves when the NAS then goes.
        NAS.check("clear")
        NAS.check("fail ENOTCONN")
        self.check_local_revision("the NAS gone after a failed rebuild")
        NAS.check("ok")
        self.wait_nas("up", UP_WAIT)
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=30)
        self.assertTrue(rep and rep.get("ok"), "sync with the NAS healthy: %s" % rep)


    def test_listing_opened_before_outage(self):
        """A directory opened while the NAS is up is listed at its first
        read: the NAS gone by then, the record's names; the NAS back, the
        kernel has kept none of them.  (blobs/: the record has the local
        blobs, the NAS the other revision's own too.)"""
        d = self.m(REPO + "/blobs")
        full = sorted(os.listdir(FIX.n(REPO + "/blobs")))  # none of its names is hidden
        local = {os.path.basename(e["path"]) for e in revision_entries()[1]}
        # Opened, never read through the mount yet: nothing of it cached.
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            NAS.check("fail ENOTCONN")
            r = bounded(os.listdir, fd, timeout=LOCAL_WAIT)
        finally:
            os.close(fd)
        self.assertTrue(r["done"], "listing %s blocked with the NAS gone" % d)
        self.assertIsNone(r["errno"], "listing %s with the NAS gone: %s" % (d, errname(r["errno"])))
        got = sorted(r["value"])
        self.assertTrue(local <= set(got) < set(full),
                        "listing %s from the record: %s (the NAS's: %s)" % (d, got, full))
        NAS.check("ok")
        self.wait_nas("up", UP_WAIT)
        self.assertEqual(sorted(os.listdir(d)), full, "listing %s once the NAS is back" % d)


    def test_listing_cut_by_outage(self):
        """A pass over a directory the NAS gave whole, the NAS gone before
        its end: what the reader has not got yet fails EIO -- a reply cut
        short or empty would be the end of the directory to the kernel, and
        a reader would take a short listing for the whole one."""
        if SYS_GETDENTS64 is None:
            wfstest.skip_or_fail("getdents64's number on %s is not known here" % os.uname().machine)
        d = self.m(MANY_BLOBS)
        want = FIX.children()[MANY_BLOBS]
        self.assertEqual(len(want), 300)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            first = getdents(fd, 512)
            self.assertTrue(first, "the first getdents64 of %s gave nothing" % d)
            NAS.check("fail ENOTCONN")

            def rest():
                """getdents64 until it fails or ends: (names, errno)."""
                got = []
                while True:
                    try:
                        names = getdents(fd, 512)
                    except OSError as e:
                        return got, e.errno
                    if not names:
                        return got, None
                    got += names
            r = bounded(rest, timeout=FAIL_WAIT)
        finally:
            os.close(fd)
        self.assertTrue(r["done"], "getdents64 of %s blocked with the NAS gone" % d)
        got, err = r["value"]
        names = [x for x in first + got if x not in (".", "..")]
        self.assertLess(len(names), len(want), "%s listed whole with the NAS gone: the test "
                        "proves nothing" % d)
        self.assertEqual(errname(err), "EIO", "%s: %d of %d names, then %s instead of EIO"
                         % (d, len(names), len(want), "the end" if err is None else errname(err)))
        self.assertEqual(names, [x for x in names if x in want], "names not in %s" % d)


class LinkToDirectory(WfsOnFaultNAS):
    """A link to a directory of its revision is in the record with the
    local files under it: while the NAS is gone a reader goes through it
    as through the directory.  (This class's store holds OTHER_REPO.)"""

    PROMOTE = False

    def test_read_through_link_while_down(self):
        self.wait_nas("up", UP_WAIT)
        with open(FIX.n(OTHER_REPO + "/refs/main")) as f:
            snap = "%s/snapshots/%s" % (OTHER_REPO, f.read().strip())
        files = [e for e in FIX.readable() if e["path"].startswith(snap + "/packs/")]
        self.assertTrue(files and os.readlink(FIX.n(snap + "/packs-latest")) == "packs")
        ctl_check(self, ["promote", "--wait", self.m(snap)], timeout=60)
        self.assertEqual([state_of(self.m(e["path"])) for e in files], ["local"] * len(files))
        NAS.check("fail ENOTCONN")
        via = [snap + "/packs-latest/" + os.path.basename(e["path"]) for e in files]
        calls = [(os.readlink, (self.m(snap + "/packs-latest"),)),
                 (os.listdir, (self.m(snap + "/packs-latest"),))]
        calls += [(sha_size_uncached, (self.m(p),)) for p in via]
        res = bounded_all(calls, LOCAL_WAIT)
        got = [r.get("value") if r["errno"] is None else errname(r["errno"]) for r in res]
        want = ["packs", sorted(os.path.basename(e["path"]) for e in files)]
        want += [(e["sha256"], e["size"]) for e in files]
        got[1] = sorted(got[1]) if isinstance(got[1], list) else got[1]
        self.assertEqual(got, want, "through %s/packs-latest with the NAS gone; the log ends:\n%s"
                         % (snap, self.debug_state()))


class LargeFileList(WfsOnFaultNAS):
    """A revision's file list larger than a refs file (a dataset of many
    files: tens of KiB) is kept whole in the record: with the NAS gone it
    reads byte-equal, whole and from an offset.  (This class's store holds
    one file of datasets--acme--many: enough to keep its revision.)"""

    PROMOTE = False

    def test_large_file_list_while_down(self):
        self.wait_nas("up", UP_WAIT)
        repo = MANY_BLOBS.split("/")[0]
        with open(FIX.n(repo + "/refs/main")) as f:
            rev = f.read().strip()
        tree = FIX.by_path["%s/trees/%s.json" % (repo, rev)]
        with open(FIX.n(tree["path"]), "rb") as f:
            want = f.read()
        self.assertGreater(len(want), 16384, "the fixture's file list is small")
        # One file of the revision local puts the revision in the record
        # (copying all 300 takes long on a busy disk).
        one = next(e for e in FIX.readable() if e["path"].startswith("%s/snapshots/%s/" % (repo, rev)))
        ctl_check(self, ["promote", "--wait", self.m(one["path"])], timeout=60)
        NAS.check("fail ENOTCONN")

        path = self.m(tree["path"])
        calls = [(sha_size_uncached, (path,)), (faultnas.pread_file, (path, 10000, 5000)),
                 (os.listdir, (self.m(repo + "/trees"),))]
        res = bounded_all(calls, LOCAL_WAIT)
        got = [r.get("value") if r["errno"] is None else errname(r["errno"]) for r in res]
        self.assertEqual(got, [(tree["sha256"], tree["size"]), want[10000:15000], [rev + ".json"]],
                         "%s with the NAS gone; the log ends:\n%s" % (tree["path"], self.debug_state()))


class RestartDuringOutage(WfsOnFaultNAS):
    """A restart while the NAS is gone still serves the local revision."""

    def restart(self, begin, end):
        cls = type(self)
        problems = cls.mount.stop()
        cls.mount.cleanup()
        cls.mount = None
        self.assertEqual(problems, [], "stopping wfs")
        begin()
        cls.start_wfs()   # asserts exit 0 and a mount
        down = self.wait_nas("down", DOWN_WAIT)
        self.assertTrue(down["reason"], down)
        self.check_local_revision("after a restart with the NAS gone")
        self.assert_eio(OTHER_REPO, os.stat)
        pids = list(self.mount.pids)
        end()
        self.wait_nas("up", UP_WAIT)
        r = bounded(os.listdir, self.m(OTHER_REPO), timeout=FAIL_WAIT)
        self.assertTrue(r["done"] and r["errno"] is None, "ls %s once the NAS is back: %s"
                        % (OTHER_REPO, errname(r["errno"]) if r["done"] else "blocked"))
        self.assertEqual(sorted(r["value"]), FIX.children()[OTHER_REPO])
        self.assert_reads_right(next(e for e in FIX.readable() if e["path"].startswith(OTHER_REPO + "/")))
        self.assertEqual([p for p in pids if wfstest.pid_alive(p)], pids, "the daemon changed")

    def test_restart_while_nas_fails(self):
        self.restart(lambda: NAS.check("fail ENOTCONN"), lambda: NAS.check("ok"))

    def test_restart_while_nas_vanished(self):
        self.restart(NAS.vanish, NAS.restore)

    def stop_and_start(self, begin=None):
        cls = type(self)
        problems = cls.mount.stop()
        cls.mount.cleanup()
        cls.mount = None
        self.assertEqual(problems, [], "stopping wfs")
        if begin:
            begin()
        cls.start_wfs()

    def test_hub_level_store_revision(self):
        """models--acme--hubstore's blobs/ entries are links into the
        hub-level store: the record finds the repo by the names the
        promote's walk gave the blobs, kept in the index across a restart
        (with the NAS up the record is built again from the store alone)."""
        repo = "models--acme--hubstore"
        with open(FIX.n(repo + "/refs/main")) as f:
            snap = "%s/snapshots/%s" % (repo, f.read().strip())
        ctl_check(self, ["promote", "--wait", self.m(snap)], timeout=60)
        # (two shards' links are absolute, into the hub this NAS mount
        # wraps: outside NAS_HUB, shown as links, never copied)
        files = [e for e in FIX.readable() if e["path"].startswith(snap + "/")
                 and os.path.realpath(self.m(e["path"])).startswith(self.mnt + "/")]
        self.assertEqual({e["path"]: state_of(self.m(e["path"])) for e in files},
                         {e["path"]: "local" for e in files}, "after promote --wait %s" % snap)
        self.assertGreaterEqual(len(files), 5, "local files of %s: %s" % (snap, files))
        self.stop_and_start()
        rep = wfstest.ctl_request(self.sock, {"op": "sync"}, timeout=60)
        self.assertTrue(rep and rep.get("ok"), "sync after the restart: %s" % rep)
        self.stop_and_start(lambda: NAS.check("fail ENOTCONN"))
        self.wait_nas("down", DOWN_WAIT)
        res = bounded_all([(sha_size_uncached, (self.m(e["path"]),)) for e in files], LOCAL_WAIT)
        got = {e["path"]: r.get("value") if r["errno"] is None else errname(r["errno"])
               for e, r in zip(files, res)}
        self.assertEqual(got, {e["path"]: (e["sha256"], e["size"]) for e in files},
                         "%s after two restarts, the NAS gone; the log ends:\n%s"
                         % (snap, self.debug_state()))
        NAS.check("ok")
        self.wait_nas("up", UP_WAIT)

    def test_start_with_blob_lookups_frozen(self):
        """NAS_HUB answers, the repo's blobs/ is frozen: the start-up stats
        of the local copies' sources (under blobs/) must not hold up the
        start -- each waits at most nas_timeout, then the NAS is marked down
        and the copies serve, their sources checked later."""
        cls = type(self)
        problems = cls.mount.stop()
        cls.mount.cleanup()
        cls.mount = None
        self.assertEqual(problems, [], "stopping wfs")
        NAS.check("faildir %s/blobs hang" % REPO)
        cls.start_wfs()   # asserts a mount within 10 s
        self.assertGreaterEqual(NAS.state()["hung"], 1, "nothing waited in blobs/: the test proves nothing")
        self.assertRegex(self.mount.log(), r"start-up: a stat of \S+/%s/blobs/\S+ took longer than %d ms"
                         % (REPO, NAS_TIMEOUT_MS))
        self.check_local_revision("started with blobs/ frozen")
        NAS.check("clear")
        self.wait_nas("up", UP_WAIT)


class EioMidCopy(WfsOnFaultNAS):
    """A NAS read error inside a blob: the copy fails and says why; healed,
    it succeeds."""

    # readahead_kb=0: the kernel's default (128 KiB), so a read far from the
    # bad range never reaches into it
    OPTIONS = NO_CACHE + ("auto_promote=off", "readahead_kb=0")
    PROMOTE = False

    def test_eio_then_recovery(self):
        snap, _ = revision_entries()
        e = max(snap, key=lambda x: x["size"])
        size = e["size"]
        self.assertGreaterEqual(size, 3 << 20, "the biggest shard is too small to keep reads apart")
        off, ln = (size // 2) & ~4095, 4096
        NAS.check("eio %s %d %d" % (e["nas_real"], off, ln))
        path = self.m(e["path"])
        rc, out, err = run_wfsctl(["promote", "--wait", path], timeout=60)
        self.assertEqual(rc, 1, "promote --wait with an EIO range: exit %s\nstdout: %s\nstderr: %s"
                         % (rc, out, err))
        self.assertTrue("EIO" in out + err or "Input/output error" in out + err,
                        "promote's message does not name EIO:\nstdout: %s\nstderr: %s" % (out, err))
        self.assertNotEqual(state_of(path), "local")
        with open(FIX.n(e["nas_real"]), "rb") as f:
            want = f.read()
        fd = os.open(path, os.O_RDONLY)
        try:
            for o, n in ((0, 65536), (size - 65536, 65536)):
                r = bounded(os.pread, fd, n, o, timeout=FAIL_WAIT)
                self.assertTrue(r["done"], "read [%d, %d) blocked" % (o, o + n))
                self.assertIsNone(r["errno"], "read [%d, %d): %s" % (o, o + n, errname(r["errno"])))
                self.assertEqual(r["value"], want[o:o + n], "read [%d, %d)" % (o, o + n))
            r = bounded(os.pread, fd, ln, off, timeout=FAIL_WAIT)
            self.assertTrue(r["done"], "read of the bad range blocked")
            self.assertEqual(r["errno"], errno.EIO, "read of the bad range: %s" % errname(r["errno"]))
        finally:
            os.close(fd)
        NAS.check("clear")
        ctl_check(self, ["promote", "--wait", path], timeout=60)
        self.assertEqual(state_of(path), "local")
        self.assertEqual(sha_size_uncached(path), (e["sha256"], size))
        self.assertEqual(self.nas()["state"], "up")


class ShortNasRead(WfsOnFaultNAS):
    """A NAS read that comes back short inside the file (faultfs `cut`: an
    NFS read whose later RPC failed, a client that splits reads): the daemon
    asks for the rest, so a reader gets every byte, or the rest's error --
    never a file that ends early with no error."""

    OPTIONS = NO_CACHE + ("auto_promote=off",)
    PROMOTE = False

    def test_short_read_inside_the_file(self):
        snap, _ = revision_entries()
        e = max(snap, key=lambda x: x["size"])
        off = e["size"] // 2 + 1000
        NAS.check("cut %s %d" % (e["nas_real"], off))
        path = self.m(e["path"])
        self.assertEqual(sha_size_uncached(path), (e["sha256"], e["size"]),
                         "read through a NAS read cut short at %d" % off)
        # the read of the rest fails: so does the reader's (it got a
        # file that ended there, with no error)
        NAS.check("eio %s %d %d" % (e["nas_real"], off, 4096))
        wfstest.drop_pages(path)
        self.assert_eio(e["path"])
        NAS.check("clear")
        self.assertEqual(sha_size_uncached(path), (e["sha256"], e["size"]))
        self.assertNotEqual(state_of(path), "local")

    def test_file_shrunk_under_an_open(self):
        """A file cut shorter on the NAS under an open: a read across its
        new end gives the bytes up to there (the rest asked for, none
        came: the file does end there now).  Its 100 bytes were taken for
        ENETDOWN, a descriptor that died: the rest was asked of -ESTALE,
        and the reader got EBADF."""
        snap, _ = revision_entries()
        rel = os.path.dirname(snap[0]["path"]) + "/shrinks.bin"
        data = wfstest.det_bytes("shrinks", 3 << 20)
        with open(FIX.n(rel), "wb") as f:
            f.write(data)
        try:
            fd = os.open(self.m(rel), os.O_RDONLY)
            try:
                self.assertEqual(os.pread(fd, 4096, 0), data[:4096])
                os.truncate(FIX.n(rel), (1 << 20) + 100)
                got = os.pread(fd, 1 << 20, 1 << 20)
                self.assertEqual(got, data[1 << 20:(1 << 20) + 100],
                                 "a read across the new end: %d bytes" % len(got))
            finally:
                os.close(fd)
        finally:
            os.unlink(FIX.n(rel))


class ShortNasReadOffRing(ShortNasRead):
    """The same, the NAS reads handed to the NAS threads."""

    OPTIONS = NO_CACHE + ("auto_promote=off", "nas_read_ring=off")


class FrozenMidCopy(WfsOnFaultNAS):
    """promote --wait of two shards while the NAS freezes under the first
    one's copy, the second queued: it says the NAS is down (and why), the
    copy and the queue wait, and once the NAS answers again it says so,
    both copies end local and the wait exits 0."""

    # copy_workers=1: the second shard waits in the queue; promote_mbps=2:
    # half of 2 MB/s for the copy, so the two are still copying seconds
    # after the NAS is back, when the prober (at most 2 s between looks)
    # has seen it
    OPTIONS = NO_CACHE + ("auto_promote=off", "promote_mbps=2", "copy_workers=1",
                          "nas_timeout=%d" % NAS_TIMEOUT_MS)
    PROMOTE = False

    def test_promote_wait_through_an_outage(self):
        snap, _ = revision_entries()
        e, e2 = sorted(snap, key=lambda x: -x["size"])[:2]
        self.assertGreaterEqual(e["size"], 3 << 20, "the biggest shard is too small to copy slowly")
        other = self.take_nonlocal(False)
        path, path2 = self.m(e["path"]), self.m(e2["path"])
        p = subprocess.Popen([wfstest.wfsctl_bin(), "promote", "--wait", path, path2],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
        self.addCleanup(lambda: p.poll() is None and p.kill())
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(
            l.decode(errors="replace") for l in p.stderr), daemon=True)
        reader.start()
        # one copy worker: one copies (the order is the daemon's), the other waits
        states = lambda: sorted((state_of(path), state_of(path2)))  # noqa: E731
        self.assertTrue(wfstest.wait_until(lambda: states() == ["copying", "queued"], 30, 0.01),
                        "never one copying and one queued: %s" % states())
        NAS.check("hang")
        # a reader meets the frozen NAS: the daemon marks it down
        r = bounded(os.lstat, self.m(other["path"]), timeout=FAIL_WAIT)
        self.assertTrue(r["done"] and r["errno"] == errno.EIO, "lstat on a frozen NAS: %s" % r)
        said = wfstest.wait_until(lambda: any("the NAS is DOWN since" in l for l in lines), 30, 0.02)
        NAS.check("ok")
        self.assertTrue(said, "promote --wait did not say the NAS is down: %s" % lines)
        p.wait(timeout=120)   # (stderr is the reader's alone)
        reader.join(10)
        err = "".join(lines)
        self.assertEqual(p.returncode, 0, "promote --wait through an outage: exit %s\n%s"
                         % (p.returncode, err))
        down = [l for l in lines if "the NAS is DOWN since" in l]
        back = [l for l in lines if "the NAS answers again" in l]
        self.assertTrue(len(down) == 1 and len(back) == 1 and lines.index(down[0]) <
                        lines.index(back[0]), "one line down, then one back:\n" + err)
        self.assertIn("the copies wait for it", down[0])
        for pth, ent in ((path, e), (path2, e2)):
            self.assertEqual(state_of(pth), "local")
            self.assertEqual(sha_size_uncached(pth), (ent["sha256"], ent["size"]))


class FreshAttrs(WfsOnFaultNAS):
    """Attributes the daemon read from the NAS less than attr_timeout ago
    answer a GETATTR without a second NAS stat (issue 12).  The kernel asks
    for a directory's attributes again after each listing it read from the
    daemon (the listing marks its atime stale), within their timeout."""

    OPTIONS = ("auto_promote=off", "attr_timeout=60", "entry_timeout=60",
               "nas_timeout=%d" % NAS_TIMEOUT_MS)
    PROMOTE = False

    def listings_ahead(self):
        """(listed ahead, taken) from `wfsctl stats --json`."""
        m = ctl_json(self, ["--socket", self.sock, "stats"]).get("metrics") or {}
        ls = m.get("listings") or {}
        self.assertIsInstance(ls.get("ahead"), int, "stats has no metrics.listings: %s" % sorted(m))
        return ls["ahead"], ls["ahead_taken"]

    def test_getattr_after_listing_asks_nas_nothing(self):
        # original/ is the only directory of the revision, and has none: a
        # walk of the two has no next directory, so the daemon lists
        # nothing ahead -- a listing ahead (of a sibling) could meet the
        # frozen NAS below on a loaded machine, mark it down and fail this.
        # The start-up scan for links leaving NAS_HUB walks the NAS on a
        # thread of its own: it ends (one log line) before the NAS freezes.
        self.assertTrue(wfstest.wait_until(lambda: "under the repos' blobs/" in self.mount.log(),
                                           30, 0.02), "the start-up link scan did not end")
        p = "%s/snapshots/%s" % (REPO, REV)
        d = p + "/original"
        ahead0 = self.listings_ahead()[0]
        os.listdir(self.m(p))      # READDIRPLUS: the attributes of original/
        # held open: its dentry and its parents' stay in the kernel through
        # a drop_caches (another test's), which would send a LOOKUP
        held = os.open(self.m(d), os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, held)
        os.listdir(self.m(d))      # read from the daemon: its atime is stale
        self.assertEqual(self.listings_ahead()[0], ahead0, "a directory was listed ahead")
        before = self.nas()
        # frozen: a NAS stat now would hang in faultfs, past nas_timeout
        NAS.check("hang")
        r = bounded(os.lstat, self.m(d), timeout=FAIL_WAIT)
        hung = NAS.state()["hung"]
        NAS.check("ok")
        self.assertTrue(r["done"], "lstat %s: still blocked after %d s" % (d, FAIL_WAIT))
        self.assertIsNone(r["errno"], "lstat %s: %s; the daemon's log ends:\n%s"
                          % (d, errname(r["errno"]), self.debug_state()))
        self.assertEqual(hung, 0, "lstat %s reached the NAS (a call hung in faultfs); the daemon's "
                         "log ends:\n%s" % (d, self.debug_state()))
        nas = os.lstat(FIX.n(d))
        st = r["value"]
        self.assertEqual((st.st_ino, st.st_mtime_ns, st.st_nlink),
                         (nas.st_ino, nas.st_mtime_ns, nas.st_nlink), "lstat %s" % d)
        after = self.nas()
        self.assertEqual((after["state"], after["timeouts"]), ("up", before["timeouts"]), after)


class WalkCalls(WfsOnFaultNAS):
    """A walk of the NAS (status, promote, the record) classifies each
    entry by descriptor in its open directory: a snapshot link is an
    fstatat, a readlinkat and an fstatat in the open blobs/, and the walk's
    consumer takes the blob's attributes from it.  Each path-based call it
    made instead was a lookup of every component on a NAS that caches
    nothing (faultfs; an NFS client past its lookup cache)."""

    PROMOTE = False

    def test_status_of_300_links(self):
        self.assertTrue(wfstest.wait_until(lambda: "under the repos' blobs/" in self.mount.log(),
                                           30, 0.02), "the start-up link scan did not end")
        repo = MANY_BLOBS.split("/")[0]
        self.wait_nas("up", UP_WAIT)
        c0 = NAS.state()["calls"]
        st = ctl_json(self, ["status", self.m(repo)])
        calls = NAS.state()["calls"] - c0
        self.assertEqual([(r["repo"], r["files"]) for r in st["repos"]], [(repo, 300)])
        # one walk of the repo gives its figures and its revisions': ~12.5
        # faultfs requests a link (each call above a LOOKUP, with a GETATTR
        # or a READLINK); ~22 when each revision was walked again, ~97 when
        # every call looked its path up afresh
        self.assertLessEqual(calls, 15 * 300, "status of %s: %d NAS calls" % (repo, calls))

    def test_status_without_entry_types(self):
        """A NAS whose listings give no entry types (DT_UNKNOWN: NFS
        without READDIRPLUS) lists the same repos and revisions in status:
        they were all dropped, taken for files."""
        self.wait_nas("up", UP_WAIT)
        repo = MANY_BLOBS.split("/")[0]

        def seen():
            st = ctl_json(self, ["status", self.mnt])
            one = ctl_json(self, ["status", self.m(repo)])
            return (sorted((r["repo"], r["files"]) for r in st["repos"]),
                    sorted(v["rev"] for v in one["repos"][0]["revisions"]))
        want = seen()
        self.assertTrue(want[0] and want[1], want)
        NAS.check("notype 1")
        self.addCleanup(NAS.check, "notype 0")
        self.assertEqual(seen(), want, "status with a NAS listing no entry types")


class SlowNAS(WfsOnFaultNAS):
    """20 ms a NAS call (each FUSE request costs several) is slow, not down
    (default nas_timeout)."""

    OPTIONS = NO_CACHE + ("auto_promote=off",)
    PROMOTE = False

    def test_latency(self):
        before = self.nas()
        NAS.check("latency 20")
        files = [self.take_nonlocal(True), self.take_nonlocal(False)]
        files.append(min(revision_entries()[1], key=lambda e: e["size"]))
        for e in files:
            self.assert_reads_right(e)
        self.assertEqual(NAS.state()["latency_ms"], 20)
        # status walks the NAS while it is up: asked at full speed, its
        # counters say whether the NAS ever went down meanwhile
        NAS.check("latency 0")
        st = self.nas()
        self.assertEqual(st["state"], "up", st)
        self.assertEqual((st["outages"], st["timeouts"]), (before["outages"], before["timeouts"]), st)



class OthersMidWalk(WfsOnFaultNAS):
    def test_status_of_another_user_nas_down_mid_walk(self):
        NAS.check("faildir %s/snapshots hang" % OTHER_REPO)
        res = {}

        def status():
            res["r"] = run_wfsctl(["--json", "--socket", self.sock, "status"],
                                  uid=wfstest.NOBODY, timeout=60)
        t = threading.Thread(target=status)
        t.start()
        try:
            self.assertTrue(wfstest.wait_until(lambda: NAS.state()["hung"] >= 1, 10),
                            "the walk never reached %s/snapshots" % OTHER_REPO)
            # the NAS gone, and the daemon told so by a call of the mount's
            NAS.check("fail ENOTCONN")
            wfstest.errno_of(os.stat, self.m(OTHER_REPO + "/refs/main"))
            self.wait_nas("down", DOWN_WAIT)
            # then the walk's frozen listing fails as every call does now
            NAS.check("faildir %s/snapshots ENOTCONN" % OTHER_REPO)
        finally:
            t.join(70)
        self.assertFalse(t.is_alive(), "wfsctl status did not end")
        rc, out, err = res["r"]
        self.assertEqual(rc, 1, "status of another user, the NAS gone mid-walk: %s %s; log: %s"
                         % (out, err, self.mount.log()[-3000:]))
        self.assertIn("the NAS does not answer, and another user's status", out + err)
        self.assertNotIn(REPO, out, "the store's list of repos told another user")

if __name__ == "__main__":
    wfstest.main()
