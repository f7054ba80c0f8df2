#!/usr/bin/env python3
"""Capacity: LOCAL_STORE on a small loop-mounted ext4 image, more blobs than
fit, read through a real mount with real system calls.

  Limit   (store_max=24M on a 64 MiB image)
          readers of every file get the right bytes and no error while
          automatic promotion copies and evicts under them; the copies'
          blocks on disk (sampled every few ms) never pass the limit;
          eviction is least recently used; pinned and open copies are not
          evicted; an evicted copy still open reads right and its space comes
          back at the close; what does not fit stays on the NAS and
          `wfsctl status` says why
  Floor   (min_free on a 64 MiB image, no store_max)
          copies stop at the free-space floor, and say so
  Shared  (store_max=13M) the same 6 MiB file in two repos is one copy:
          counted once in status (as du counts it), and a 2 MiB copy fits
          beside it without evicting either blob; a third repo's copy of it
          needs no room (hashed, not copied)
"""

import hashlib
import os
import random
import shutil
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, run_wfsctl, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--cap"
NFILES = 12
FSIZE = 3 * MiB
LIMIT = 24 * MiB            # 7 copies of 3 MiB (+ a block or two each) fit, 8 do not
FLOOR = 40 * MiB


class Fix:
    base = hub = rev = None
    files = {}


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    Fix.base = wfstest.make_base("wfs-it-cap-")
    Fix.hub = os.path.join(Fix.base, "hub")
    Fix.files = {"f%02d.bin" % i: wfstest.det_bytes("cap%d" % i, FSIZE) for i in range(NFILES)}
    Fix.files["huge.bin"] = wfstest.det_bytes("huge", 30 * MiB)
    Fix.rev = wfstest.make_hf_repo(Fix.hub, REPO, Fix.files)


def tearDownModule():
    if Fix.base:
        shutil.rmtree(Fix.base, ignore_errors=True)


class Store:
    """A loop-mounted ext4 image holding LOCAL_STORE, and a wfs mount using it."""

    def __init__(self, name, opts, size_mib=64):
        self.dir = os.path.join(Fix.base, name)
        os.mkdir(self.dir)
        self.loop = wfstest.LoopFs(os.path.join(self.dir, "store.img"),
                                   os.path.join(self.dir, "storefs"), size_mib)
        self.opts = opts
        self.mount = None

    def start(self):
        self.loop.setup()
        self.local = os.path.join(self.loop.mnt, "local")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        self.mount = wfstest.Mount(Fix.hub, self.local, self.mnt, self.opts).start()
        wfstest.wait_ctl(self.mnt)
        return self

    def stop(self):
        problems = self.mount.stop() if self.mount else []
        self.mount = None
        return problems + self.loop.teardown()

    def path(self, name):
        return os.path.join(self.mnt, REPO, "snapshots", Fix.rev, name)

    def free(self):
        st = os.statvfs(self.loop.mnt)
        return st.f_bavail * st.f_frsize

    def status(self, tc):
        return ctl_json(tc, ["status", self.mnt])

    def idle(self, tc, timeout=60):
        """Wait until no copy is queued or in flight."""
        def done():
            st = self.status(tc)
            return not st["copies"] and not st["store"].get("queued")
        tc.assertTrue(wfstest.wait_until(done, timeout, 0.1), "copies still in flight")


def read_ok(path, want):
    with open(path, "rb", buffering=0) as f:
        got = f.read()
    return hashlib.sha256(got).digest() == hashlib.sha256(want).digest()


class StoreCase(unittest.TestCase):
    """A class whose tests share one mount (cls.s), started by start_store
    from setUpClass and stopped after the last test."""

    @classmethod
    def start_store(cls, name, options):
        cls.s = Store(name, options)
        try:
            cls.s.start()
        except BaseException:
            cls.s.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        problems = cls.s.stop()
        if problems:
            raise AssertionError("teardown: " + "; ".join(problems))


