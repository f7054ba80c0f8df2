#!/usr/bin/env python3
"""Promotion (wfsctl promote/evict/verify), checked the way a user would:
xattr user.wfs.state, `wfsctl --json status`, the local store's files, the
bytes read through the mount, and -- for "reads come from local disk" -- the
read counter of the NAS's own block device.

  LocalReads      the NAS hub on its own loop-mounted ext4: after
                  `promote --wait REPO` every file is local and reading them all
                  (caches dropped) reads ~nothing from the NAS device
  SwapUnderLoad   4 readers (pread, mmap) on a shard opened before its
                  promotion: no wrong byte, no error, across the swap
  Mismatch        a blob whose bytes do not match its SHA-256 name
  EqualSizePacks  two equal-size real files with different content
  SourceChanged   NAS bytes rewritten under the same name, size and mtime
  ReplacedMidCopy a real file (no content address) replaced on the NAS by
                  same-size new bytes while it is copied, the change seen
                  through the mount: the old copy never serves
  RenamedDownload a download's blobs/<id>.incomplete, seen through the
                  mount, renamed on the NAS to blobs/<id> (the same inode):
                  with bytes not matching <id>, promote says mismatch;
                  with the right bytes, kept open across the rename,
                  promote makes <id> local and it reads right
  DryRunPinEvict  promote --dry-run, --pin, evict (refused), evict --force
  Demo            tools/demo with WFS_DEMO_WFS naming a wfs installed beside
                  its wfsctl (here: it drops the page cache, as the 'caches'
                  tests may)
"""

import hashlib
import mmap
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl, state_of, wait_state  # noqa: E402

MiB = 1 << 20
# promote_mbps: slow enough that the swap test's copy of an 18 MiB shard takes
# a couple of seconds under its readers, fast enough for the rest (a copy
# gets a third of it with two copy workers: 4 MB/s).
FIX = wfstest.HubFixture(options=("promote_mbps=12", "auto_promote=off"), scale_mib=40, many=0, mount=False)
CORRUPT = {}   # the blob altered before mounting (Mismatch)
# ReplacedMidCopy: a real file in the packs snapshot (its name is no content
# address: only the source's identity can tell its bytes changed), big
# enough that its copy at promote_mbps=12 takes about two seconds
RACE = {"size": 16 * MiB}


def flip_middle_byte(path, size):
    """XOR the byte in the middle of a file in place (twice puts it back),
    synced: a NAS blob whose bytes no longer match its name, or match it
    again."""
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    FIX.setup()
    try:
        # A NAS blob whose bytes do not match its SHA-256 name, made BEFORE the
        # mount exists (as a bad rsync would leave it): the dataset's parquet.
        e = next(e for e in FIX.of("file") if e["path"].startswith("datasets--acme--data/blobs/")
                 and len(e.get("blob_id", "")) == 64)
        p = FIX.n(e["nas_real"])
        flip_middle_byte(p, e["size"])
        CORRUPT.update(entry=e, nas=p)
        pack = next(e for e in FIX.of("file") if "/packs/pack-" in e["path"])
        RACE["rel"] = os.path.join(os.path.dirname(pack["path"]), "pack-race.bin")
        with open(FIX.n(RACE["rel"]), "wb") as f:
            f.write(b"F" * RACE["size"])
        FIX.mount = wfstest.Mount(FIX.hub, FIX.local, FIX.mnt, FIX.options).start()
        wfstest.wait_ctl(FIX.mnt)
    except BaseException:
        FIX.teardown(raise_problems=False)
        raise


def tearDownModule():
    FIX.teardown()


# ------------------------------------------------------------------ 1

