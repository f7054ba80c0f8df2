#!/usr/bin/env python3
"""Partial copies: `wfsctl promote --range OFF:LEN ... FILE` and
`--part K/N FILE` copy only those bytes of one file to LOCAL_STORE
(verified), and the mount serves bytes inside verified ranges from the
partial file, the rest from the NAS, assembled within one read.

The NAS hub (test/mkhub, plus a generated safetensors repo) lives on an
ext4 image on its own loop device, shared by every test; each test mounts
wfs with -o auto_promote=off on a LOCAL_STORE of its own (partial_fix.py).

  RangesRead     odd ranges (one ending at EOF): dry run changes nothing;
                 state "partial", the ranges as asked; whole reads, 2000
                 seeded preads (every range edge straddled) and mmap equal
                 the NAS after dropping caches, served by the daemon; status
                 lists the partial copy; an overlapping request copies only
                 the gaps, kept apart
  BadInput       past EOF (exit 1, the path, "past the end"), usage errors
                 (exit 2), a directory (exit 1, "one file"), and the control
                 protocol's refusals; nothing is copied
  Restart        clean unmount and remount: index.json (version 4) lists the
                 ranges; "partial" at once, not re-hashed, the same partial
                 file; reads equal
  KillMidCopy    kill -9 while range B is being copied (promote_mbps cap):
                 after the remount A serves, B is not listed, B's bytes come
                 from the NAS, and once re-hashed the partial file's blocks
                 are about A's length (unlisted bytes punched out)
  Tampered       the partial file written to while the daemon was down: the
                 changed range is dropped, unlisted bytes punched out
  RemovedUnderTheDaemon  the partial file removed while the daemon runs:
                 the next read drops its ranges (state "nas", the reason
                 in status), the bytes are the NAS's
  Capacity       store_max a little over one range: it fits and used_bytes
                 grows by about its length; the next one fails with "no room"
                 (exit 1), is not listed, and takes no blocks
  EvictOpen      evict while a descriptor and an mmap are open: the bytes
                 stay right; the partial file is removed; state "nas"
  Whole          ranges covering the file: state "local", parts/ empty, the
                 copy's bytes equal
  SafetensorsPart  --part 2/4 on a generated safetensors file: the ranges are
                 stfile.part_ranges' (dry run and after the copy); reads equal
  LocalDisk      reads inside a local range read 0 sectors from the NAS
                 device; a byte outside one does read it
  ReplacedMidRange  a real file replaced on the NAS by same-size new bytes
                 while its first range is copied, the change seen through
                 the mount: the range is not listed, reads give the new bytes

Waits are on what the daemon reports (xattrs, progress, status), never
sleeps.
"""

import mmap
import os
import random
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfile  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl, state_of  # noqa: E402
from partial_fix import (  # noqa: E402, F401 (setUpModule: unittest finds it here)
    BAD_NAME, BAD_REPO, KiB, MiB, WAIT, Fix, PartialCase, allocated, edge_cases, first_diff, gaps,
    index_of, index_ranges, index_rec, nas_bytes, pairs, part_files, rarg, setUpModule, shard,
    snap_rel, st_file)

# ================================================================ 1

