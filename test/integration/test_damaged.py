#!/usr/bin/env python3
"""Damaged local state, and the store never widening access.

Each test mounts a small hub of its own (wfs -f, its log in a file), makes
copies local, stops the daemon, damages LOCAL_STORE the way life does, and
starts again.  Whatever the damage, the daemon starts, serves the NAS's
bytes (compared through the mount), never an unverified copy, and logs what
it did:

  index.json truncated, garbage, over the size cap
      -> moved aside to index.json.damaged, no records, data/ kept (also
         at the starts after, until it is removed); a
         second one beside it (index.json.damaged.1), never over it
  (an index of another version: test_versions.py)
  a record naming a missing copy, a copy of the wrong size, a copy name
  leading out of data/
      -> the record dropped (the blob on the NAS), nothing outside touched
  a copy with bytes changed but its size kept (outside the sampled ranges
  too), a copy touched but unchanged, a copy two blobs share
      -> re-hashed in full before it serves: corrupt -> demoted (every blob
         it served) and removed, equal -> local again
  data/ or tmp/ missing -> created again
  a copy removed under the running daemon -> demoted at its next open,
      the NAS's bytes; promoted again; so too a copy written to in place
  a stale wfs.lock (a dead pid; a daemon killed -9) -> taken over
  LOCAL_STORE on a full filesystem -> mounts, promotions held for room
  LOCAL_STORE on a read-only filesystem -> mounts, the verified copies
      serve, no control socket; so too with a socket left by a daemon
      that could not remove it (killed, or its store turned read-only)

and: a NAS file only root may read, once promoted (whole, or a range of
it), is readable by another user neither through the mount nor in
LOCAL_STORE.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from dmg_fix import BIG, BIG_SIZE, INDEX_MAX, MiB, SETTLE, SMALL, DamageCase, Store  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of  # noqa: E402

def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()


class Damage(DamageCase):
    # ---- an index that cannot be read

    def test_truncated_index(self):
        def cut(path):
            size = os.path.getsize(path)
            os.truncate(path, size // 2)
        self.damaged_index(cut, "truncated, not JSON, or not an index of a known version")

    def test_garbage_index(self):
        def garbage(path):
            with open(path, "wb") as f:
                f.write(wfstest.det_bytes("garbage", 10000))
        self.damaged_index(garbage, "truncated, not JSON, or not an index of a known version")

    def test_damaged_twice(self):
        """A second damaged index goes beside the first, never over it:
        the first may be the one that still names the copies."""
        self.local_both()
        path = os.path.join(self.st.local, "index.json")
        kept = []
        for n, aside in enumerate((path + ".damaged", path + ".damaged.1")):
            bad = wfstest.det_bytes("garbage-%d" % n, 5000)
            with open(path, "wb") as f:
                f.write(bad)
            kept.append((aside, bad))
            self.st.start()
            self.wait_log(r"index %s unreadable \(.*\); moved aside to %s\. "
                          % (re.escape(path), re.escape(aside)), 0)
            self.st.stop(self)
        for aside, bad in kept:
            with open(aside, "rb") as f:
                self.assertEqual(f.read(), bad, "%s is the index it set aside" % aside)

    def test_huge_index(self):
        def huge(path):
            # sparse: no disk space, and refused by its size before parsing
            with open(path, "r+b") as f:
                f.truncate(INDEX_MAX + 1)
        self.damaged_index(huge, r"larger than 256 MiB: not read")

    # ---- records whose copy is not what was verified

    def test_missing_copy(self):
        idx = self.local_both()
        os.unlink(self.st.copy(BIG, idx))
        self.st.start()
        self.wait_log(r"start-up: dropped local copy of %s \(local copy missing\)"
                      % re.escape(self.st.key(BIG)), 0)
        self.assert_states({BIG: "nas", SMALL: "local"})
        self.assert_bytes(BIG)
        self.assert_bytes(SMALL)

    def test_copy_changed_under_the_daemon(self):
        """A copy written to in place while the daemon runs (its size kept):
        the next open does not serve it -- it is not the file verified --
        but the NAS's bytes, and every blob it served is demoted; promoted
        again, it is a copy again.  (It was served until a restart.)"""
        self.st.start()
        self.st.promote(self, BIG, SMALL)
        copy = self.st.copy(BIG)
        os.chmod(copy, 0o600)
        with open(copy, "r+b") as f:
            f.seek(BIG_SIZE // 3)
            f.write(b"\0\1\2")
        os.chmod(copy, 0o400)
        self.assert_bytes(BIG, "after its copy was changed")
        self.wait_log(r"local copy %s of %s \(\w+\) not served: local copy changed on disk "
                      r"since it was verified" % (re.escape(copy), re.escape(self.st.key(BIG))), 0)
        self.assert_states({BIG: "nas", SMALL: "local"})
        self.assertFalse(os.path.exists(copy), "the changed copy was removed")
        self.st.promote(self, BIG)
        self.assert_bytes(BIG, "promoted again")

    def test_verify_of_a_changed_copy(self):
        """wfsctl verify checks that each copy is still the file verified:
        one written to under the daemon is demoted (exit 1, the reason);
        one only touched, hashed whole by verify --full and right, is the
        verified copy as it is now, and the next open serves it."""
        self.st.start()
        self.st.promote(self, BIG, SMALL)
        small, big = self.st.copy(SMALL), self.st.copy(BIG)
        os.chmod(small, 0o600)
        with open(small, "r+b") as f:
            f.write(b"{")
        os.chmod(small, 0o400)
        rc, out, err = wfstest.run_wfsctl(["verify", self.st.path(SMALL)])
        self.assertEqual(rc, 1, "verify of a changed copy: %r %r" % (out, err))
        self.assertIn("local copy changed on disk since it was verified", out + err)
        self.assert_states({BIG: "local", SMALL: "nas"})
        self.assert_bytes(SMALL, "after verify demoted it")
        os.utime(big, ns=(1, 1))  # touched, bytes as verified
        ctl_check(self, ["verify", "--full", self.st.path(BIG)])
        self.assert_bytes(BIG, "touched, verified whole")
        self.assert_states({BIG: "local", SMALL: "nas"})
        self.assertNotIn("%s (" % big, "".join(
            ln for ln in self.st.log().splitlines(True) if "not served" in ln))

    def test_copy_removed_under_the_daemon(self):
        """A copy removed from data/ while the daemon runs (by hand, a tmp
        cleaner): the next open reads the NAS's bytes and the blob is
        demoted, not left `local` with every open going to the NAS (nor
        counted local in status, nor served from the record while the NAS
        is down); promoted again, it is a copy again."""
        self.st.start()
        self.st.promote(self, BIG, SMALL)
        copy = self.st.copy(BIG)
        os.unlink(copy)
        self.assert_bytes(BIG, "after its copy was removed")
        self.wait_log(r"local copy %s of %s \(\w+\) failed a read: No such file or directory"
                      % (re.escape(copy), re.escape(self.st.key(BIG))))
        self.assert_states({BIG: "nas", SMALL: "local"})
        self.st.promote(self, BIG)
        self.assertTrue(os.path.exists(copy), "promoted again: no copy in data/")
        self.assert_bytes(BIG, "promoted again")

    def test_wrong_size_copy(self):
        idx = self.local_both()
        copy = self.st.copy(BIG, idx)
        os.truncate(copy, BIG_SIZE - 1)
        self.st.start()
        self.wait_log(r"start-up: dropped local copy of %s \(local copy has the wrong size: "
                      r"%d bytes, %d expected\)" % (re.escape(self.st.key(BIG)), BIG_SIZE - 1,
                                                    BIG_SIZE), 0)
        self.wait_log(r"start-up: removed unreferenced copy %s" % re.escape(copy), 0)
        self.assertFalse(os.path.exists(copy))
        self.assert_states({BIG: "nas", SMALL: "local"})
        self.assert_bytes(BIG)

    def test_flipped_bytes_same_size(self):
        """Bytes changed in the middle and at a quarter (outside the 64 KiB
        sampled at head, middle and tail), size kept: re-hashed, demoted,
        removed; never served."""
        idx = self.local_both()
        copy = self.st.copy(BIG, idx)
        with open(copy, "r+b") as f:
            for off in (BIG_SIZE // 2, BIG_SIZE // 4):
                f.seek(off)
                b = f.read(1)
                f.seek(off)
                f.write(bytes([b[0] ^ 0xff]))
        self.assertNotEqual(wfstest.read_file(copy), self.st.data[BIG])
        self.st.start()
        key = re.escape(self.st.key(BIG))
        self.wait_log(r"start-up: local copy %s of %s \(\w+\) is re-hashed before it serves: "
                      r"it changed since it was verified" % (re.escape(copy), key), 0)
        # served from the NAS while it is re-hashed, and after
        self.assertIn(state_of(self.st.path(BIG)), ("copying", "nas"))
        self.assert_bytes(BIG, "while its copy is re-hashed")
        self.wait_log(r"demoted %s \(\w+\): local copy corrupt: xxh128 [0-9a-f]{32}, expected "
                      r"%s; its copy %s was never served and is removed"
                      % (key, self.st.record(BIG, idx)["xxh"], re.escape(copy)))
        self.assert_states({BIG: "nas", SMALL: "local"})
        self.assert_bytes(BIG, "after the demotion")
        self.assert_bytes(SMALL)
        self.assertFalse(os.path.exists(copy), "the corrupt copy was removed")
        st = ctl_json(self, ["status", self.st.mnt])
        self.assertEqual(st["counters"]["demoted"], 1, st["counters"])
        # promoted again, the copy is right
        self.st.promote(self, BIG)
        self.assert_bytes(BIG, "promoted again")

    def shared_copy(self):
        """BIG in a second repo too (another NAS file, the same bytes):
        both promoted, one copy.  Returns (its mount path, its key, the
        copy)."""
        rev2 = wfstest.make_hf_repo(self.st.hub, "models--dmg--b", {BIG: self.st.data[BIG]})
        rel = os.path.join("models--dmg--b", "snapshots", rev2, BIG)
        other = os.path.join(self.st.mnt, rel)
        self.st.start()
        ctl_check(self, ["promote", "--wait", self.st.path(BIG), other])
        self.assertEqual((state_of(self.st.path(BIG)), state_of(other)), ("local", "local"))
        self.st.stop(self)
        copies = self.st.files()
        self.assertEqual(len(copies), 1, "one copy for equal bytes: %s" % copies)
        return other, os.path.realpath(os.path.join(self.st.hub, rel)), \
            os.path.join(self.st.local, "data", copies[0])

    def test_shared_copy_flipped(self):
        """A copy two blobs share, corrupt: both demoted, neither serves it."""
        other, key2, copy = self.shared_copy()
        with open(copy, "r+b") as f:
            f.seek(BIG_SIZE // 3)
            f.write(b"\0\1\2")
        self.st.start()
        for k in (self.st.key(BIG), key2):
            self.wait_log(r"demoted %s \(\w+\): local copy (corrupt|missing)" % re.escape(k))
        self.assertEqual((state_of(self.st.path(BIG)), state_of(other)), ("nas", "nas"))
        self.assert_bytes(BIG)
        self.assertEqual(wfstest.read_file(other), self.st.data[BIG])
        self.assertEqual(self.st.files(), [])

    def test_shared_copy_touched(self):
        """A copy two blobs share, touched but unchanged: both local again."""
        other, key2, copy = self.shared_copy()
        os.utime(copy, ns=(1, 1))
        self.st.start()
        for k in (self.st.key(BIG), key2):
            self.wait_log(r"re-verified local copy of %s " % re.escape(k))
        self.assertEqual((state_of(self.st.path(BIG)), state_of(other)), ("local", "local"))
        self.assert_bytes(BIG)
        self.assertEqual(wfstest.read_file(other), self.st.data[BIG])

    def test_directory_in_place_of_a_copy(self):
        """A directory where a copy goes: never served, not removed, and a
        promotion that cannot put its copy there says where and why."""
        idx = self.local_both()
        copy = self.st.copy(SMALL, idx)
        os.unlink(copy)
        os.makedirs(os.path.join(copy, "sub"))
        self.st.start()
        self.wait_log(r"start-up: dropped local copy of %s \(local copy is not a regular "
                      r"file\)" % re.escape(self.st.key(SMALL)), 0)
        self.assert_states({BIG: "local", SMALL: "nas"})
        rc, out, err = wfstest.run_wfsctl(["promote", "--wait", self.st.path(SMALL)])
        self.assertEqual(rc, 1, "promote onto a directory: %r %r" % (out, err))
        why = "cannot move the verified copy into %s: Is a directory" % copy
        self.assertIn(why, err)
        flagged = ctl_json(self, ["status", self.st.mnt])["flagged"]
        self.assertEqual([(f["key"], f["reason"]) for f in flagged], [(self.st.key(SMALL), why)])
        self.assertTrue(os.path.isdir(os.path.join(copy, "sub")), "the directory is kept")
        self.assert_bytes(SMALL)

    def test_record_naming_a_path_outside_data(self):
        """A damaged record whose copy name leads out of data/ (to a file
        of the blob's size): never served, never removed."""
        self.local_both()
        victim = os.path.join(self.st.base, "victim" + "A" * 23)
        with open(victim, "wb") as f:
            f.write(b"v" * len(self.st.data[SMALL]))
        ipath = os.path.join(self.st.local, "index.json")
        idx = self.st.index()
        # data/<xx>/<xxh>: ".." and "../victimAAA..." (32 characters)
        self.st.record(SMALL, idx)["xxh"] = "../" + os.path.basename(victim)
        self.assertEqual(len(self.st.record(SMALL, idx)["xxh"]), 32)
        self.assertTrue(os.path.samefile(self.st.copy(SMALL, idx), victim))
        with open(ipath, "w") as f:
            json.dump(idx, f)
        self.st.start()
        self.wait_log(r"start-up: dropped local copy of %s \(the index names no valid copy\)"
                      % re.escape(self.st.key(SMALL)), 0)
        self.assert_states({BIG: "local", SMALL: "nas"})
        self.assert_bytes(SMALL)
        self.assertTrue(os.path.exists(victim), "a file outside data/ was removed")

    def test_records_without_a_key(self):
        """Records with no key, or a key that is not a NAS path, are
        damage: counted in the start-up's warning, not passed over as
        nothing; the others still serve."""
        self.local_both()
        ipath = os.path.join(self.st.local, "index.json")
        idx = self.st.index()
        big = self.st.record(BIG, idx)
        small_copy = self.st.copy(SMALL, idx)
        del self.st.record(SMALL, idx)["key"]
        idx["blobs"].append(dict(big, key=17))
        idx["blobs"].append(dict(big, key="models--x/blobs/y"))
        with open(ipath, "w") as f:
            json.dump(idx, f)
        self.st.start()
        self.wait_log(r"start-up: index %s: 3 damaged records skipped" % re.escape(ipath), 0)
        self.assertFalse(os.path.exists(small_copy), "a copy no record names is kept")
        self.assert_states({BIG: "local", SMALL: "nas"})
        self.assert_bytes(SMALL)
        self.assert_bytes(BIG)

    def test_touched_copy_same_bytes(self):
        """A copy whose times changed but whose bytes did not: re-hashed,
        local again, its new identity recorded (no re-hash at the next
        start)."""
        idx = self.local_both()
        copy = self.st.copy(BIG, idx)
        os.utime(copy, ns=(1, 1))
        self.st.start()
        key = re.escape(self.st.key(BIG))
        self.wait_log(r"start-up: local copy %s of %s \(\w+\) is re-hashed before it serves"
                      % (re.escape(copy), key), 0)
        self.assert_bytes(BIG)
        self.wait_log(r"re-verified local copy of %s \(\w+\): xxh128 %s as recorded; served "
                      r"locally again" % (key, self.st.record(BIG, idx)["xxh"]))
        self.assert_states({BIG: "local", SMALL: "local"})
        self.assert_bytes(BIG)
        self.st.stop(self)
        rec, sb = self.st.record(BIG), os.stat(copy)
        self.assertEqual((rec["copy_ino"], rec["copy_ctime_s"], rec["copy_ctime_ns"]),
                         (sb.st_ino, int(sb.st_ctime_ns // 10**9), sb.st_ctime_ns % 10**9),
                         "the index records the copy's identity now")
        self.st.start()
        self.assert_states({BIG: "local", SMALL: "local"})
        self.assertNotRegex(self.st.log(), "is re-hashed before it serves")

    # ---- directories, the lock

    def test_data_and_tmp_missing(self):
        self.local_both()
        shutil.rmtree(os.path.join(self.st.local, "data"))
        shutil.rmtree(os.path.join(self.st.local, "tmp"))
        self.st.start()
        for d in ("data", "tmp"):
            self.wait_log(r"start-up: %s/%s was missing: created again"
                          % (re.escape(self.st.local), d), 0)
            self.assertEqual(os.stat(os.path.join(self.st.local, d)).st_mode & 0o777, 0o700)
        for name in (BIG, SMALL):
            self.wait_log(r"start-up: dropped local copy of %s \(local copy missing\)"
                          % re.escape(self.st.key(name)), 0)
        self.assert_states({BIG: "nas", SMALL: "nas"})
        self.assert_bytes(BIG)
        self.assert_bytes(SMALL)
        self.st.promote(self, SMALL)
        self.assert_bytes(SMALL)

    def test_stale_lock_dead_pid(self):
        self.local_both()
        dead = next(p for p in range(4194303, 1000, -1) if not wfstest.pid_alive(p))
        lock = os.path.join(self.st.local, "wfs.lock")
        with open(lock, "w") as f:
            f.write("%d\n" % dead)
        self.st.start()
        self.assertTrue(wfstest.wait_until(
            lambda: wfstest.read_file(lock).strip() == str(self.st.mount.proc.pid).encode(), 10),
            "wfs.lock holds the new daemon's pid")
        self.assert_states({BIG: "local", SMALL: "local"})

    def test_stale_lock_killed_daemon(self):
        self.local_both()
        self.st.start()
        proc = self.st.mount.proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        subprocess.run(["fusermount3", "-uz", self.st.mnt], capture_output=True)
        if wfstest.is_mounted(self.st.mnt):
            subprocess.run(["umount", "-l", self.st.mnt], capture_output=True)
        self.assertTrue(wfstest.wait_until(lambda: not wfstest.is_mounted(self.st.mnt), 5))
        self.st.mount.cleanup()
        self.st.mount = None
        self.assertTrue(os.path.exists(os.path.join(self.st.local, "wfs.lock")))
        self.st.start()
        self.assert_states({BIG: "local", SMALL: "local"})
        self.assert_bytes(BIG)


class OnItsOwnFilesystem(unittest.TestCase):
    """LOCAL_STORE on a small ext4 image (loop device)."""

    def setUp(self):
        if not shutil.which("mkfs.ext4") or not shutil.which("losetup"):
            wfstest.skip_or_fail("mkfs.ext4 and losetup are needed")
        self.img_dir = wfstest.make_base("wfs-dmg-img-")
        self.fs = wfstest.LoopFs(os.path.join(self.img_dir, "store.img"),
                                 os.path.join(self.img_dir, "fs"), size_mib=32)
        self.st = None
        try:
            self.fs.setup()
            self.st = Store(local=os.path.join(self.fs.mnt, "local"))
        except BaseException:
            self.undo()  # a setUp that raises has no tearDown: the loop device stayed
            raise

    def undo(self):
        problems = []
        if self.st:
            self.st.cleanup()
        problems += self.fs.teardown()
        if self.st:
            self.st.remove()
        shutil.rmtree(self.img_dir, ignore_errors=True)
        return problems

    def tearDown(self):
        self.assertEqual(self.undo(), [])

    def wait_log(self, pattern, timeout=SETTLE):
        rx = re.compile(pattern)
        if not wfstest.wait_until(lambda: rx.search(self.st.log()), timeout):
            self.fail("no log line /%s/ within %d s; log:\n%s" % (pattern, timeout, self.st.log()))

    def fill(self):
        """Write until the filesystem is full (as root: the reserved blocks
        too), to its last block (1 KiB on an image this small): a write of
        a few hundred bytes must find no room either."""
        with open(os.path.join(self.fs.mnt, "fill"), "wb", buffering=0) as f:
            first = True
            for size in (MiB, 4096, 512):
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError as e:
                    if first:
                        self.assertEqual(e.errno, 28, "filling the store's filesystem: %r" % e)
                    first = False

    def test_full_store(self):
        self.st.start()
        self.st.promote(self, SMALL)
        self.st.stop(self)
        self.fill()
        self.st.start()
        self.wait_log(r"start-up: LOCAL_STORE %s is full \(" % re.escape(self.st.local), 0)
        self.assertEqual(state_of(self.st.path(SMALL)), "local")
        # a promotion is held for room, never ENOSPC to a reader
        rc, out, err = wfstest.run_wfsctl(["--json", "promote", "--wait", self.st.path(BIG)])
        self.assertIsNotNone(rc)
        self.assertEqual(state_of(self.st.path(BIG)), "nas")
        st = ctl_json(self, ["status", self.st.mnt])
        held = [h for h in st.get("held", []) if h["key"] == self.st.key(BIG)]
        self.assertEqual(len(held), 1, "status --json held: %s" % st.get("held"))
        self.assertEqual(held[0]["hold"], "no_room")
        self.assertIn("no room", held[0]["reason"])
        got = wfstest.read_file(self.st.path(BIG))
        self.assertTrue(got == self.st.data[BIG], "bytes through the mount")
        self.assertEqual(wfstest.read_file(self.st.path(SMALL)), self.st.data[SMALL])

    def test_index_write_fails_when_full(self):
        """A change a request made that the index cannot record (the disk
        filled since): the request exits 1 with the reason, the index on
        disk stays whole, no temporary file is left, and the write is made
        once there is room again."""
        self.st.start()
        self.st.promote(self, SMALL)
        path = os.path.join(self.st.local, "index.json")
        with open(path, "rb") as f:
            before = f.read()
        self.fill()
        rc, out, err = wfstest.run_wfsctl(["pin", self.st.path(BIG)])
        self.assertEqual(rc, 1, "wfsctl pin with the index unwritable: %r %r" % (out, err))
        self.assertRegex(err, r"pin: done, but cannot write the index %s: No space left on "
                         r"device" % re.escape(path))
        # a dry run (open to every user) changes nothing: nothing of it to record
        rc, out, err = wfstest.run_wfsctl(["--json", "promote", "--dry-run", self.st.path(BIG)])
        self.assertEqual(rc, 0, "wfsctl promote --dry-run with the index unwritable: %r" % err)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), before, "index.json after a failed write")
        self.assertEqual([n for n in os.listdir(self.st.local) if n.endswith(".tmp")], [])
        self.assertEqual(state_of(self.st.path(SMALL)), "local")
        self.assertEqual(wfstest.read_file(self.st.path(SMALL)), self.st.data[SMALL])
        os.unlink(os.path.join(self.fs.mnt, "fill"))

        def pinned():
            try:
                return self.st.record(BIG)["pinned"]
            except AssertionError:  # no record of BIG yet
                return False
        self.assertTrue(wfstest.wait_until(pinned, SETTLE), "the pin never reached index.json")
        ctl_check(self, ["pin", self.st.path(BIG)])

    def test_read_only_store(self):
        """LOCAL_STORE's filesystem read-only at start: the mount works,
        the proven copies serve, the rest comes from the NAS."""
        self.st.start()
        self.st.promote(self, SMALL)
        self.st.stop(self)
        wfstest.sh("mount", "-o", "remount,ro", self.fs.mnt)
        self.st.start(ctl=False)
        self.wait_log(r"start-up: LOCAL_STORE %s is on a read-only filesystem"
                      % re.escape(self.st.local), 0)
        self.wait_log(r"LOCAL_STORE %s is read-only: its verified copies serve"
                      % re.escape(self.st.local))
        self.assertEqual(state_of(self.st.path(SMALL)), "local")
        self.assertEqual(wfstest.read_file(self.st.path(BIG)), self.st.data[BIG])
        self.assert_no_socket_said()

    def assert_no_socket_said(self):
        """wfsctl says why it finds no daemon: it said "No such file or
        directory" (or "Connection refused") and nothing more."""
        rc, out, err = wfstest.run_wfsctl(["status", self.st.mnt])
        self.assertEqual(rc, 1, err)
        self.assertIn("its directory is on a read-only filesystem: no daemon runs there, or "
                      "one whose LOCAL_STORE is read-only, which has no control socket", err)

    def test_read_only_store_with_a_socket_left(self):
        """A daemon that could not remove its control socket (killed, or
        its store turned read-only under it: ext4's errors=remount-ro
        after a disk error), the store read-only since: the next start
        works as on any read-only store (it refused: EADDRINUSE)."""
        self.st.start()
        self.st.promote(self, SMALL)
        wfstest.kill_daemon(self, self.st.mount.pids)
        wfstest.drop_dead_mount(self, self.st.mnt)
        self.st.mount.cleanup()
        self.st.mount = None
        self.assertTrue(os.path.exists(os.path.join(self.st.local, "wfs.sock")))
        wfstest.sh("mount", "-o", "remount,ro", self.fs.mnt)
        self.st.start(ctl=False)
        self.wait_log(r"LOCAL_STORE %s is read-only: its verified copies serve"
                      % re.escape(self.st.local))
        self.assertEqual(state_of(self.st.path(SMALL)), "local")
        self.assertEqual(wfstest.read_file(self.st.path(SMALL)), self.st.data[SMALL])
        self.assertEqual(wfstest.read_file(self.st.path(BIG)), self.st.data[BIG])
        self.assert_no_socket_said()


class NeverWidensAccess(unittest.TestCase):
    def setUp(self):
        self.st = Store()
        blob = self.st.key(BIG)
        os.chmod(blob, 0o600)   # on the NAS, only root may read it

    def tearDown(self):
        self.st.cleanup()
        self.st.remove()

    def test_root_only_file_stays_root_only(self):
        self.st.start()
        self.st.promote(self, BIG)
        # the worker records the copy in the index when its batch ends
        self.assertTrue(wfstest.wait_until(lambda: self.st.has_record(BIG), 10),
                        "index.json never named the copy of %s" % BIG)
        copy = self.st.copy(BIG)
        local = self.st.local
        modes = {p: os.stat(p).st_mode & 0o777 for p in
                 (local, os.path.join(local, "data"), os.path.join(local, "tmp"), copy,
                  os.path.join(local, "index.json"))}
        self.assertEqual(modes, {local: 0o711, os.path.join(local, "data"): 0o700,
                                 os.path.join(local, "tmp"): 0o700, copy: 0o400,
                                 os.path.join(local, "index.json"): 0o600})
        # the daemon (root) serves it to root, locally
        self.assertEqual(wfstest.read_file(self.st.path(BIG)), self.st.data[BIG])
        # another user: neither through the mount nor in LOCAL_STORE
        for what, fn, arg in (("the mount", wfstest.read_file, self.st.path(BIG)),
                              ("the copy", wfstest.read_file, copy),
                              ("data/", os.listdir, os.path.join(local, "data")),
                              ("the index", wfstest.read_file, os.path.join(local, "index.json"))):
            res, err = wfstest.as_uid(fn, arg)
            self.assertEqual(err, 13, "uid %d reading %s (%s): %r" % (wfstest.NOBODY, what, arg,
                                                                      res and res[:32]))
        rc, out, err = wfstest.run_as_uid(["/bin/cat", copy], wfstest.NOBODY, 20)
        self.assertNotEqual(rc, 0, "cat of the copy as uid %d" % wfstest.NOBODY)
        self.assertNotIn(self.st.data[BIG][:64].decode(errors="replace"), out)
        # the control socket inside LOCAL_STORE stays reachable for status
        rc, out, err = wfstest.run_wfsctl(["status", self.st.mnt], uid=wfstest.NOBODY)
        self.assertEqual(rc, 0, "wfsctl status as uid %d: %s%s" % (wfstest.NOBODY, out, err))

    def test_root_only_file_partial_copy_stays_root_only(self):
        """The same for a partial copy (promote --range): parts/ 0700, its
        file 0600, neither listed nor read by another user."""
        self.st.start()
        ctl_check(self, ["promote", "--wait", "--range", "0:1M", self.st.path(BIG)])
        self.assertEqual(state_of(self.st.path(BIG)), "partial")
        parts = os.path.join(self.st.local, "parts")
        names = os.listdir(parts)
        self.assertEqual(len(names), 1, "parts/: %s" % names)
        pfile = os.path.join(parts, names[0])
        self.assertEqual({p: os.stat(p).st_mode & 0o777 for p in (parts, pfile)},
                         {parts: 0o700, pfile: 0o600})
        self.assertEqual(wfstest.read_file(self.st.path(BIG)), self.st.data[BIG])
        for what, fn, arg in (("the mount", wfstest.read_file, self.st.path(BIG)),
                              ("the partial file", wfstest.read_file, pfile),
                              ("parts/", os.listdir, parts)):
            res, err = wfstest.as_uid(fn, arg)
            self.assertEqual(err, 13, "uid %d reading %s (%s): %r" % (wfstest.NOBODY, what, arg,
                                                                      res and res[:32]))


if __name__ == "__main__":
    wfstest.main()
