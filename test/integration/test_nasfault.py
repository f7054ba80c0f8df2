#!/usr/bin/env python3
"""The daemon when its NAS fails (issue 10), on a NAS that fails on demand:
test/faultfs, a FUSE view of the generated hub (faultnas.FaultNAS), frozen
(`hang`), gone (`fail ENOTCONN`, or kill -9: a dead mount), vanished or
failing EIO: what the local revision serves through it, and what comes
back after it.  NAS calls that fail part way (a bad range, a short read),
stall under a copy or a walk, or are slow, and the calls the daemon spares
the NAS, are test_nascalls.py's.

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
  ClosesFrozen        opens of a local blob released while the NAS hangs
                      in a file's close (two FUSE workers): the revision
                      still reads right
  SwappedWhileOpen    a local blob opened with the NAS down, evicted once
                      it is back and its NAS file replaced: the next read
                      fails EIO, never mixes the two files

Every call that could hang runs in a thread with a bounded join (a hang
fails the test instead of hanging it); waits are on events (status, the
faultfs state), never sleeps; tearDown puts the NAS back to health first.
"""

import errno
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import nf_base  # noqa: E402
import nf_faultfs  # noqa: E402
import wfstest  # noqa: E402
# (NO_CACHE for test_uringfault, which takes this module's names)
from nf_base import (FIX, MANY_BLOBS, REPO, OTHER_REPO, LOCAL_WAIT, FAIL_WAIT, DOWN_WAIT,  # noqa: E402,F401
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


if __name__ == "__main__":
    wfstest.main()