class RangesRead(PartialCase):
    def test_odd_ranges_read_back(self):
        rel, nas = shard(1)
        data = nas_bytes(nas)
        size = len(data)
        self.assertGreaterEqual(size, 8 * MiB, "fixture shard too small")
        ranges = [(1000, 300001), (777777, 12345), (size - 70001, 70001)]   # the last ends at EOF
        self.start()
        path = self.p(rel)

        # dry run: reports, copies nothing
        rep = ctl_json(self, ["promote", "--dry-run"] + rarg(reversed(ranges)) + [path])
        self.assertIs(rep.get("dry_run"), True, rep)
        self.assertEqual(pairs(rep.get("ranges")), ranges, "dry run: ranges normalised (sorted)")
        self.assertEqual(rep.get("bytes_to_copy"), sum(n for _, n in ranges), rep)
        self.assertEqual((rep.get("bytes"), rep.get("size")), (sum(n for _, n in ranges), size), rep)
        key = rep["key"]
        self.assertEqual(state_of(path), "nas", "after a dry run")
        self.assertEqual(part_files(self.local), [], "a dry run made a partial file")
        self.assertEqual(pairs(self.part(key).get("ranges")), [], "a dry run listed ranges")

        # the copy
        out, _ = self.promote_ok(rel, ranges, "--wait")
        self.assertIn("every range local", out)
        self.assertEqual(state_of(path), "partial")
        part = self.part(key)
        self.assertEqual(pairs(part.get("ranges")), ranges, "part object: %s" % part)
        self.assertEqual((part.get("local_bytes"), part.get("nranges"), part.get("copying"),
                          part.get("unproven"), part.get("reason")),
                         (sum(n for _, n in ranges), 3, False, False, ""), part)
        files = part_files(self.local)
        self.assertEqual(len(files), 1, "LOCAL_STORE/parts: %s" % files)
        pfile = os.path.join(self.local, "parts", files[0])
        self.assertEqual(os.stat(pfile).st_size, size, "the partial file has the blob's size")
        self.assertLessEqual(allocated(pfile), sum(n for _, n in ranges) + 64 * KiB,
                             "the partial file is sparse: only the ranges take blocks")

        # status: the partial list, the store's and the repo's tallies
        st = ctl_json(self, ["status", self.mnt])
        ent = [p for p in st.get("partial", []) if p.get("key") == key]
        self.assertEqual(len(ent), 1, "status partial: %s" % st.get("partial"))
        self.assertEqual((ent[0].get("state"), ent[0].get("size"), ent[0].get("local_bytes"),
                          ent[0].get("nranges"), pairs(ent[0].get("ranges"))),
                         ("partial", size, sum(n for _, n in ranges), 3, ranges), ent[0])
        self.assertEqual((st["store"].get("partial_files"), st["store"].get("partial_bytes")),
                         (1, sum(n for _, n in ranges)), st["store"])
        repo = next(r for r in st["repos"] if r["repo"] == "models--acme--standard")
        self.assertEqual((repo.get("partial_files"), repo.get("states", {}).get("partial")), (1, 1),
                         {k: repo.get(k) for k in ("partial_files", "partial_bytes", "states")})

        # reads: served by the daemon, never passthrough; equal to the NAS.
        # (The read counter lives with the inode: a descriptor held open
        # keeps it across drop_caches.)
        hold = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, hold)
        dr0 = wfstest.daemon_reads(path)
        self.assert_whole(rel, data)
        rng = random.Random(20240607)
        cases = edge_cases(ranges, size)
        while len(cases) < 2000:
            n = rng.choice((rng.randint(1, 4096), rng.randint(1, 256 * KiB)))
            cases.append((rng.randrange(size), n))
        rng.shuffle(cases)
        t0 = time.monotonic()
        self.assert_preads(rel, data, cases)
        took = time.monotonic() - t0
        self.assert_mmap(rel, data)
        dr1 = wfstest.daemon_reads(path)
        print("\n  %d preads in %.1f s; %d daemon reads" % (len(cases), took, dr1 - dr0), file=sys.stderr)
        self.assertGreaterEqual(dr1 - dr0, len(cases), "reads of a partial file are the daemon's")
        self.assertEqual(wfstest.passthrough_opens(path), 0, "a partial file was opened passthrough")
        self.assertEqual(state_of(path), "partial", "reading it changed its state")

        # a second request overlapping local ranges copies only the gaps
        more = (200000, 700000)
        want_gaps = gaps(ranges, *more)
        rep = ctl_json(self, ["promote", "--dry-run"] + rarg([more]) + [path])
        self.assertEqual(rep.get("bytes_to_copy"), sum(n for _, n in want_gaps), rep)
        rep = ctl_json(self, ["promote"] + rarg([more]) + [path])
        self.assertEqual((pairs(rep.get("ranges")), rep.get("bytes_to_copy")),
                         ([more], sum(n for _, n in want_gaps)), rep)
        part = self.wait_settled(key)
        self.assertEqual(pairs(part.get("ranges")), sorted(ranges + want_gaps),
                         "the gaps are copied and kept apart from the ranges they touch")
        self.assertEqual(part.get("local_bytes"), sum(n for _, n in ranges + want_gaps), part)
        self.assertEqual(state_of(path), "partial")
        self.assert_whole(rel, data, "after the gaps: ")
        self.assert_preads(rel, data, edge_cases(want_gaps, size), "after the gaps: ")


# ================================================================ 2