class Limit(StoreCase):
    @classmethod
    def setUpClass(cls):
        cls.start_store("limit", ["store_max=24M", "min_free=1M", "auto_bytes=1M", "auto_opens=0",
                                  "auto_mbps=0", "auto_siblings=off"])

    def names(self):
        return ["f%02d.bin" % i for i in range(NFILES)]

    def reset(self):
        s = self.s
        ctl_check(self, ["unpin", os.path.join(s.mnt, REPO)])
        ctl_check(self, ["evict", "--force", os.path.join(s.mnt, REPO)])
        s.idle(self)
        left = wfstest.wait_states([s.path(n) for n in self.names()], "nas", 10)
        self.assertEqual(left, {}, "evict --force of the repo left these")
        self.assertEqual(wfstest.store_files(s.local), {}, "data/ not empty after evicting all")

    def promote(self, *names, pin=False):
        args = ["promote", "--wait"] + (["--pin"] if pin else [])
        ctl_check(self, args + [self.s.path(n) for n in names])
        wfstest.next_use_tick()

    def states(self):
        return {n: state_of(self.s.path(n)) for n in self.names()}

    def test_1_readers_get_right_bytes_and_the_limit_holds(self):
        s = self.s
        self.reset()
        du = wfstest.Sampler(lambda: wfstest.store_blocks(s.local)).start()
        bad, errors = [], []

        def reader(k, names):
            rnd = random.Random(k)
            names = list(names)
            rnd.shuffle(names)
            for n in names:
                p = s.path(n)
                try:
                    if not read_ok(p, Fix.files[n]):
                        bad.append(n)
                    off = rnd.randrange(FSIZE - 4096)
                    fd = os.open(p, os.O_RDONLY)
                    try:
                        if os.pread(fd, 4096, off) != Fix.files[n][off:off + 4096]:
                            bad.append("%s@%d" % (n, off))
                    finally:
                        os.close(fd)
                    wfstest.drop_pages(p)
                except OSError as e:
                    errors.append("%s: %s" % (n, wfstest.errname(e.errno)))

        def readers(names):
            threads = [threading.Thread(target=reader, args=(k, names)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            self.assertFalse(any(t.is_alive() for t in threads), "a reader is stuck")
            s.idle(self)

        # The first pass fills the store (7 of its 8 files fit); the second
        # reads only the other 4, so the copies not used since make their
        # room: evictions under the readers whatever the timing (with every
        # file read in every pass, a slow run found each copy used after
        # the request that would evict it, and evicted none); the third
        # reads all 12.
        t0 = time.monotonic()
        readers(self.names()[:8])
        readers(self.names()[8:])
        readers(self.names())
        worst = du.stop()
        took = time.monotonic() - t0
        st = s.status(self)
        print("\n  4 readers x 3 passes over 8, 4, %d files of 3 MiB (store_max 24 MiB): %.1f s; "
              "%d promoted, %d evicted; copies' blocks on disk at most %.2f MiB (%d samples); "
              "now %d local, %.2f MiB" % (NFILES, took, st["counters"]["promoted"],
                                          st["counters"]["evicted"], worst / MiB, du.n,
                                          st["store"]["blobs"], st["store"]["used_bytes"] / MiB),
              file=sys.stderr)
        self.assertEqual(errors[:5], [], "readers got errors")
        self.assertEqual(bad[:5], [], "readers got wrong bytes")
        self.assertEqual(du.errors, [])
        self.assertLessEqual(worst, LIMIT, "the copies took more than store_max")
        self.assertLessEqual(st["store"]["used_bytes"], LIMIT)
        self.assertEqual(st["store"]["limit_bytes"], LIMIT)
        self.assertGreater(st["counters"]["evicted"], 0, "more hot blobs than room, yet no eviction")
        self.assertGreaterEqual(st["store"]["blobs"], 6, "the store is nearly empty: %s" % st["store"])

    def test_2_eviction_is_least_recently_used(self):
        s = self.s
        self.reset()
        first = ["f%02d.bin" % i for i in range(7)]
        for n in first:
            self.promote(n)
        self.assertEqual(wfstest.wait_states([s.path(n) for n in first], "local", 5), {})
        # f00 used again: f01 is now the least recently used
        self.assertTrue(read_ok(s.path("f00.bin"), Fix.files["f00.bin"]))
        wfstest.next_use_tick()
        self.promote("f07.bin")
        st = self.states()
        self.assertEqual((st["f00.bin"], st["f01.bin"], st["f07.bin"]), ("local", "nas", "local"),
                         "after promoting an 8th: %s" % st)
        self.promote("f08.bin")
        st = self.states()
        self.assertEqual(st["f02.bin"], "nas", "the next least recently used: %s" % st)
        self.assertEqual(sorted(n for n, v in st.items() if v == "local"),
                         ["f00.bin"] + ["f%02d.bin" % i for i in range(3, 9)])

    def test_3_pinned_and_open_copies_are_not_evicted(self):
        s = self.s
        self.reset()
        self.promote("f00.bin", pin=True)
        self.promote("f01.bin")
        fd = os.open(s.path("f01.bin"), os.O_RDONLY)
        try:
            for n in self.names()[2:]:
                rc, out, err = run_wfsctl(["promote", "--wait", s.path(n)])
                self.assertEqual(rc, 0, "promote %s: %s%s" % (n, out, err))
                wfstest.next_use_tick()
            st = self.states()
            self.assertEqual((st["f00.bin"], st["f01.bin"]), ("local", "local"),
                             "pinned f00 / open f01 evicted: %s" % st)
            self.assertEqual(sum(v == "local" for v in st.values()), 7, st)
            self.assertEqual(os.pread(fd, FSIZE, 0), Fix.files["f01.bin"])
            # evicting the open copy: the reader keeps reading right bytes, and its
            # blocks count until it closes
            ctl_check(self, ["evict", s.path("f01.bin")])
            self.assertEqual(state_of(s.path("f01.bin")), "nas")
            held = s.status(self)["store"]["held_bytes"]
            self.assertGreaterEqual(held, FSIZE, "an evicted copy still open is not counted")
            for off in (0, 12345, FSIZE - 4096):
                self.assertEqual(os.pread(fd, 4096, off), Fix.files["f01.bin"][off:off + 4096])
        finally:
            os.close(fd)
        ok = wfstest.wait_until(lambda: s.status(self)["store"]["held_bytes"] == 0, 5)
        self.assertTrue(ok, "the space of the evicted copy did not come back at the close")

    def test_4_what_does_not_fit_stays_on_the_nas_and_says_why(self):
        s = self.s
        self.reset()
        self.promote(*["f%02d.bin" % i for i in range(7)], pin=True)
        rc, out, err = run_wfsctl(["promote", "--wait", s.path("f07.bin")])
        self.assertEqual(rc, 1, "promote --wait of a blob that cannot fit: rc %s\n%s%s"
                         % (rc, out, err))
        self.assertIn("no room", err)
        self.assertEqual(state_of(s.path("f07.bin")), "nas")
        self.assertTrue(read_ok(s.path("f07.bin"), Fix.files["f07.bin"]))
        st = s.status(self)
        held = {h["id"]: h for h in st["held"]}
        h = held.get(hashlib.sha256(Fix.files["f07.bin"]).hexdigest())
        self.assertIsNotNone(h, "status held: %s" % st["held"])
        self.assertEqual(h["hold"], "no_room")
        self.assertIn("pinned", h["reason"])
        rc, out, err = run_wfsctl(["promote", "--wait", s.path("huge.bin")])
        self.assertEqual(rc, 1)
        self.assertIn("more than store_max", err)
        rc, out, err = run_wfsctl(["status", s.mnt])
        self.assertIn("no room", out, "human status does not say why:\n" + out)
        self.assertIn("of 24.0 MiB (store_max", out, "human status shows no limit:\n" + out)
        print("\n  wfsctl status says:\n    " + "\n    ".join(
            line for line in out.splitlines() if "no room" in line or "store:" in line)[:1500],
            file=sys.stderr)
        ctl_check(self, ["unpin", os.path.join(s.mnt, REPO)])


class Floor(unittest.TestCase):
    def test_copies_stop_at_the_free_space_floor(self):
        s = Store("floor", ["min_free=40M", "auto_promote=off"])
        try:
            s.start()
            free0 = s.free()
            self.assertGreater(free0, FLOOR + 3 * FSIZE, "image too small for the test")
            low = wfstest.Sampler(lambda: -s.free()).start()
            rc, out, err = run_wfsctl(["promote", "--wait", os.path.join(s.mnt, REPO)])
            lowest = -low.stop()
            st = s.status(self)
            print("\n  min_free 40 MiB, %.1f MiB free at start: %d of %d blobs local, "
                  "free space never below %.2f MiB" % (free0 / MiB, st["store"]["blobs"],
                                                      NFILES + 1, lowest / MiB), file=sys.stderr)
            self.assertEqual(rc, 1, "not everything fits, so promote --wait must fail")
            self.assertIn("min_free", err)
            self.assertGreaterEqual(lowest, FLOOR - MiB,
                                    "free space went below the floor (less 1 MiB for the index "
                                    "and directories)")
            self.assertGreater(st["store"]["blobs"], 0)
            self.assertEqual(st["store"]["min_free_bytes"], FLOOR)
            for n, data in Fix.files.items():
                self.assertTrue(read_ok(s.path(n), data), n)
        finally:
            problems = s.stop()
        self.assertEqual(problems, [])


class Shared(StoreCase):
    """The reviewer's case: A pinned and B hold one 6 MiB copy; status said
    12 MiB used while du said 6, and promoting 2 MiB more evicted B, which
    freed nothing."""
    TWIN = 6 * MiB

    @classmethod
    def setUpClass(cls):
        twin = wfstest.det_bytes("twin", cls.TWIN)
        cls.revs = {
            "models--acme--twin-a": wfstest.make_hf_repo(Fix.hub, "models--acme--twin-a",
                                                        {"w.bin": twin}),
            "models--acme--twin-b": wfstest.make_hf_repo(Fix.hub, "models--acme--twin-b",
                                                        {"w.bin": twin,
                                                         "small.bin": wfstest.det_bytes("small", 2 * MiB)}),
            "models--acme--twin-c": wfstest.make_hf_repo(Fix.hub, "models--acme--twin-c",
                                                        {"w.bin": twin}),
        }
        cls.start_store("shared", ["store_max=13M", "min_free=1M", "auto_promote=off"])

    def path(self, repo, name):
        return os.path.join(self.s.mnt, repo, "snapshots", self.revs[repo], name)

    def test_a_shared_copy_counts_once(self):
        s = self.s
        a = self.path("models--acme--twin-a", "w.bin")
        b = self.path("models--acme--twin-b", "w.bin")
        small = self.path("models--acme--twin-b", "small.bin")
        ctl_check(self, ["promote", "--wait", "--pin", a])
        wfstest.next_use_tick()
        ctl_check(self, ["promote", "--wait", b])
        self.assertEqual((state_of(a), state_of(b)), ("local", "local"))
        self.assertEqual(len(wfstest.store_files(s.local)), 1, "A and B are not one file in data/")
        st = s.status(self)["store"]
        on_disk = wfstest.store_blocks(s.local)
        self.assertEqual(st["blobs"], 2)
        self.assertGreaterEqual(st["used_bytes"], on_disk, "used counts less than du: %s" % st)
        self.assertLess(st["used_bytes"], self.TWIN + MiB, "the shared copy counted twice: %s" % st)
        self.assertEqual(st["bytes"], self.TWIN, st)
        rc, out, err = run_wfsctl(["status", s.mnt])
        self.assertIn("2 blobs, 6.0 MiB used", out, "human status:\n" + out)

        wfstest.next_use_tick()
        ctl_check(self, ["promote", "--wait", small])
        self.assertEqual((state_of(a), state_of(b), state_of(small)), ("local", "local", "local"),
                         "8 MiB of copies fit in store_max 13 MiB")
        st = s.status(self)
        self.assertEqual(st["counters"]["evicted"], 0, "evicted for room that existed")
        self.assertLess(st["store"]["used_bytes"], self.TWIN + 2 * MiB + MiB, st["store"])
        self.assertGreaterEqual(st["store"]["used_bytes"], wfstest.store_blocks(s.local))

    def test_b_bytes_already_local_need_no_room(self):
        """A third repo's copy of the same file, with 5 MiB free under
        store_max: hashed, not copied, it shares the copy; a second 6 MiB
        copy in flight would have evicted small.bin."""
        s = self.s
        names = [self.path("models--acme--twin-a", "w.bin"),
                 self.path("models--acme--twin-b", "w.bin"),
                 self.path("models--acme--twin-b", "small.bin")]
        self.assertEqual([state_of(p) for p in names], ["local"] * 3, "test_a's state")
        before = s.status(self)["store"]["used_bytes"]
        c = self.path("models--acme--twin-c", "w.bin")
        wfstest.next_use_tick()
        ctl_check(self, ["promote", "--wait", c])
        self.assertEqual([state_of(p) for p in names + [c]], ["local"] * 4)
        st = s.status(self)
        self.assertEqual(st["counters"]["evicted"], 0, "evicted for bytes that were local")
        self.assertEqual(st["store"]["used_bytes"], before, st["store"])
        self.assertEqual(len(wfstest.store_files(s.local)), 2, "one file per content in data/")
        self.assertTrue(read_ok(c, wfstest.det_bytes("twin", self.TWIN)))


if __name__ == "__main__":
    wfstest.main()