class LocalReads(unittest.TestCase):
    """NAS hub on its own block device; promote a repo; read it all back."""

    REPO = "models--acme--standard"
    CONTROL = "models--acme--hubstore"   # not promoted: proves the counter sees NAS reads

    @classmethod
    def setUpClass(cls):
        cls.base = wfstest.make_base("wfs-it-loopnas-")
        cls.loop = wfstest.LoopFs(os.path.join(cls.base, "nas.img"),
                                  os.path.join(cls.base, "nasfs"), 256)
        cls.mount = None
        try:
            cls.loop.setup()
            gen = os.path.join(cls.loop.mnt, "gen")
            cls.manifest = wfstest.generate_hub(gen, scale_mib=32, many=0)
            cls.fix = wfstest.HubFixture()   # only for its manifest helpers
            cls.fix.hub = cls.manifest["hub"]
            cls.fix.entries = cls.manifest["entries"]
            cls.fix.by_path = {e["path"]: e for e in cls.fix.entries}
            cls.fix.local = os.path.join(cls.base, "local")
            cls.fix.mnt = os.path.join(cls.base, "mnt")
            os.mkdir(cls.fix.mnt)
            os.sync()
            cls.mount = wfstest.Mount(cls.fix.hub, cls.fix.local, cls.fix.mnt, ("auto_promote=off",)).start()
            wfstest.wait_ctl(cls.fix.mnt)
        except BaseException:
            cls.cleanup(raise_problems=False)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cleanup()

    @classmethod
    def cleanup(cls, raise_problems=True):
        problems = []
        if cls.mount is not None:
            problems += cls.mount.stop()
            cls.mount = None
        elif getattr(cls, "fix", None) and cls.fix.mnt and wfstest.is_mounted(cls.fix.mnt):
            pids = wfstest.daemon_pids(cls.fix.local, cls.fix.mnt)
            problems += wfstest.unmount(cls.fix.mnt) + wfstest.stop_daemon(pids, cls.fix.mnt)
        problems += cls.loop.teardown()
        if wfstest.is_mounted(cls.loop.mnt) or (getattr(cls, "fix", None) and cls.fix.mnt
                                                and wfstest.is_mounted(cls.fix.mnt)):
            problems.append("not removing %s: still mounted" % cls.base)
        else:
            shutil.rmtree(cls.base, ignore_errors=True)
        if problems and raise_problems:
            raise AssertionError("teardown: " + "; ".join(problems))

    def test_promoted_repo_reads_nothing_from_nas_device(self):
        fix, loop = self.fix, self.loop
        files = wfstest.repo_readable(fix, self.REPO)
        uniq = wfstest.unique_real(files)
        self.assertGreater(len(uniq), 5)
        before = {e["path"]: state_of(fix.m(e["path"])) for e in files}
        self.assertEqual(sorted(set(before.values())), ["nas"], "states before promotion")

        t0 = time.monotonic()
        ctl_check(self, ["promote", "--wait", fix.m(self.REPO)])
        took = time.monotonic() - t0

        # every file of the repo, by every name, is local
        states = {e["path"]: state_of(fix.m(e["path"])) for e in files}
        not_local = {p: s for p, s in states.items() if s != "local"}
        self.assertEqual(not_local, {}, "after `wfsctl promote --wait %s` (%.1f s), %d of %d "
                         "files are not local" % (self.REPO, took, len(not_local), len(states)))
        # refs move on the NAS: a directory promote leaves them there
        self.assertEqual(state_of(fix.m(self.REPO + "/refs/main")), "nas",
                         "refs/main must stay on the NAS after promoting the repo")
        repo, st = wfstest.repo_status(self, fix.mnt, self.REPO)
        self.assertEqual(repo.get("files"), len(uniq),
                         "status files of %s (manifest: %d unique NAS files)" % (self.REPO, len(uniq)))
        self.assertEqual(repo.get("local_files"), repo.get("files"), "status: %s" % repo)
        self.assertEqual(repo.get("local_bytes"), sum(e["size"] for e in uniq.values()),
                         "status local_bytes: %s" % repo)

        # the local store holds the copies: one file per distinct content, with
        # exactly that content; nothing left in tmp/
        self.assertEqual(wfstest.tmp_entries(fix.local), [], "LOCAL_STORE/tmp not empty")
        data = wfstest.store_files(fix.local)
        got = {}
        for rel in data:
            h, n = wfstest.sha256_file(os.path.join(fix.local, "data", rel))
            got[h] = (rel, n)
        want = {e["sha256"] for e in uniq.values()}
        missing = sorted(e["nas_real"] for e in uniq.values() if e["sha256"] not in got)
        self.assertEqual(missing, [], "no copy in LOCAL_STORE/data with the content of these "
                         "(data/ has %d files)" % len(data))
        self.assertEqual(len(data), len(want),
                         "LOCAL_STORE/data holds %d files for %d distinct contents"
                         % (len(data), len(want)))

        # cold reads through the mount: the NAS device must not serve them
        wfstest.drop_caches()
        total = 0
        per_file = []
        s_start = loop.sectors_read()
        for e in files:
            s0 = loop.sectors_read()
            h, n = wfstest.sha256_file(fix.m(e["path"]))
            s1 = loop.sectors_read()
            self.assertEqual((h, n), (e["sha256"], e["size"]), "%s: bytes differ from the NAS" % e["path"])
            total += n
            per_file.append((e["path"], n, (s1 - s0) * 512))
        nas_bytes = (loop.sectors_read() - s_start) * 512
        print("\n  promoted %s (%d files, %d unique, %.1f MiB) in %.1f s; read %.1f MiB through the "
              "mount after drop_caches: NAS device %s read %d sectors (%d bytes, %.2f%%)"
              % (self.REPO, len(files), len(uniq), sum(e["size"] for e in uniq.values()) / MiB, took,
                 total / MiB, loop.dev, nas_bytes // 512, nas_bytes, 100.0 * nas_bytes / max(total, 1)),
              file=sys.stderr)
        big_from_nas = [(p, n, d) for p, n, d in per_file if n >= 512 * 1024 and d >= n // 2]
        self.assertEqual(big_from_nas, [], "(path, size, NAS device bytes read while reading it): "
                         "these promoted files were read from the NAS device")
        self.assertLess(nas_bytes, total // 20,
                        "reading %d bytes of promoted files read %d bytes from the NAS device "
                        "(allowed: directory/inode lookups, < 5%%)" % (total, nas_bytes))

        # control: a file that was not promoted does come from the NAS device
        ctrl = max(wfstest.repo_readable(fix, self.CONTROL), key=lambda e: e["size"])
        self.assertEqual(state_of(fix.m(ctrl["path"])), "nas")
        wfstest.drop_caches()
        s0 = loop.sectors_read()
        h, n = wfstest.sha256_file(fix.m(ctrl["path"]))
        d = (loop.sectors_read() - s0) * 512
        print("  control: reading non-promoted %s (%d bytes) read %d bytes from the NAS device"
              % (ctrl["path"], n, d), file=sys.stderr)
        self.assertEqual(h, ctrl["sha256"])
        self.assertGreaterEqual(d, n * 9 // 10, "control failed: the NAS device counter does not see "
                                "reads of a NAS-served file; the measurement is not trustworthy")


# ------------------------------------------------------------------ 2

class SwapUnderLoad(unittest.TestCase):
    def test_readers_across_promotion(self):
        e = FIX.snapshot_entry("models--acme--standard", "model-00001-of-00002.safetensors")
        size = e["size"]
        self.assertGreaterEqual(size, 16 * MiB, "fixture shard too small for the swap test")
        want = wfstest.read_file(FIX.n(e["nas_real"]))
        self.assertEqual(hashlib.sha256(want).hexdigest(), e["sha256"])
        path = FIX.m(e["path"])
        self.assertEqual(state_of(path), "nas")

        fds = [os.open(path, os.O_RDONLY) for _ in range(4)]   # opened BEFORE promotion
        maps = []
        try:
            maps = [mmap.mmap(fds[i], 0, prot=mmap.PROT_READ) for i in (2, 3)]
            stop = threading.Event()
            promoted = [None]          # True once the promotion has finished
            stats = [dict(reads=0, after=0, bad=0, bad_first=[], errors=[]) for _ in range(4)]
            lens = [1, 7, 4095, 4096, 4097, 65536, 131073, MiB, 3 * MiB + 5]

            def check(i, off, ln, got):
                st = stats[i]
                st["reads"] += 1
                if promoted[0] is not None:
                    st["after"] += 1
                exp = want[off:off + ln]
                if got != exp:
                    st["bad"] += 1
                    if len(st["bad_first"]) < 3:
                        st["bad_first"].append("[%d:+%d]: got %d bytes, want %d%s" % (
                            off, ln, len(got), len(exp), "" if len(got) != len(exp) else ", content differs"))

            def pread_reader(i):
                rnd = random.Random(i)
                fd = fds[i]
                while not stop.is_set():
                    off, ln = rnd.randrange(size), rnd.choice(lens)
                    try:
                        got = os.pread(fd, ln, off)
                    except OSError as ex:
                        stats[i]["errors"].append("pread(%d, %d): %s" % (ln, off, wfstest.errname(ex.errno)))
                        continue
                    check(i, off, ln, got)
                    if stats[i]["reads"] % 40 == 0:   # make later reads reach the daemon again
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

            def mmap_reader(i):
                rnd = random.Random(i)
                m = maps[i - 2]
                while not stop.is_set():
                    off, ln = rnd.randrange(size), rnd.choice(lens)
                    try:
                        got = m[off:off + ln]
                    except Exception as ex:  # noqa: BLE001 -- SIGBUS surfaces as a crash, not here
                        stats[i]["errors"].append("mmap[%d:+%d]: %r" % (off, ln, ex))
                        continue
                    check(i, off, ln, got)
                    if stats[i]["reads"] % 40 == 0:
                        m.madvise(mmap.MADV_DONTNEED)
                        os.posix_fadvise(fds[i], 0, 0, os.POSIX_FADV_DONTNEED)

            threads = [threading.Thread(target=pread_reader, args=(i,)) for i in (0, 1)]
            threads += [threading.Thread(target=mmap_reader, args=(i,)) for i in (2, 3)]
            for t in threads:
                t.start()
            try:
                # every reader well into the file before the promotion ...
                wfstest.wait_until(lambda: all(s["reads"] >= 40 or s["errors"] for s in stats), 60)
                before = [s["reads"] for s in stats]
                t0 = time.monotonic()
                rc, out, err = run_wfsctl(["promote", "--wait", path])
                took = time.monotonic() - t0
                promoted[0] = True
                served0 = ctl_json(self, ["status", FIX.mnt])["served"]

                # ... and after it, until the daemon reports local bytes served
                def moved():
                    served1[0] = ctl_json(self, ["status", FIX.mnt])["served"]
                    return (served1[0].get("local_bytes", 0) > served0.get("local_bytes", 0)
                            and all(s["after"] >= 40 or s["errors"] for s in stats))
                served1 = [None]
                wfstest.wait_until(moved, 60, 0.1)
                served1 = served1[0]
            finally:
                stop.set()
                for t in threads:
                    t.join(60)
            print("\n  promote --wait of %s (%.1f MiB) took %.1f s; reads per reader before/total/after: %s"
                  % (e["path"], size / MiB, took,
                     ", ".join("%d/%d/%d" % (b, s["reads"], s["after"]) for b, s in zip(before, stats))),
                  file=sys.stderr)
            self.assertEqual(rc, 0, "wfsctl promote --wait exited %s\nstdout: %s\nstderr: %s" % (rc, out, err))
            self.assertFalse(any(t.is_alive() for t in threads), "a reader is stuck")
            bad = {i: s["bad_first"] for i, s in enumerate(stats) if s["bad"]}
            self.assertEqual(bad, {}, "readers saw wrong bytes (%d reads mismatched)"
                             % sum(s["bad"] for s in stats))
            errs = {i: s["errors"][:3] for i, s in enumerate(stats) if s["errors"]}
            self.assertEqual(errs, {}, "reader errors (%d)" % sum(len(s["errors"]) for s in stats))
            self.assertTrue(all(b > 0 for b in before), "some reader did not read before promotion: %s" % before)
            self.assertTrue(all(s["after"] > 0 for s in stats),
                            "some reader did not read after promotion: %s" % [s["after"] for s in stats])
            self.assertEqual(state_of(path), "local")
            # the files opened before the promotion now read the local copy
            self.assertGreater(served1.get("local_bytes", 0), served0.get("local_bytes", 0),
                               "served.local_bytes did not grow while only descriptors opened before "
                               "the promotion were reading (%s -> %s): open files were not moved "
                               "to the local copy" % (served0, served1))
        finally:
            for m in maps:
                m.close()
            for fd in fds:
                os.close(fd)
        self.assertEqual(hashlib.sha256(wfstest.read_file(path)).hexdigest(), e["sha256"])


# ------------------------------------------------------------------ 4

class Mismatch(unittest.TestCase):
    def test_blob_not_matching_its_sha256_name(self):
        e, nas = CORRUPT["entry"], CORRUPT["nas"]
        nas_bytes = wfstest.read_file(nas)
        self.assertNotEqual(hashlib.sha256(nas_bytes).hexdigest(), e["blob_id"])
        # the snapshot name of that blob, as an engine opens it
        link = next(x for x in FIX.of("link", "file") if x.get("nas_real") == e["nas_real"])
        path = FIX.m(link["path"])
        data_before = wfstest.store_files(FIX.local)

        rc, out, err = run_wfsctl(["promote", "--wait", path])
        self.assertIsNotNone(rc, "promote --wait did not finish")
        self.assertNotEqual(rc, 0, "promote --wait of a blob whose content does not match its "
                            "SHA-256 name exited 0\nstdout: %s\nstderr: %s" % (out, err))
        self.assertIn("mismatch", (out + err).lower(),
                      "promote --wait output does not say mismatch:\nstdout: %s\nstderr: %s" % (out, err))
        self.assertEqual(state_of(path), "mismatch")
        self.assertEqual(state_of(FIX.m(e["path"])), "mismatch")
        self.assertTrue(wfstest.read_file(path) == nas_bytes, "reads through the mount are not the NAS bytes")

        st = ctl_json(self, ["status", FIX.mnt])
        flagged = [f for f in st.get("flagged", []) if f.get("id") == e["blob_id"]]
        self.assertEqual(len(flagged), 1, "status flagged: %s" % st.get("flagged"))
        self.assertEqual(flagged[0].get("state"), "mismatch", flagged[0])
        self.assertTrue(flagged[0].get("reason"), "no reason given: %s" % flagged[0])
        repo = next(r for r in st["repos"] if r["repo"] == "datasets--acme--data")
        self.assertEqual(repo.get("states", {}).get("mismatch"), 1, repo)
        out, _ = ctl_check(self, ["status", FIX.mnt])
        self.assertIn(e["blob_id"], out, "human `wfsctl status` does not name the flagged blob:\n" + out)
        self.assertIn("mismatch", out.lower(), "human `wfsctl status` does not show the mismatch:\n" + out)

        self.assertEqual(wfstest.store_files(FIX.local), data_before, "LOCAL_STORE/data changed")
        self.assertEqual(wfstest.tmp_entries(FIX.local), [], "LOCAL_STORE/tmp not empty")
        # asking again does not copy it either
        rc2, out2, err2 = run_wfsctl(["promote", "--wait", path])
        self.assertNotEqual(rc2, 0, "second promote --wait of the mismatched blob exited 0")
        self.assertEqual(state_of(path), "mismatch")
        self.assertEqual(wfstest.store_files(FIX.local), data_before, "LOCAL_STORE/data changed")

        # The NAS file put right (re-downloaded: new attributes): the flag
        # was of the old bytes.  It once stayed for ever, index and all, and
        # every promote of it exited 1.
        flip_middle_byte(nas, e["size"])
        self.assertEqual(hashlib.sha256(wfstest.read_file(nas)).hexdigest(), e["blob_id"])
        self.addCleanup(lambda: run_wfsctl(["evict", "--force", path]))
        ctl_check(self, ["promote", "--wait", path])
        self.assertEqual(state_of(path), "local")
        self.assertEqual(hashlib.sha256(wfstest.read_file(path)).hexdigest(), e["blob_id"])
        st = ctl_json(self, ["status", FIX.mnt])
        self.assertEqual([f for f in st.get("flagged", []) if f.get("id") == e["blob_id"]], [])


# ------------------------------------------------------------------ 5

class EqualSizePacks(unittest.TestCase):
    def test_two_equal_size_files_keep_their_own_bytes(self):
        repo = "models--acme--packs"
        packs = sorted((e for e in wfstest.repo_readable(FIX, repo) if "/packs/pack-" in e["path"]),
                       key=lambda e: e["path"])
        self.assertEqual(len(packs), 2)
        self.assertEqual(packs[0]["size"], packs[1]["size"])
        self.assertNotEqual(packs[0]["sha256"], packs[1]["sha256"])
        ctl_check(self, ["promote", "--wait"] + [FIX.m(e["path"]) for e in packs])
        wfstest.drop_caches()
        for e in packs:
            self.assertEqual(state_of(FIX.m(e["path"])), "local", e["path"])
            self.assertEqual(wfstest.sha256_file(FIX.m(e["path"])), (e["sha256"], e["size"]),
                             "%s is not served its own bytes" % e["path"])
        have = {wfstest.sha256_file(os.path.join(FIX.local, "data", rel))[0]
                for rel in wfstest.store_files(FIX.local)}
        for e in packs:
            self.assertIn(e["sha256"], have, "no local copy with the content of %s" % e["path"])
        # and through descriptors opened at the same time
        fa, fb = (os.open(FIX.m(e["path"]), os.O_RDONLY) for e in packs)
        try:
            for off in (0, 4096, packs[0]["size"] // 2, packs[0]["size"] - 4096):
                a, b = os.pread(fa, 4096, off), os.pread(fb, 4096, off)
                self.assertEqual(a, wfstest.read_file(FIX.n(packs[0]["nas_real"]))[off:off + 4096])
                self.assertNotEqual(a, b, "both packs read the same bytes at %d" % off)
        finally:
            os.close(fa)
            os.close(fb)


class HubLevelStore(unittest.TestCase):
    def test_blob_first_seen_outside_a_repo_is_still_served_local(self):
        # A site keeps its blobs in <hub>/blobs/, the repo's blobs/ link
        # there.  A walk that reaches the hub-level name first must not make
        # the repo's name of the same NAS file uncopyable.
        e = next(e for e in FIX.of("file") if e["path"].startswith("models--acme--hubstore/blobs/")
                 and e["nas_real"].startswith("blobs/") and e["size"] > 1000)
        top = FIX.m(e["nas_real"])
        self.assertEqual(os.stat(top).st_size, e["size"])   # the kernel now holds this name
        self.assertEqual(hashlib.sha256(wfstest.read_file(top)).hexdigest(), e["sha256"])
        path = FIX.m(e["path"])
        self.assertEqual(os.stat(path).st_ino, os.stat(top).st_ino, "one NAS file, one inode")
        self.addCleanup(lambda: run_wfsctl(["evict", "--force", path]))
        ctl_check(self, ["promote", "--wait", path])
        self.assertEqual(state_of(path), "local", "the repo's name after promote --wait")
        self.assertEqual(hashlib.sha256(wfstest.read_file(path)).hexdigest(), e["sha256"])
        rc, out, err = run_wfsctl(["promote", top])
        self.assertNotEqual(rc, 0, "promote of the hub-level name (not weight data) exited 0")
        self.assertIn("not weight data", err)


class RenamedDownload(unittest.TestCase):
    """A client ends a download by renaming blobs/<id>.incomplete to
    blobs/<id>, which keeps the inode.  The mount's node for that inode was
    made under the first name; the new name once reused it, with the old
    name's blob id (no content address: a wrong file was made local as
    verified) and the old name's blob (promote said local, the mount
    said failed)."""

    BLOBS = "models--acme--standard/blobs"

    def download(self, data, good):
        blob_id = hashlib.sha256(good).hexdigest()
        nas = FIX.n(os.path.join(self.BLOBS, blob_id))
        with open(nas + ".incomplete", "wb") as f:
            f.write(data)
        self.addCleanup(lambda: os.path.exists(nas) and os.unlink(nas))
        path = FIX.m(os.path.join(self.BLOBS, blob_id))
        self.addCleanup(lambda: run_wfsctl(["evict", "--force", path]))
        return nas, path, blob_id

    def test_wrong_bytes_renamed_are_checked_against_the_new_name(self):
        good = wfstest.det_bytes("renamed good", 300000)
        bad = wfstest.det_bytes("renamed bad", 300000)
        nas, path, blob_id = self.download(bad, good)
        self.assertEqual(os.stat(path + ".incomplete").st_size, len(bad))
        os.rename(nas + ".incomplete", nas)
        self.assertEqual(os.getxattr(path, wfstest.XATTR_ID).decode(), blob_id)
        rc, out, err = run_wfsctl(["promote", "--wait", path])
        self.assertNotEqual(rc, 0, "promote --wait of bytes not matching %s exited 0\nstdout: "
                            "%s\nstderr: %s" % (blob_id, out, err))
        self.assertIn("mismatch", (out + err).lower())
        self.assertEqual(state_of(path), "mismatch")
        self.assertTrue(wfstest.read_file(path) == bad)

    def test_open_across_the_rename_then_promoted(self):
        good = wfstest.det_bytes("renamed right", 300000)
        nas, path, blob_id = self.download(good, good)
        fd = os.open(path + ".incomplete", os.O_RDONLY)
        try:
            self.assertTrue(os.pread(fd, len(good), 0) == good)
            os.rename(nas + ".incomplete", nas)
            ctl_check(self, ["promote", "--wait", path])
            self.assertEqual(state_of(path), "local")
            self.assertEqual(os.getxattr(path, wfstest.XATTR_ID).decode(), blob_id)
            self.assertTrue(wfstest.read_file(path) == good)
            self.assertTrue(os.pread(fd, len(good), 0) == good, "the open made before the rename")
        finally:
            os.close(fd)


# ------------------------------------------------------------------ 6

class SourceChanged(unittest.TestCase):
    def test_rewritten_source_same_size_and_mtime_is_demoted(self):
        e = FIX.snapshot_entry("models--acme--standard", "model-00002-of-00002.safetensors", "refs/pr/1")
        path, nas = FIX.m(e["path"]), FIX.n(e["nas_real"])
        self.assertGreater(e["size"], 4 * 65536)
        ctl_check(self, ["promote", "--wait", path])
        self.assertEqual(state_of(path), "local")
        old = wfstest.read_file(path)        # the kernel now caches these pages
        self.assertEqual(hashlib.sha256(old).hexdigest(), e["sha256"])

        st = os.stat(nas)
        new = bytearray(old)
        for i in range(1000, 1000 + 8192):   # inside the sampled head (first 64 KiB)
            new[i] ^= 0xFF
        new = bytes(new)
        with open(nas, "r+b") as f:
            f.seek(1000)
            f.write(new[1000:1000 + 8192])
            f.flush()
            os.fsync(f.fileno())
        os.utime(nas, ns=(st.st_atime_ns, st.st_mtime_ns))
        st2 = os.stat(nas)
        self.assertEqual((st2.st_size, st2.st_mtime_ns), (st.st_size, st.st_mtime_ns))

        rc, out, err = run_wfsctl(["--json", "verify", path])
        self.assertIsNotNone(rc, "wfsctl verify did not finish")
        rep = wfstest.parse_json_out(out)
        self.assertIsNotNone(rep, "wfsctl --json verify printed no JSON (rc %s)\nstdout: %s\nstderr: %s"
                             % (rc, out, err))
        demoted = rep.get("demoted") or []
        self.assertTrue(any(d.get("key") == os.path.realpath(nas) or d.get("id") == e["blob_id"]
                            for d in demoted),
                        "verify did not report %s demoted: rc %s, reply %s" % (e["path"], rc, rep))
        self.assertNotEqual(rc, 0, "wfsctl verify exited 0 though it demoted a blob")
        self.assertEqual(state_of(path), "nas", "state after the demotion")
        got = wfstest.read_file(path)
        self.assertTrue(got == new, "after the demotion a new open reads %s bytes"
                        % ("the OLD (stale cache or stale copy)" if got == old else "wrong"))
        fd = os.open(path, os.O_RDONLY)
        try:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                self.assertTrue(m[:65536] == new[:65536], "mmap after the demotion: old bytes")
        finally:
            os.close(fd)

    def test_rewritten_source_read_at_once_gives_new_bytes(self):
        # The NAS file changes with a new mtime and is opened again at once,
        # long before the kernel asks for attributes (blob_timeout): the open
        # itself must notice, and the stale copy must not serve.
        e = FIX.snapshot_entry("models--acme--standard", "model-00001-of-00002.safetensors", "refs/pr/1")
        path, nas = FIX.m(e["path"]), FIX.n(e["nas_real"])
        ctl_check(self, ["promote", "--wait", path])
        self.assertEqual(state_of(path), "local")
        old = wfstest.read_file(path)
        self.assertEqual(hashlib.sha256(old).hexdigest(), e["sha256"])
        new = bytearray(old)
        new[-5000:] = bytes(b ^ 0x5A for b in new[-5000:])   # inside the sampled tail
        new = bytes(new)
        def restore():
            with open(nas, "r+b") as f:
                f.seek(len(old) - 5000)
                f.write(old[-5000:])
        self.addCleanup(restore)
        with open(nas, "r+b") as f:
            f.seek(len(old) - 5000)
            f.write(new[-5000:])
        got = wfstest.read_file(path)
        self.assertTrue(got == new, "an open right after the NAS change reads %s bytes"
                        % ("the OLD (stale local copy)" if got == old else "wrong"))
        self.assertEqual(state_of(path), "nas", "state after the source changed")


class ReplacedMidCopy(unittest.TestCase):
    def test_source_replaced_while_copied_is_not_served_old(self):
        # The copy reads the file it opened (the old one, FFFF...), so it
        # ends with a good copy of bytes the NAS no longer holds.  A reader
        # sees the new file (GGGG...) meanwhile, and with it its new mtime
        # and ctime: that copy must never serve, and stops there.
        size, path, nas = RACE["size"], FIX.m(RACE["rel"]), FIX.n(RACE["rel"])
        old, new = b"F" * size, b"G" * size
        self.assertTrue(wfstest.read_file(path) == old, "the file does not read FFFF before")
        self.addCleanup(run_wfsctl, ["evict", "--force", path])
        key = os.path.realpath(nas)
        ctl_check(self, ["promote", path])

        def copy_of():
            for c in ctl_json(self, ["status", FIX.mnt]).get("copies", []):
                if c.get("key") == key:
                    return c
            return None
        under_way = wfstest.wait_until(lambda: (copy_of() or {}).get("bytes_done", 0) > 0, 60, 0.02)
        self.assertTrue(under_way, "the copy of %s never got under way (state %s)"
                        % (RACE["rel"], state_of(path)))
        tmp = nas + ".new"
        with open(tmp, "wb") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, nas)
        os.stat(path)
        got = wfstest.read_file(path)          # an open: the daemon sees the new attributes
        self.assertTrue(got == new, "during the copy, a read after the NAS change reads %s bytes"
                        % ("the OLD" if got == old else "wrong"))

        st = wait_state(path, ("nas", "failed", "local", "mismatch"), 120)
        self.assertIn(st, ("nas", "failed", "local"), "the copy did not settle")
        self.assertNotEqual(st, "local", "the copy of the OLD bytes was made local after the source "
                            "showed new attributes during the copy")
        got = wfstest.read_file(path)
        self.assertTrue(got == new, "after the copy a new open reads %s bytes"
                        % ("the OLD (a copy of the replaced file)" if got == old else "wrong"))
        wfstest.drop_caches()
        self.assertTrue(wfstest.read_file(path) == new, "after dropping caches: not the new bytes")
        flagged = [f for f in ctl_json(self, ["status", FIX.mnt]).get("flagged", [])
                   if f.get("key") == key]
        self.assertTrue(flagged and "changed" in flagged[0].get("reason", ""),
                        "status does not say the source changed during the copy: %s" % flagged)
        # the copy stopped when the daemon saw the new attributes, not at
        # the end of the file (which would also prove it was under way)
        stopped = re.search(r"stopped after (\d+) of (\d+) bytes", flagged[0]["reason"])
        self.assertTrue(stopped and int(stopped.group(1)) < size == int(stopped.group(2)),
                        "the copy of the replaced file was not stopped mid-way: %s"
                        % flagged[0]["reason"])
        old_sha = hashlib.sha256(old).hexdigest()
        left = [rel for rel in wfstest.store_files(FIX.local)
                if wfstest.sha256_file(os.path.join(FIX.local, "data", rel))[0] == old_sha]
        self.assertEqual(left, [], "a copy of the replaced bytes stays in LOCAL_STORE/data")
        self.assertEqual(wfstest.tmp_entries(FIX.local), [], "LOCAL_STORE/tmp not empty")

        # asked again: a copy of what the NAS holds now
        ctl_check(self, ["promote", "--wait", path])
        self.assertEqual(state_of(path), "local")
        wfstest.drop_caches()
        self.assertTrue(wfstest.read_file(path) == new, "the new copy does not read the new bytes")


# ------------------------------------------------------------------ 8

class DryRunPinEvict(unittest.TestCase):
    REPO = "models--acme--hubstore"

    def test_dry_run_pin_evict(self):
        files = wfstest.repo_readable(FIX, self.REPO)
        uniq = wfstest.unique_real(files)
        self.assertEqual({state_of(FIX.m(e["path"])) for e in files}, {"nas"})
        data0 = wfstest.store_files(FIX.local)
        idx = os.path.join(FIX.local, "index.json")
        index0 = wfstest.read_file(idx) if os.path.exists(idx) else None

        # --dry-run: reports, changes nothing
        rep = ctl_json(self, ["promote", "--dry-run", FIX.m(self.REPO)])
        expect = sum(e["size"] for e in uniq.values())
        self.assertEqual(rep.get("bytes_to_copy"), expect,
                         "dry-run bytes_to_copy (manifest: %d unique files, %d bytes): %s"
                         % (len(uniq), expect, {k: v for k, v in rep.items() if k != "blobs"}))
        self.assertGreater(rep.get("space_available", 0), 0, "dry-run space_available")
        out, _ = ctl_check(self, ["promote", "--dry-run", FIX.m(self.REPO)])
        self.assertTrue(out.strip(), "human promote --dry-run printed nothing")
        # promote queues its blobs before it replies: a dry run that did
        # would show them queued now
        self.assertEqual({state_of(FIX.m(e["path"])) for e in files}, {"nas"}, "states after --dry-run")
        repo, st = wfstest.repo_status(self, FIX.mnt, self.REPO)
        self.assertEqual(repo.get("local_files"), 0, repo)
        self.assertEqual(set(repo.get("states", {})), {"nas"}, repo)
        self.assertEqual([c for c in st.get("copies", []) if c.get("key") in
                          {os.path.realpath(FIX.n(r)) for r in uniq}], [], "copies in flight")
        self.assertEqual(wfstest.store_files(FIX.local), data0, "--dry-run changed LOCAL_STORE/data")
        self.assertEqual(wfstest.tmp_entries(FIX.local), [])
        self.assertEqual(wfstest.read_file(idx) if os.path.exists(idx) else None, index0,
                         "--dry-run changed index.json")

        # --pin, then evict without --force is refused
        shard = FIX.snapshot_entry(self.REPO, "model-00001-of-00003.safetensors")
        path = FIX.m(shard["path"])
        ctl_check(self, ["promote", "--wait", "--pin", path])
        self.assertEqual(state_of(path), "local")
        data1 = wfstest.store_files(FIX.local)
        added = sorted(set(data1) - set(data0))
        self.assertEqual(len(added), 1, "promoting one blob added %s to data/" % added)
        rc, out, err = run_wfsctl(["evict", path])
        self.assertNotEqual(rc, 0, "evict of a pinned blob without --force exited 0\nstdout: %s\nstderr: %s"
                            % (out, err))
        self.assertIn("pinned", (out + err).lower(), "evict refusal does not say pinned:\n%s%s" % (out, err))
        self.assertEqual(state_of(path), "local", "a pinned blob was evicted without --force")
        self.assertIn(added[0], wfstest.store_files(FIX.local))

        # evict --force
        ctl_check(self, ["evict", "--force", path])
        self.assertEqual(state_of(path), "nas")
        self.assertNotIn(added[0], wfstest.store_files(FIX.local), "evicted copy still in data/")
        self.assertEqual(hashlib.sha256(wfstest.read_file(path)).hexdigest(), shard["sha256"])
        wfstest.drop_caches()
        self.assertEqual(wfstest.sha256_file(path), (shard["sha256"], shard["size"]))
        repo, _ = wfstest.repo_status(self, FIX.mnt, self.REPO)
        self.assertEqual(repo.get("local_files"), 0, repo)



class Demo(unittest.TestCase):
    def test_demo_with_installed_wfs(self):
        """WFS_DEMO_WFS=/usr/local/bin/wfs (an installed pair, no build tree
        around it): the demo's promote steps find the wfsctl beside it."""
        with tempfile.TemporaryDirectory(dir=FIX.base) as tmp:
            bindir = os.path.join(tmp, "bin")
            os.mkdir(bindir)
            shutil.copy(wfstest.wfs_bin(), os.path.join(bindir, "wfs"))
            shutil.copy(wfstest.wfsctl_bin(), os.path.join(bindir, "wfsctl"))
            # relative, as typed: the demo once ran wfsctl by that relative
            # name from inside the mount
            env = dict(os.environ, WFS_DEMO_WFS="bin/wfs", WFS_DEMO_MIB="1", TMPDIR=tmp)
            env.pop("WFSCTL", None)
            r = subprocess.run([os.path.join(wfstest.REPO, "tools", "demo")], env=env, cwd=tmp,
                               capture_output=True, text=True, timeout=240)
            self.assertEqual(r.returncode, 0, "tools/demo failed:\n%s%s" % (r.stdout[-3000:], r.stderr))
            self.assertEqual([n for n in os.listdir(tmp) if n.startswith("wfs-demo.")], [],
                             "the demo left its temporary directory behind")

if __name__ == "__main__":
    wfstest.main()