class BadInput(PartialCase):
    def test_refusals(self):
        rel, nas = shard(1)
        size = os.path.getsize(nas)
        other, _ = shard(2)
        self.start()
        path = self.p(rel)

        rc, out, err = self.promote(rel, [(size - 100, 101)])
        self.assertEqual(rc, 1, "range past EOF: exit %s\n%s%s" % (rc, out, err))
        self.assertIn(rel, err, "the message names the file")
        self.assertIn("past the end", err)
        # one ending exactly at EOF is fine (a dry run)
        rc, out, err = self.promote(rel, [(size - 100, 100)], "--dry-run")
        self.assertEqual(rc, 0, "a range ending at EOF: %s%s" % (out, err))

        usage = [
            (["--range", "5:0", path], "--range"),
            (["--range", "x:y", path], "--range"),
            (["--range", "5", path], "--range"),
            (["--part", "0/4", path], "--part"),
            (["--part", "5/4", path], "--part"),
            (["--part", "2", path], "--part"),
            (["--range", "0:10", path, self.p(other)], "--range"),
            (["--range", "0:10", "--part", "1/2", path], "--part"),
            (["--range", "0:10", "--dry-run", "--wait", path], "--wait"),
        ]
        for args, word in usage:
            rc, out, err = run_wfsctl(["promote"] + args)
            self.assertEqual(rc, 2, "wfsctl promote %s: exit %s (usage error expected)\n%s%s"
                             % (" ".join(args), rc, out, err))
            self.assertIn(word, err, "wfsctl promote %s: the message says what is wrong: %s"
                          % (" ".join(args), err))

        rc, out, err = run_wfsctl(["promote", "--range", "0:10", os.path.dirname(path)])
        self.assertEqual(rc, 1, "a directory: exit %s\n%s%s" % (rc, out, err))
        self.assertIn("one file", err)
        rc, out, err = run_wfsctl(["promote", "--part", "1/2", self.p(snap_rel("models--acme--standard",
                                                                                "config.json"))])
        self.assertEqual(rc, 1, "--part of a file that is not safetensors: %s%s" % (out, err))
        self.assertIn("safetensors", err)

        # the control protocol refuses the same
        key = self.key_of(rel)
        for req in ({"ranges": [[5, 0]]}, {"ranges": [[-1, 5]]}, {"ranges": [[size, 1]]},
                    {"ranges": [[0, size + 1]]}, {"ranges": []}, {"ranges": [["a", 1]]},
                    {"part": [0, 4]}, {"part": [5, 4]}, {"part": [1]},
                    {"ranges": [[0, 1]], "paths": [rel, other]}):
            full = {"op": "promote", "paths": [rel]}
            full.update(req)
            rep = wfstest.ctl_request(self.sock, full)
            self.assertTrue(rep is not None and rep.get("ok") is False and rep.get("error"),
                            "request %s: %s" % (req, rep))

        # nothing was copied or queued
        self.assertEqual(state_of(path), "nas")
        self.assertEqual(part_files(self.local), [])
        self.assertEqual(pairs(self.part(key).get("ranges")), [])
        self.assertEqual(ctl_json(self, ["status", self.mnt]).get("partial"), [])


# ================================================================ 3

class Restart(PartialCase):
    def test_ranges_survive_a_remount(self):
        rel, nas = shard(1)
        data = nas_bytes(nas)
        ranges = [(3 * 4096 + 5, MiB), (5 * MiB, 123457)]
        self.start()
        self.promote_ok(rel, ranges, "--wait")
        key = self.key_of(rel)
        self.assertEqual(pairs(self.part(key).get("ranges")), ranges)
        files = part_files(self.local)
        self.assertEqual(len(files), 1, files)
        pfile = os.path.join(self.local, "parts", files[0])
        ident = os.stat(pfile)

        problems = self.m.stop()
        self.m = None
        self.assertEqual(problems, [], "unmount")
        idx, rec = index_rec(self.local, key)
        self.assertEqual(idx.get("version"), 4, "index.json version")
        self.assertIsNotNone(rec, "index.json has no record of %s" % key)
        self.assertEqual(rec.get("state"), "partial", rec)
        self.assertEqual(index_ranges(rec), ranges, rec)
        self.assertTrue(all(len(r.get("xxh", "")) == 32 for r in rec["ranges"]), rec)
        self.assertEqual(rec.get("part_ino"), ident.st_ino, rec)

        self.start()
        path = self.p(rel)
        self.assertEqual(state_of(path), "partial", "right after the remount")
        part = self.part(key)
        self.assertEqual((pairs(part.get("ranges")), part.get("unproven"), part.get("copying"),
                          part.get("local_bytes")),
                         (ranges, False, False, sum(n for _, n in ranges)),
                         "ranges serve at once after a clean restart: %s" % part)
        st = os.stat(pfile)
        self.assertEqual((st.st_ino, st.st_mtime_ns, st.st_ctime_ns),
                         (ident.st_ino, ident.st_mtime_ns, ident.st_ctime_ns),
                         "the partial file was rewritten across the restart")
        hold = os.open(path, os.O_RDONLY)
        self.addCleanup(os.close, hold)
        dr0 = wfstest.daemon_reads(path)
        self.assert_whole(rel, data, "after the remount: ")
        self.assert_preads(rel, data, edge_cases(ranges, len(data)), "after the remount: ")
        self.assert_mmap(rel, data, "after the remount: ")
        self.assertGreater(wfstest.daemon_reads(path), dr0)
        self.assertEqual(state_of(path), "partial")


# ================================================================ 4

class KillMidCopy(PartialCase):
    OPTS = ("auto_promote=off", "promote_mbps=6")   # a 6 MiB range: a third of it, ~3 s

    def test_kill9_while_a_range_is_copied(self):
        rel, nas = shard(1)
        data = nas_bytes(nas)
        a = (100001, 512 * KiB)
        b = (3 * MiB + 333, 6 * MiB)
        self.start()
        path = self.p(rel)
        key = self.key_of(rel)
        self.promote_ok(rel, [a], "--wait")
        self.assertEqual(pairs(self.part(key).get("ranges")), [a])
        # A is on record before B starts
        self.assertTrue(wfstest.wait_until(lambda: index_ranges(index_rec(self.local, key)[1]) == [a],
                                           10), "index.json never listed range A")
        pfile = os.path.join(self.local, "parts", part_files(self.local)[0])

        rep = ctl_json(self, ["promote"] + rarg([b]) + [path])
        self.assertEqual(rep.get("bytes_to_copy"), b[1], rep)
        last = [None]

        def mid_copy():
            last[0] = self.part(key)
            return last[0].get("copying") and last[0].get("done_bytes", 0) >= 512 * KiB
        self.assertTrue(wfstest.wait_until(mid_copy, 30, 0.02), "B never got under way: %s" % last[0])
        at_kill = last[0]
        blocks_at_kill = allocated(pfile)
        wfstest.kill_daemon(self, self.m.pids)
        print("\n  killed the daemon with range B at %d of %d bytes; partial file %d bytes allocated"
              % (at_kill.get("done_bytes"), at_kill.get("want_bytes"), blocks_at_kill), file=sys.stderr)
        self.assertLess(at_kill.get("done_bytes"), b[1], "B finished before the kill; slow it down")
        self.assertGreater(allocated(pfile), a[1] + 256 * KiB,
                           "B's unverified bytes are not in the partial file: the test proves nothing")
        try:
            index_of(self.local)
        except (OSError, ValueError) as ex:
            self.fail("index.json after kill -9: %r" % ex)

        wfstest.drop_dead_mount(self, self.mnt)
        self.m = None
        self.start()

        part = self.wait_settled(key, 30)
        self.assertEqual(pairs(part.get("ranges")), [a], "after kill -9 and remount: %s" % part)
        self.assertEqual(part.get("local_bytes"), a[1], part)
        self.assertEqual(state_of(path), "partial")
        self.assertEqual(part_files(self.local), [os.path.basename(pfile)])
        alloc = allocated(pfile)
        self.assertLessEqual(alloc, a[1] + 64 * KiB + a[1] // 100,
                             "the partial file keeps %d bytes allocated for a %d-byte range: the "
                             "unverified bytes of B were not punched out" % (alloc, a[1]))
        # B's bytes from the NAS, A's from the copy; all equal
        self.assert_preads(rel, data, edge_cases([a, b], len(data)) + [(b[0], b[1])], "after kill -9: ")
        self.assert_whole(rel, data, "after kill -9: ")
        self.assertEqual(pairs(self.part(key).get("ranges")), [a], "reading changed the ranges")


class Tampered(PartialCase):
    def test_a_changed_partial_file_is_rehashed(self):
        """The partial file written to while the daemon was down: every range
        is re-hashed before any serves; the changed one is dropped, bytes
        no range lists are punched out; reads stay the NAS's."""
        rel, nas = shard(1)
        data = nas_bytes(nas)
        r1, r2, r3 = (4096, 64 * KiB), (MiB + 3, 100000), (3 * MiB, 50000)
        self.start()
        self.promote_ok(rel, [r1, r2, r3], "--wait")
        key = self.key_of(rel)
        pfile = os.path.join(self.local, "parts", part_files(self.local)[0])
        problems = self.m.stop()
        self.m = None
        self.assertEqual(problems, [], "unmount")

        fd = os.open(pfile, os.O_RDWR)
        try:
            off = r2[0] + 50000
            byte = os.pread(fd, 1, off)
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), off)          # inside r2
            os.pwrite(fd, b"\xAA" * (256 * KiB), 6 * MiB)       # outside every range
        finally:
            os.close(fd)

        self.start()
        path = self.p(rel)
        part = self.wait_settled(key, 30)
        self.assertEqual(pairs(part.get("ranges")), [r1, r3], "after the tampering: %s" % part)
        self.assertEqual(part.get("local_bytes"), r1[1] + r3[1], part)
        self.assertEqual(state_of(path), "partial")
        alloc = allocated(pfile)
        self.assertLessEqual(alloc, r1[1] + r3[1] + 64 * KiB,
                             "%d bytes allocated for %d bytes of ranges: the bytes no range lists "
                             "were not punched out" % (alloc, r1[1] + r3[1]))
        self.assert_whole(rel, data, "after the tampering: ")
        self.assert_preads(rel, data, edge_cases([r1, r2, r3, (6 * MiB, 256 * KiB)], len(data)),
                           "after the tampering: ")
        self.assertTrue(wfstest.wait_until(lambda: index_ranges(index_rec(self.local, key)[1]) == [r1, r3],
                                           10), "index.json lists: %s"
                        % index_ranges(index_rec(self.local, key)[1]))


class RemovedUnderTheDaemon(PartialCase):
    def test_a_partial_file_removed_under_the_daemon(self):
        """The partial file removed while the daemon runs (by hand, a tmp
        cleaner): the next read drops its ranges (they served nothing,
        every read went to the NAS unsaid); the bytes are the NAS's, the
        state "nas", the reason in status."""
        rel, nas = shard(1)
        data = nas_bytes(nas)
        self.start()
        self.promote_ok(rel, [(4096, 64 * KiB)], "--wait")
        key = self.key_of(rel)
        os.unlink(os.path.join(self.local, "parts", part_files(self.local)[0]))
        self.assert_whole(rel, data, "the partial file removed: ")
        self.assertEqual(state_of(self.p(rel)), "nas", "its ranges still listed: %s"
                         % self.part(key))
        self.assertIn("cannot be opened", self.part(key).get("reason", ""), self.part(key))


# ================================================================ 5

class Capacity(PartialCase):
    def test_a_range_that_does_not_fit(self):
        rel, nas = shard(1)
        data = nas_bytes(nas)
        r1 = (4097, 2 * MiB)
        r2 = (5 * MiB, MiB)
        self.loop = wfstest.LoopFs(os.path.join(self.dir, "store.img"), os.path.join(self.dir, "storefs"), 32)
        self.addCleanup(self._loop_down)
        self.loop.setup()
        self.local = os.path.join(self.loop.mnt, "local")
        self.start(["store_max=%d" % (r1[1] + 512 * KiB), "min_free=1M"])
        path = self.p(rel)
        key = self.key_of(rel)

        used0 = ctl_json(self, ["status", self.mnt])["store"]["used_bytes"]
        self.promote_ok(rel, [r1], "--wait")
        st = ctl_json(self, ["status", self.mnt])["store"]
        grew = st["used_bytes"] - used0
        self.assertTrue(r1[1] <= grew <= r1[1] + 64 * KiB + r1[1] // 100,
                        "store used_bytes grew by %d for a %d-byte range: %s" % (grew, r1[1], st))
        self.assertEqual(st.get("limit_bytes"), r1[1] + 512 * KiB, st)
        pfile = os.path.join(self.local, "parts", part_files(self.local)[0])
        alloc1 = allocated(pfile)

        rc, out, err = self.promote(rel, [r2], "--wait")
        self.assertEqual(rc, 1, "a range that does not fit: exit %s\n%s%s" % (rc, out, err))
        self.assertIn("no room", err)
        part = self.part(key)
        self.assertEqual(pairs(part.get("ranges")), [r1], "the range that did not fit is listed: %s" % part)
        self.assertTrue(part.get("reason", "").startswith("no room"), part)
        self.assertEqual(state_of(path), "partial")
        self.assertLessEqual(allocated(pfile), alloc1 + 64 * KiB,
                             "the partial file grew although the range did not fit")
        st = ctl_json(self, ["status", self.mnt])["store"]
        self.assertLessEqual(st["used_bytes"], st["limit_bytes"], st)
        self.assert_whole(rel, data)
        self.assert_preads(rel, data, edge_cases([r1, r2], len(data)))

    def _loop_down(self):
        self._stop()
        problems = self.loop.teardown()
        if problems:
            raise AssertionError("; ".join(problems))


# ================================================================ 6

class EvictOpen(PartialCase):
    def test_evict_under_an_open_reader(self):
        rel, nas = shard(1)
        data = nas_bytes(nas)
        size = len(data)
        ranges = [(0, 4 * MiB), (6 * MiB + 1, 2 * MiB)]
        self.start()
        path = self.p(rel)
        key = self.key_of(rel)
        self.promote_ok(rel, ranges, "--wait")
        self.assertEqual(state_of(path), "partial")
        wfstest.drop_caches()

        fd = os.open(path, os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            try:
                self.assertEqual(os.pread(fd, MiB, 0), data[:MiB])
                self.assertEqual(mm[6 * MiB:6 * MiB + 64 * KiB], data[6 * MiB:6 * MiB + 64 * KiB])

                ctl_check(self, ["evict", path])
                self.assertEqual(state_of(path), "nas", "after evict")
                self.assertEqual(part_files(self.local), [], "the partial file is still there")
                self.assertEqual(pairs(self.part(key).get("ranges")), [])

                # the same descriptor, pages dropped: every byte right
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                got = b"".join(os.pread(fd, MiB, off) for off in range(0, size, MiB))
                self.assertTrue(got == data, "reads through the descriptor opened before the evict: %s"
                                % first_diff(got, data))
                self.assertTrue(mm[:] == data, "the mmap made before the evict: %s"
                                % first_diff(mm[:], data))
            finally:
                mm.close()
        finally:
            os.close(fd)
        self.assert_whole(rel, data, "after the evict: ")
        self.assertEqual(state_of(path), "nas")
        self.assertEqual(ctl_json(self, ["status", self.mnt]).get("partial"), [])


# ================================================================ 7

class Whole(PartialCase):
    def test_ranges_covering_the_file_make_it_local(self):
        rel, nas = shard(2)
        data = nas_bytes(nas)
        size = len(data)
        e = Fix.by_path[rel]
        self.start()
        path = self.p(rel)
        key = self.key_of(rel)
        self.promote_ok(rel, [(0, 2 * MiB), (4 * MiB, size - 4 * MiB)], "--wait")
        self.assertEqual(state_of(path), "partial")
        # the middle, overlapping both: the ranges now cover the whole file
        self.promote_ok(rel, [(MiB, 4 * MiB)], "--wait")
        self.assertEqual(wfstest.wait_state(path, "local", WAIT), "local",
                         "ranges covering the whole file")
        self.assertTrue(wfstest.wait_until(lambda: part_files(self.local) == [], 10),
                        "LOCAL_STORE/parts after the whole copy: %s" % part_files(self.local))
        copies = wfstest.store_files(self.local)
        self.assertEqual(len(copies), 1, "LOCAL_STORE/data: %s" % sorted(copies))
        only = os.path.join(self.local, "data", next(iter(copies)))
        self.assertEqual(wfstest.sha256_file(only), (e["sha256"], size), "the local copy's bytes")
        self.assertEqual(wfstest.sha256_file(path), (e["sha256"], size), "read through the mount")
        st = ctl_json(self, ["status", self.mnt])
        self.assertEqual((st.get("partial"), st["store"].get("partial_files")), ([], 0), st["store"])
        self.assertEqual(pairs(self.part(key).get("ranges")), [])


# ================================================================ 8

class AutoLeavesPartial(PartialCase):
    """Automatic promotion never copies the rest of a partial file, however
    hot its NAS bytes make it: staging part of it was a choice."""
    OPTS = ("auto_promote=on", "auto_bytes=1M", "auto_opens=0", "auto_siblings=off")

    def test_hot_partial_stays_partial(self):
        self.start()
        rel, nas = shard(1)
        data = nas_bytes(nas)
        key = self.key_of(rel)
        r = (1 * MiB, 1 * MiB)
        self.promote_ok(rel, [r], "--wait")
        self.assertEqual(state_of(self.p(rel)), "partial")
        # ~10 MiB of it from the NAS: hot ten times over
        self.assert_whole(rel, data)
        # The policy thread takes hot blobs in the order they turned hot: a
        # file of another repo read whole after it, once queued (or further),
        # proves the partial file's turn came and went.
        fence = st_file()[0]
        wfstest.read_file(self.p(fence))
        st = wfstest.wait_state(self.p(fence), ("queued", "copying", "local"), WAIT)
        self.assertIn(st, ("queued", "copying", "local"),
                      "%s read whole (past auto_bytes) was not promoted: the fence proves nothing"
                      % fence)
        self.assertEqual(state_of(self.p(rel)), "partial", "the partial file was promoted whole")
        self.assertEqual(pairs(self.part(key).get("ranges")), [r])


class WholeMismatch(PartialCase):
    """Ranges that cover a file whose bytes do not match its SHA-256 name:
    it is never made local whole -- flagged `mismatch`, as a whole copy
    would be -- and reads still give the NAS's bytes."""

    def test_cover_a_mismatched_blob(self):
        self.start()
        rel = snap_rel(BAD_REPO, BAD_NAME)
        data = nas_bytes(os.path.realpath(os.path.join(Fix.hub, rel)))
        key = self.key_of(rel)
        self.promote_ok(rel, [(0, 600000)], "--wait")
        rc, out, err = self.promote(rel, [(600000, len(data) - 600000)], "--wait")
        st = wfstest.wait_state(self.p(rel), ("mismatch", "local"), WAIT)
        self.assertEqual(st, "mismatch", "covered whole: %s (promote: %s %s)" % (st, out, err))
        blob = self.blob(key)
        self.assertIn("does not match", blob.get("reason", ""), blob)
        flagged = ctl_json(self, ["status", self.mnt]).get("flagged", [])
        self.assertIn(key, [f.get("key") for f in flagged], flagged)
        self.assertEqual(os.listdir(os.path.join(self.local, "data")), [],
                         "a copy of the mismatched blob in data/")
        self.assert_whole(rel, data)


class SafetensorsPart(PartialCase):
    def test_part_2_of_4(self):
        rel, nas = st_file()
        data = nas_bytes(nas)
        want = stfile.part_ranges(nas, 2, 4)
        self.assertGreater(len(want), 5, "the generated file should give several ranges: %s" % want)
        self.start()
        path = self.p(rel)

        rep = ctl_json(self, ["promote", "--dry-run", "--part", "2/4", path])
        self.assertEqual(pairs(rep.get("ranges")), want, "dry run of --part 2/4")
        self.assertEqual(rep.get("bytes_to_copy"), sum(n for _, n in want), rep)
        key = rep["key"]
        self.assertEqual(part_files(self.local), [])

        rc, out, err = run_wfsctl(["promote", "--part", "2/4", "--wait", path])
        self.assertEqual(rc, 0, "%s%s" % (out, err))
        self.assertEqual(state_of(path), "partial")
        part = self.part(key)
        self.assertEqual(pairs(part.get("ranges")), want, part)
        self.assertEqual(part.get("local_bytes"), sum(n for _, n in want))
        self.assert_whole(rel, data)
        self.assert_preads(rel, data, edge_cases(want, len(data)) + want)
        self.assert_mmap(rel, data)
        # part 3/4 again: the header is local already, only the rest is to copy
        rep = ctl_json(self, ["promote", "--dry-run", "--part", "3/4", path])
        w3 = stfile.part_ranges(nas, 3, 4)
        self.assertEqual(pairs(rep.get("ranges")), w3)
        self.assertEqual(rep.get("bytes_to_copy"), sum(n for r in w3 for _, n in gaps(want, *r)), rep)


# ================================================================ 9

class LocalDisk(PartialCase):
    def test_local_range_reads_nothing_from_the_nas_device(self):
        rel, nas = shard(1)
        data = nas_bytes(nas)
        r = (MiB + 12345, 2 * MiB)
        self.start()
        path = self.p(rel)
        self.promote_ok(rel, [r], "--wait")
        self.assertEqual(state_of(path), "partial")
        # whole pages inside r (the kernel reads pages: a page r only partly
        # covers is rightly read from the NAS for its other bytes)
        inside = [(off, 64 * KiB) for off in range(2 * MiB, 3 * MiB, 64 * KiB)]
        inside.append((MiB + 4 * 4096, 3 * 4096 + 5))
        outside = r[0] + r[1] + 3 * 4096 + 17

        def record():
            rep = wfstest.ctl_request(self.sock, {"op": "stats"})
            return rep["metrics"]["record"]
        builds = record()["builds"]
        fd = os.open(path, os.O_RDONLY)
        try:
            # The open names the blob, and the daemon looks at its local
            # copies each second: that must not walk the NAS (it did, in
            # the window measured below).  Past its second look from now,
            # one began after the open.
            looks, last = record()["looks"], [None]

            def looked():
                last[0] = record()
                return last[0]["looks"] >= looks + 2
            self.assertTrue(wfstest.wait_until(looked, WAIT, 0.05), "no look: %s" % last[0])
            self.assertEqual(last[0]["builds"], builds, "opening a partial file walked the NAS "
                             "(a build of the local record)")
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)   # no read-ahead past the range
            wfstest.drop_caches()
            s0 = Fix.loop.sectors_read()
            for off, n in inside:
                self.assertEqual(os.pread(fd, n, off), data[off:off + n], "pread %d+%d" % (off, n))
            s1 = Fix.loop.sectors_read()
            wfstest.drop_caches()
            s2 = Fix.loop.sectors_read()
            self.assertEqual(os.pread(fd, 1, outside), data[outside:outside + 1])
            s3 = Fix.loop.sectors_read()
        finally:
            os.close(fd)
        print("\n  %d bytes read inside the range: %d NAS sectors; 1 byte outside: %d sectors"
              % (sum(n for _, n in inside), s1 - s0, s3 - s2), file=sys.stderr)
        self.assertEqual(s1 - s0, 0, "reading only bytes of a local range read %d sectors from the "
                         "NAS device %s" % (s1 - s0, Fix.loop.dev))
        self.assertGreater(s3 - s2, 0, "control: a byte outside every range read nothing from the "
                           "NAS device; the counter proves nothing")


# ================================================================ 10

class ReplacedMidRange(PartialCase):
    OPTS = ("auto_promote=off", "promote_mbps=6")   # a 6 MiB range: a third of it, ~3 s
    REPO = "models--acme--rangerace"

    def test_range_copied_while_the_source_was_replaced(self):
        # A range copy reads the file it opened (FFFF...); the NAS renames
        # same-size new bytes (GGGG...) over it and a reader sees them: the
        # range, and the sample it was taken with, must not be listed, and
        # the copy stops there.
        size, rng = 8 * MiB, (0, 6 * MiB)
        old, new = b"F" * size, b"G" * size
        wfstest.make_hf_repo(Fix.hub, self.REPO, {"r.bin": old}, real=("r.bin",))
        self.addCleanup(shutil.rmtree, os.path.join(Fix.hub, self.REPO), True)
        rel = snap_rel(self.REPO, "r.bin")
        nas = os.path.join(Fix.hub, rel)
        self.start()
        path = self.p(rel)
        self.assertTrue(wfstest.read_file(path) == old, "the file does not read FFFF before")
        key = self.key_of(rel)
        self.promote_ok(rel, [rng])
        last = [None]

        def mid_copy():
            last[0] = self.part(key)
            return last[0].get("copying") and last[0].get("done_bytes", 0) > 0
        self.assertTrue(wfstest.wait_until(mid_copy, 30, 0.02), "the range never got under way: %s"
                        % last[0])
        with open(nas + ".new", "wb") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        os.rename(nas + ".new", nas)
        got = wfstest.read_file(path)          # an open: the daemon sees the new attributes
        self.assertTrue(got == new, "during the copy, a read after the NAS change reads %s bytes"
                        % ("the OLD" if got == old else "wrong"))

        part = self.wait_settled(key)
        self.assertEqual(pairs(part.get("ranges")), [], "a range copied while the source was "
                         "replaced is listed: %s" % part)
        self.assertIn("changed", part.get("reason", ""), part)
        # stopped when the daemon saw the new attributes, mid-way (which
        # also proves the change came while it was under way)
        stopped = re.search(r"stopped after (\d+) of (\d+) bytes", part.get("reason", ""))
        self.assertTrue(stopped and int(stopped.group(1)) < rng[1] == int(stopped.group(2)),
                        "the range copy was not stopped mid-way: %s" % part)
        self.assertEqual(state_of(path), "nas")
        self.assert_whole(rel, new, "after the range copy: ")
        self.assert_preads(rel, new, [(0, 4096), (MiB + 1, 70001), (rng[1] - 5, 10)],
                           "after the range copy: ")
        # asked again: a range of what the NAS holds now
        self.promote_ok(rel, [rng], "--wait")
        self.assertEqual(pairs(self.part(key).get("ranges")), [rng])
        self.assert_whole(rel, new, "the new range: ")


if __name__ == "__main__":
    wfstest.main()
