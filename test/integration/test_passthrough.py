#!/usr/bin/env python3
"""FUSE passthrough for local blobs, proven rather than assumed.

The daemon exposes, per file: user.wfs.daemon_reads (READ requests it served
for the inode, a counter) and user.wfs.passthrough (opens of the inode the
kernel currently serves itself).  Caches are dropped before a read that is
meant to prove who serves it, so the kernel's page cache cannot hide READ
requests.

  Engaged     a promoted shard: os.read of the whole file, pread at odd
              offsets, mmap -- right bytes, daemon_reads unchanged,
              passthrough >= 1 while open and 0 after; an mmap keeps the open
              alive after close() until munmap; 4 concurrent passthrough opens
              share the inode (count 4), right bytes, no READ to the daemon
  MixedModes  2 reader processes open a shard before its promotion and keep
              reading (pread, mmap) across it; while they hold their opens,
              new opens are daemon-served (daemon_reads grows, passthrough 0)
              and right; once all early opens are closed a new open goes
              passthrough and the daemon serves no READ; 0 errors anywhere
  Fallback    -o passthrough=off: the same reads are right, daemon-served from
              the local copy (daemon_reads and served.local_bytes grow,
              passthrough stays 0)
  EvictOpen   evict --force of a blob open in passthrough: the open (and its
              mmap) keep reading right bytes; after every open is closed a
              new open reads the NAS (served.nas_bytes grows), right bytes
  NasPassthrough  -o nas_passthrough=on: a NAS blob is read by the kernel
              from the NAS file (no READ to the daemon), right bytes; its
              NAS bytes are counted at release (cachestat); promoted while
              open it keeps reading right bytes; its NAS descriptors all
              closed after the last close; reopened, the local copy
"""

import errno
import hashlib
import mmap
import multiprocessing
import os
import random
import sys
import subprocess
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, daemon_reads, passthrough_opens, state_of  # noqa: E402

MiB = 1 << 20
# promote_mbps: the mixed-mode shard's copy takes about a second under its
# readers; the others are quick enough.
FIX = wfstest.HubFixture(options=("promote_mbps=16", "auto_promote=off"), scale_mib=32, many=0, mount=True)
BLOB = {}        # role -> {"entry", "path" (in the mount), "want" (bytes)}
FENCE = None     # a small local blob only release_fence() opens
RELEASE_WAIT = 30  # seconds for the daemon to see a RELEASE after close/munmap


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    if not wfstest.kernel_has_fuse_passthrough():
        wfstest.skip_or_fail("kernel %s has no FUSE passthrough (Linux >= 6.9 needed)"
                             % os.uname().release)
    FIX.setup()
    try:
        wfstest.wait_ctl(FIX.mnt)

        def blobs_of(repo):
            return sorted((e for e in FIX.of("file") if e["path"].startswith(repo + "/blobs/")),
                          key=lambda e: -e["size"])
        std = blobs_of("models--acme--standard")
        hub = blobs_of("models--acme--hubstore")
        assert len(std) >= 2 and hub, "fixture: expected 2 shards in models--acme--standard " \
            "and a blob in models--acme--hubstore"
        for role, e in (("engaged", std[0]), ("mixed", std[1]), ("evict", hub[0])):
            want = wfstest.read_file(FIX.n(e["nas_real"]))
            assert hashlib.sha256(want).hexdigest() == e["sha256"], \
                "fixture: NAS bytes of %s do not match the manifest" % e["path"]
            BLOB[role] = {"entry": e, "path": FIX.m(e["path"]), "want": want}
        assert len({b["entry"]["nas_real"] for b in BLOB.values()}) == 3, "fixture: blobs not distinct"
        global FENCE
        FENCE = FIX.m(std[-1]["path"])
        assert std[-1]["nas_real"] not in {b["entry"]["nas_real"] for b in BLOB.values()}
        rc, out, err = wfstest.run_wfsctl(["promote", "--wait", FENCE])
        assert rc == 0 and state_of(FENCE) == "local", "promote --wait %s: %s%s" % (FENCE, out, err)
    except BaseException:
        FIX.teardown(raise_problems=False)
        raise


def tearDownModule():
    FIX.teardown()


# ------------------------------------------------------------------ reading

def _diff(got, want):
    if len(got) != len(want):
        return "%d bytes instead of %d" % (len(got), len(want))
    i = next(i for i in range(len(want)) if got[i] != want[i])
    return "first wrong byte at offset %d" % i


def _odd_spans(size, rng, n_random=16):
    """(offset, length) pairs: page edges, EOF edges, past EOF, random odd."""
    spans = [(0, 1), (1, 4095), (4095, 2), (4097, 8191), (size // 2 - 1, MiB + 1),
             (size - 1, 1), (size - 1, 10), (max(size - 4097, 0), 8192),
             (size, 10), (size + 5000, 10), (0, size + 12345)]
    for _ in range(n_random):
        spans.append((rng.randrange(0, size) | 1, rng.randrange(1, 300000)))
    return spans


def read_problems(fd, want, rng, label, whole=True, n_random=16):
    """Read `fd` every way an engine does and compare with `want`: os.read of
    the whole file (odd chunk size), pread at odd offsets, mmap (whole and
    slices).  Returns a list of problems (empty: all right).  OSError escapes
    to the caller, who counts it."""
    probs = []
    size = len(want)
    if whole:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while True:
            b = os.read(fd, MiB + 123)
            if not b:
                break
            chunks.append(b)
        got = b"".join(chunks)
        if got != want:
            probs.append("%s: os.read of the whole file: %s" % (label, _diff(got, want)))
    for off, n in _odd_spans(size, rng, n_random):
        got = os.pread(fd, n, off)
        if got != want[off:off + n]:
            probs.append("%s: pread(%d bytes at %d): %s" % (label, n, off, _diff(got, want[off:off + n])))
    mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    try:
        if mm.size() != size:
            probs.append("%s: mmap size %d, file %d" % (label, mm.size(), size))
        if whole and mm[:] != want:
            probs.append("%s: mmap, whole file: %s" % (label, _diff(mm[:], want)))
        for _ in range(8):
            a = rng.randrange(0, size)
            b = min(size, a + rng.randrange(1, 200000))
            if mm[a:b] != want[a:b]:
                probs.append("%s: mmap[%d:%d] differs" % (label, a, b))
    finally:
        mm.close()
    return probs


def release_fence():
    """Wait until the daemon has handled every RELEASE the kernel sent before
    this call.  The kernel queues RELEASEs in order (they are background
    requests, whatever the file): one more open and close of a local blob,
    its RELEASE seen by the daemon (user.wfs.passthrough back down), fences
    every earlier one."""
    fd = os.open(FENCE, os.O_RDONLY)
    try:
        n = passthrough_opens(FENCE)
    finally:
        os.close(fd)
    assert n >= 1, "the fence blob %s, local, was not passed through" % FENCE
    if not wfstest.wait_until(lambda: passthrough_opens(FENCE) < n, RELEASE_WAIT, 0.01):
        raise AssertionError("the daemon did not see the RELEASE of %s within %d s"
                             % (FENCE, RELEASE_WAIT))


def daemon_fds_on(local, mnt, nas_file):
    """How many descriptors the daemon serving `mnt` holds on `nas_file`."""
    n = 0
    for pid in wfstest.daemon_pids(local, mnt):
        d = "/proc/%d/fd" % pid
        for fd in os.listdir(d):
            try:
                n += os.readlink(os.path.join(d, fd)) == nas_file
            except OSError:
                pass  # closed meanwhile
    return n


def wait_passthrough(path, want, timeout=RELEASE_WAIT):
    """Poll user.wfs.passthrough until it equals `want`; return the last value."""
    last = [None]

    def ok():
        last[0] = passthrough_opens(path)
        return last[0] == want
    wfstest.wait_until(ok, timeout, 0.02)
    return last[0]


# ------------------------------------------------------------------ reader processes

class Reader:
    """A process that opens `path` once and reads it (whole file, odd preads,
    mmap) in a loop until stopped, holding its open.  `go` cleared parks it
    between iterations with no mmap alive; it reports errors at exit."""

    def __init__(self, ctx, path, want, seed, phase, go, stop):
        self.path, self.want, self.seed = path, want, seed
        self.phase, self.go, self.stop = phase, go, stop
        self.opened = ctx.Event()
        self.parked = ctx.Value("i", 0)
        self.iters = ctx.Array("q", 4)          # iterations per phase (0..3)
        self.rx, self.tx = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=self._run, args=(self.tx,), daemon=True)
        self.result = None

    def _run(self, tx):
        errs, rng = [], random.Random(self.seed)
        fd = -1
        try:
            fd = os.open(self.path, os.O_RDONLY)
            self.opened.set()
            while not self.stop.is_set():
                if not self.go.is_set():
                    self.parked.value = 1
                    while not self.go.wait(0.05) and not self.stop.is_set():
                        pass
                    self.parked.value = 0
                    continue
                ph = self.phase.value
                try:
                    errs += read_problems(fd, self.want, rng, "reader pid %d, phase %d"
                                          % (os.getpid(), ph), n_random=6)
                except OSError as e:
                    errs.append("phase %d: %s (%s)" % (ph, e, errno.errorcode.get(e.errno, e.errno)))
                except Exception as e:  # noqa: BLE001 -- report everything
                    errs.append("phase %d: %r" % (ph, e))
                self.iters[ph] += 1
                if len(errs) > 50:
                    break
        except OSError as e:
            errs.append("open/setup: %s (%s)" % (e, errno.errorcode.get(e.errno, e.errno)))
        finally:
            if fd >= 0:
                os.close(fd)
            tx.send(errs)
            tx.close()

    def start(self):
        self.proc.start()
        self.tx.close()     # the child's end: EOF here if it dies
        return self

    def finish(self, timeout=20):
        try:
            if self.rx.poll(timeout):
                self.result = self.rx.recv()
        except (EOFError, OSError):
            self.result = None
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        return self.result


class ReaderGroup:
    def __init__(self, path, want):
        self.ctx = multiprocessing.get_context("fork")
        self.path, self.want = path, want
        self.phase = self.ctx.Value("i", 0)
        self.go = self.ctx.Event()
        self.go.set()
        self.stop = self.ctx.Event()
        self.readers = []

    def spawn(self, n, seed0):
        new = [Reader(self.ctx, self.path, self.want, seed0 + i, self.phase, self.go, self.stop).start()
               for i in range(n)]
        self.readers += new
        return new

    def wait_iters(self, readers, phase, n, timeout=20):
        return wfstest.wait_until(lambda: all(r.iters[phase] >= n for r in readers), timeout, 0.02)

    def pause(self, timeout=20):
        self.go.clear()
        return wfstest.wait_until(lambda: all(r.parked.value == 1 or not r.proc.is_alive()
                                              for r in self.readers), timeout, 0.02)

    def resume(self):
        self.go.set()

    def finish(self):
        self.stop.set()
        self.go.set()
        return [(r, r.finish()) for r in self.readers]


# ------------------------------------------------------------------ 1

class Engaged(unittest.TestCase):
    """A promoted shard is read by the kernel itself."""

    @classmethod
    def setUpClass(cls):
        b = BLOB["engaged"]
        cls.path, cls.want = b["path"], b["want"]
        ctl_check(unittest.TestCase(), ["promote", "--wait", cls.path])

    def setUp(self):
        self.assertEqual(state_of(self.path), "local", "after promote --wait")
        self.assertEqual(wait_passthrough(self.path, 0), 0, "passthrough opens before this test")

    def test_reads_never_reach_the_daemon(self):
        p, want = self.path, self.want
        wfstest.drop_caches()   # nothing cached in the mount may answer for the daemon
        d0 = daemon_reads(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            pt_open = passthrough_opens(p)
            probs = read_problems(fd, want, random.Random(1), "passthrough open")
            probs += read_problems(fd, want, random.Random(2), "passthrough open, again", whole=False)
            d1 = daemon_reads(p)
            pt_after_reads = passthrough_opens(p)
        finally:
            os.close(fd)
        self.assertEqual(probs, [], "wrong bytes from a passthrough open")
        self.assertGreaterEqual(pt_open, 1, "%s is local but its open was not passed through "
                                "(user.wfs.passthrough = %d while open)" % (p, pt_open))
        self.assertGreaterEqual(pt_after_reads, 1)
        self.assertEqual(d1, d0, "the daemon served %d READ requests for a passthrough open "
                         "(user.wfs.daemon_reads %d -> %d)" % (d1 - d0, d0, d1))
        self.assertEqual(wait_passthrough(p, 0), 0, "user.wfs.passthrough %ds after the last close"
                         % RELEASE_WAIT)
        self.assertEqual(daemon_reads(p), d0)

    def test_mmap_keeps_the_open_until_munmap(self):
        p, want = self.path, self.want
        wfstest.drop_caches()
        d0 = daemon_reads(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            self.assertEqual(hashlib.sha256(mm[:]).hexdigest(), BLOB["engaged"]["entry"]["sha256"],
                             "mmap of a passthrough open (after close of its fd)")
            release_fence()
            pt_mapped = passthrough_opens(p)
            self.assertEqual(pt_mapped, 1, "user.wfs.passthrough after close() while the file is "
                             "still mapped (the mapping keeps the open)")
            rng = random.Random(3)
            for _ in range(32):
                a = rng.randrange(0, len(want)) | 1
                b = min(len(want), a + rng.randrange(1, 100000))
                self.assertEqual(mm[a:b], want[a:b], "mmap[%d:%d] after close()" % (a, b))
        finally:
            mm.close()
        self.assertEqual(wait_passthrough(p, 0), 0, "user.wfs.passthrough %ds after munmap"
                         % RELEASE_WAIT)
        self.assertEqual(daemon_reads(p), d0, "READ requests reached the daemon for an mmap of a "
                         "passthrough open")

    def test_four_concurrent_passthrough_opens(self):
        p, want = self.path, self.want
        wfstest.drop_caches()
        d0 = daemon_reads(p)
        counts, errs, lock = [], [], threading.Lock()
        barrier = threading.Barrier(4, action=lambda: counts.append(passthrough_opens(p)), timeout=30)

        def worker(i):
            fd = -1
            try:
                fd = os.open(p, os.O_RDONLY)
                barrier.wait()          # all 4 open now: the action counted them
                rng = random.Random(100 + i)
                for k in range(3):
                    got = read_problems(fd, want, rng, "thread %d pass %d" % (i, k), whole=(k != 1))
                    with lock:
                        errs.extend(got)
                barrier.wait()
            except OSError as e:
                with lock:
                    errs.append("thread %d: %s (%s)" % (i, e, errno.errorcode.get(e.errno, e.errno)))
            except threading.BrokenBarrierError:
                with lock:
                    errs.append("thread %d: barrier broken (another thread failed)" % i)
            finally:
                if fd >= 0:
                    os.close(fd)
        ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in ts), "a reader thread hung")
        self.assertEqual(errs, [], "4 concurrent passthrough opens")
        self.assertEqual(counts[:1], [4], "user.wfs.passthrough with 4 opens held")
        self.assertEqual(counts[1:], [4], "user.wfs.passthrough after the reads, 4 opens held")
        d1 = daemon_reads(p)
        self.assertEqual(d1, d0, "the daemon served %d READ requests for 4 passthrough opens" % (d1 - d0))
        self.assertEqual(wait_passthrough(p, 0), 0, "user.wfs.passthrough after the 4 closes")


# ------------------------------------------------------------------ 2

class MixedModes(unittest.TestCase):
    """Opens made before a promotion keep the inode daemon-served; the first
    open after the last of them closed goes passthrough."""

    def test_opens_across_promotion(self):
        b = BLOB["mixed"]
        p, want = b["path"], b["want"]
        self.assertEqual(state_of(p), "nas", "the mixed-mode shard must start on the NAS")
        g = ReaderGroup(p, want)
        results = None
        try:
            # -- 2 readers open it from the NAS and read in a loop
            early = g.spawn(2, seed0=10)
            self.assertTrue(wfstest.wait_until(lambda: all(r.opened.is_set() for r in early), 10),
                            "early readers did not open %s" % p)
            self.assertTrue(g.wait_iters(early, 0, 2), "early readers made no progress before the "
                            "promotion: %s" % [list(r.iters) for r in early])
            self.assertEqual(passthrough_opens(p), 0, "a NAS blob's open passed through")

            # -- promote under them
            g.phase.value = 1
            ctl_check(self, ["promote", "--wait", p])
            self.assertEqual(state_of(p), "local")
            g.phase.value = 2
            self.assertTrue(g.wait_iters(early, 2, 2), "early readers made no progress after the "
                            "promotion: iterations per phase %s" % [list(r.iters) for r in early])
            self.assertEqual(passthrough_opens(p), 0, "early (daemon-served) opens still held, yet "
                             "an open is counted as passthrough")

            # -- new opens while the early ones are held: daemon-served, right
            g.phase.value = 3
            late = g.spawn(2, seed0=20)
            pt_seen = set()
            ok = wfstest.wait_until(lambda: pt_seen.add(passthrough_opens(p)) or
                                    all(r.iters[3] >= 2 for r in late), 20, 0.02)
            self.assertTrue(ok, "late readers made no progress: %s" % [list(r.iters) for r in late])
            self.assertEqual(pt_seen, {0}, "user.wfs.passthrough seen while daemon-served opens "
                             "were held (must stay 0: a mixed inode fails with EIO)")
            fd = os.open(p, os.O_RDONLY)
            try:
                self.assertEqual(passthrough_opens(p), 0, "new open while early ones are held")
                self.assertEqual(read_problems(fd, want, random.Random(30), "new open, early held"), [])
                # park every reader (no mmap alive), drop caches: the READs now
                # counted are this open's
                self.assertTrue(g.pause(), "readers did not park")
                wfstest.drop_caches()
                d0 = daemon_reads(p)
                probs = read_problems(fd, want, random.Random(31), "new open after drop_caches")
                d1 = daemon_reads(p)
                pt = passthrough_opens(p)
            finally:
                os.close(fd)
            self.assertEqual(probs, [])
            self.assertEqual(pt, 0)
            self.assertGreater(d1, d0, "a daemon-served open read %d bytes after drop_caches with no "
                               "READ request counted (user.wfs.daemon_reads %d -> %d)"
                               % (len(want), d0, d1))
            g.resume()
            self.assertTrue(g.wait_iters(early + late, 3, 3), "readers made no progress after resume")
        finally:
            results = g.finish()
        for r, res in results:
            self.assertIsNotNone(res, "reader pid %s died (exit code %s) without reporting"
                                 % (r.proc.pid, r.proc.exitcode))
            self.assertEqual(res, [], "reader pid %s (iterations per phase %s)" % (r.proc.pid, list(r.iters)))
            self.assertEqual(r.proc.exitcode, 0)
        totals = [list(r.iters) for r, _ in results]

        # -- every early open is closed (the readers have exited) and the
        # daemon has seen their RELEASEs: the next open goes passthrough
        release_fence()
        fd = os.open(p, os.O_RDONLY)
        try:
            pt = passthrough_opens(p)
            self.assertEqual(pt, 1, "the first open after every earlier open was closed (and its "
                             "RELEASE handled) was not passed through")
            wfstest.drop_caches()
            d0 = daemon_reads(p)
            probs = read_problems(fd, want, random.Random(40), "passthrough open after the early closed")
            d1 = daemon_reads(p)
        finally:
            os.close(fd)
        self.assertEqual(probs, [])
        self.assertEqual(d1, d0, "the daemon served %d READs for the passthrough open" % (d1 - d0))
        self.assertEqual(wait_passthrough(p, 0), 0)
        print("\n  mixed: reader iterations per phase (NAS, promoting, local, late opens) %s"
              % totals, file=sys.stderr)


# ------------------------------------------------------------------ 3

class OwnMount:
    """A mixin: a wfs mount of the class's own over the fixture hub, NAME
    naming its LOCAL_STORE and mount point, OPTIONS its -o options;
    prepare() runs once it answers on its control socket."""

    NAME = OPTIONS = None

    @classmethod
    def setUpClass(cls):
        cls.local = os.path.join(FIX.gen, "local-" + cls.NAME)
        cls.mnt = os.path.join(FIX.gen, "mnt-" + cls.NAME)
        os.mkdir(cls.mnt)
        cls.mount = None
        cls.mount = wfstest.Mount(FIX.hub, cls.local, cls.mnt, cls.OPTIONS).start()
        try:
            wfstest.wait_ctl(cls.mnt)
            cls.prepare()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def prepare(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        problems = cls.mount.stop() if cls.mount else []
        cls.mount = None
        if problems:
            raise AssertionError("teardown of the -o %s mount: %s"
                                 % (",".join(cls.OPTIONS), "; ".join(problems)))


class Fallback(OwnMount, unittest.TestCase):
    """-o passthrough=off: a local blob is daemon-served from its copy."""

    NAME, OPTIONS = "nopt", ("passthrough=off", "auto_promote=off")

    @classmethod
    def prepare(cls):
        cls.path = os.path.join(cls.mnt, BLOB["engaged"]["entry"]["path"])
        ctl_check(unittest.TestCase(), ["promote", "--wait", cls.path])

    def test_reads_daemon_served_from_local_copy(self):
        p, want = self.path, BLOB["engaged"]["want"]
        self.assertEqual(state_of(p), "local", "after promote --wait on the passthrough=off mount")
        wfstest.drop_caches()
        l0, n0 = wfstest.served_bytes(self, self.mnt)
        d0 = daemon_reads(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            pt_open = passthrough_opens(p)
            probs = read_problems(fd, want, random.Random(50), "passthrough=off")
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            probs += [] if mm[:] == want else ["mmap after close(): " + _diff(mm[:], want)]
            pt_mapped = passthrough_opens(p)
        finally:
            mm.close()
        d1 = daemon_reads(p)
        l1, n1 = wfstest.served_bytes(self, self.mnt)
        self.assertEqual(probs, [], "wrong bytes with passthrough=off")
        self.assertEqual((pt_open, pt_mapped), (0, 0), "user.wfs.passthrough with -o passthrough=off "
                         "(open, mapped after close)")
        self.assertGreater(d1, d0, "with passthrough=off, reading %d bytes after drop_caches counted no "
                           "READ request (user.wfs.daemon_reads %d -> %d)" % (len(want), d0, d1))
        self.assertGreaterEqual(l1 - l0, len(want), "served.local_bytes grew by %d for a %d-byte "
                                "local file read whole" % (l1 - l0, len(want)))
        self.assertEqual(n1 - n0, 0, "served.nas_bytes grew while reading a local blob")
        # one page-cache copy: the mount's; the daemon reads its copy
        # around the cache (O_DIRECT, or its pages dropped)
        copies = [os.path.join(self.local, "data", rel) for rel, st in
                  wfstest.store_files(self.local).items() if st.st_size == len(want)]
        self.assertTrue(copies, "no copy of %d bytes in LOCAL_STORE/data" % len(want))
        res = max(wfstest.resident_bytes(c) for c in copies)
        self.assertLessEqual(res, len(want) // 50, "the local copy in the page cache too: %d of "
                             "%d bytes (two copies of the file)" % (res, len(want)))


class StackedStore(unittest.TestCase):
    """LOCAL_STORE on overlayfs: the kernel takes no backing of a stacked
    filesystem (ELOOP, for the stack depth).  Every open asked again and
    the route stayed "on" in stats while every local read was
    daemon-served; now the first refusal says why, the route is
    "refused", and the reads are right."""

    def test_local_store_on_overlayfs(self):
        base = os.path.join(FIX.gen, "ovl")
        dirs = {k: os.path.join(base, k) for k in ("lower", "upper", "work", "merged")}
        for d in dirs.values():
            os.makedirs(d)
        r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            "lowerdir=%(lower)s,upperdir=%(upper)s,workdir=%(work)s" % dirs,
                            dirs["merged"]], capture_output=True, text=True)
        if r.returncode != 0:
            wfstest.skip_or_fail("cannot mount an overlayfs: " + r.stderr.strip())
        self.addCleanup(subprocess.run, ["umount", dirs["merged"]], capture_output=True)
        mnt = os.path.join(base, "mnt")
        os.mkdir(mnt)
        m = wfstest.ForegroundMount(FIX.hub, os.path.join(dirs["merged"], "local"), mnt,
                                    ["auto_promote=off"]).start()
        self.addCleanup(m.cleanup)
        self.addCleanup(m.stop)
        wfstest.wait_ctl(mnt)
        p, want = os.path.join(mnt, BLOB["engaged"]["entry"]["path"]), BLOB["engaged"]["want"]
        ctl_check(self, ["promote", "--wait", p])
        self.assertEqual(state_of(p), "local")
        for k in range(3):
            fd = os.open(p, os.O_RDONLY)
            try:
                self.assertEqual(passthrough_opens(p), 0, "open %d passed through" % k)
                probs = read_problems(fd, want, random.Random(k), "stacked store")
            finally:
                os.close(fd)
            self.assertEqual(probs, [], "open %d" % k)
        self.assertEqual(wfstest.route_of(self, mnt, "passthrough")[0], "refused", m.log()[-2000:])
        said = [l for l in m.log().splitlines() if "stacked filesystem" in l]
        self.assertEqual(len(said), 1, m.log()[-3000:])
        self.assertIn("[warning]", said[0])


# ------------------------------------------------------------------ 4

class EvictOpen(unittest.TestCase):
    """evict --force of a blob whose inode is open in passthrough."""

    def test_evict_under_passthrough_readers(self):
        b = BLOB["evict"]
        p, want, e = b["path"], b["want"], b["entry"]
        ctl_check(self, ["promote", "--wait", p])
        self.assertEqual(state_of(p), "local")
        copies = [rel for rel, st in wfstest.store_files(FIX.local).items() if st.st_size == e["size"]
                  and wfstest.sha256_file(os.path.join(FIX.local, "data", rel))[0] == e["sha256"]]
        self.assertEqual(len(copies), 1, "local copy of %s in LOCAL_STORE/data" % e["path"])

        fd = os.open(p, os.O_RDONLY)
        mm = None
        try:
            self.assertEqual(passthrough_opens(p), 1, "open of a promoted blob not passed through")
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            self.assertEqual(mm[:], want)
            d0 = daemon_reads(p)

            out = ctl_json(self, ["evict", "--force", p])
            self.assertEqual(out.get("evicted"), 1, "evict --force: %s" % out)
            self.assertEqual(state_of(p), "nas", "after evict --force")
            self.assertFalse(os.path.exists(os.path.join(FIX.local, "data", copies[0])),
                             "the evicted copy is still in LOCAL_STORE/data")

            # the open (and its mapping) keep reading right bytes, from cold
            wfstest.drop_caches()
            probs = read_problems(fd, want, random.Random(60), "passthrough open after evict")
            if mm[:] != want:
                probs.append("mmap made before evict: " + _diff(mm[:], want))
            # an open made meanwhile reads right bytes too, whichever way it is served
            fd2 = os.open(p, os.O_RDONLY)
            try:
                probs += read_problems(fd2, want, random.Random(61), "open during evicted passthrough")
            finally:
                os.close(fd2)
            d1 = daemon_reads(p)
            os.close(fd)
            fd = -1
            release_fence()
            if mm[:] != want:
                probs.append("mmap after evict and close(): " + _diff(mm[:], want))
        finally:
            if mm is not None:
                mm.close()
            if fd >= 0:
                os.close(fd)
        self.assertEqual(probs, [], "reads after evicting a blob open in passthrough")
        self.assertEqual(d1, d0, "READ requests reached the daemon for the passthrough open "
                         "after the eviction")
        self.assertEqual(wait_passthrough(p, 0), 0, "user.wfs.passthrough after all closes")

        # a new open now reads the NAS, through the daemon
        wfstest.drop_caches()
        l0, n0 = wfstest.served_bytes(self, FIX.mnt)
        d0 = daemon_reads(p)
        fd = os.open(p, os.O_RDONLY)
        try:
            pt = passthrough_opens(p)
            probs = read_problems(fd, want, random.Random(62), "new open after evict")
        finally:
            os.close(fd)
        d1 = daemon_reads(p)
        l1, n1 = wfstest.served_bytes(self, FIX.mnt)
        self.assertEqual(probs, [])
        self.assertEqual(pt, 0, "an evicted blob's new open was passed through")
        self.assertGreater(d1, d0, "the evicted blob's reads did not reach the daemon")
        self.assertGreaterEqual(n1 - n0, len(want), "served.nas_bytes grew by %d reading the evicted "
                                "%d-byte blob whole" % (n1 - n0, len(want)))


# ------------------------------------------------------------------ 5

class NasPassthrough(OwnMount, unittest.TestCase):
    """-o nas_passthrough=on: a blob on the NAS is read by the kernel from
    the NAS file itself (no READ reaches the daemon), right bytes through
    read, pread and mmap; what it read counts as NAS bytes (cachestat) and
    makes it hot; promoted while open, the open keeps reading right bytes,
    and the next open after the last close is the local copy's."""

    NAME, OPTIONS = "naspt", ("nas_passthrough=on", "auto_promote=off")

    def test_nas_blob_read_by_the_kernel_then_promoted_under_it(self):
        b = BLOB["mixed"]
        p, want = os.path.join(self.mnt, b["entry"]["path"]), b["want"]
        self.assertEqual(state_of(p), "nas")
        wfstest.drop_caches()
        l0, n0 = wfstest.served_bytes(self, self.mnt)
        d0 = daemon_reads(p)
        fd = os.open(p, os.O_RDONLY)
        mm = None
        try:
            pt = passthrough_opens(p)
            held = daemon_fds_on(self.local, self.mnt, os.path.realpath(
                os.path.join(FIX.hub, b["entry"]["nas_real"])))
            probs = read_problems(fd, want, random.Random(70), "nas passthrough")
            mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            probs += [] if mm[:] == want else ["mmap: " + _diff(mm[:], want)]
            # promoted while open: this open stays on the NAS file, right bytes
            ctl_check(self, ["promote", "--wait", p])
            self.assertEqual(state_of(p), "local", "after promote --wait")
            wfstest.drop_caches()
            probs += read_problems(fd, want, random.Random(71), "nas passthrough after promotion")
            probs += [] if mm[:] == want else ["mmap after promotion: " + _diff(mm[:], want)]
            d1 = daemon_reads(p)
        finally:
            if mm is not None:
                mm.close()
            os.close(fd)
        self.assertEqual(probs, [], "wrong bytes through passthrough to the NAS file")
        self.assertEqual(pt, 1, "user.wfs.passthrough of an open NAS blob with nas_passthrough=on")
        self.assertEqual(d1, d0, "READ requests reached the daemon for an open passed through "
                         "to the NAS file")
        self.assertEqual(wait_passthrough(p, 0), 0, "user.wfs.passthrough after the close")
        # the daemon's own descriptor of the backing, kept so that its
        # last close is the closer's, not a worker's: closed with it
        self.assertGreaterEqual(held, 2, "the daemon's NAS descriptors of the open")
        nas = os.path.realpath(os.path.join(FIX.hub, b["entry"]["nas_real"]))
        left = wfstest.wait_until(lambda: daemon_fds_on(self.local, self.mnt, nas) == 0, 10)
        self.assertTrue(left, "the daemon still holds %d descriptors of %s after the last close"
                        % (daemon_fds_on(self.local, self.mnt, nas), nas))
        l1, n1 = wfstest.served_bytes(self, self.mnt)
        self.assertGreaterEqual(n1 - n0, len(want), "served.nas_bytes grew by %d after the kernel "
                                "read the %d-byte NAS file whole (cachestat at release)"
                                % (n1 - n0, len(want)))
        # the next open is the local copy's (passthrough to it), right bytes
        wfstest.drop_caches()
        fd = os.open(p, os.O_RDONLY)
        try:
            pt2 = passthrough_opens(p)
            probs = read_problems(fd, want, random.Random(72), "reopened after promotion")
        finally:
            os.close(fd)
        l2, n2 = wfstest.served_bytes(self, self.mnt)
        self.assertEqual(probs, [])
        self.assertEqual(pt2, 1, "the reopened, now local, blob was not passed through")
        self.assertEqual(n2, n1, "the reopened local blob counted NAS bytes")
        self.assertEqual(daemon_reads(p), d0, "READ requests reached the daemon")

    def test_overlapping_opens_count_the_file_once(self):
        """Two opens of a NAS blob passed through, read whole through one:
        its page cache grew once, and is counted once (each open's release
        counted it: twice the file)."""
        b = BLOB["evict"]
        p, want = os.path.join(self.mnt, b["entry"]["path"]), b["want"]
        self.assertEqual(state_of(p), "nas")
        wfstest.drop_caches()
        l0, n0 = wfstest.served_bytes(self, self.mnt)
        fds = [os.open(p, os.O_RDONLY) for _ in range(2)]
        try:
            self.assertEqual(passthrough_opens(p), 2)
            got = os.pread(fds[0], len(want) + 1, 0)
        finally:
            for fd in fds:
                os.close(fd)
        self.assertEqual(got, want)
        self.assertEqual(wait_passthrough(p, 0), 0)
        l1, n1 = wfstest.served_bytes(self, self.mnt)
        page = os.sysconf("SC_PAGE_SIZE")
        self.assertTrue(len(want) <= n1 - n0 <= len(want) + page,
                        "served.nas_bytes grew by %d for one read of a %d-byte file"
                        % (n1 - n0, len(want)))
        # an open made after the promotion joins the NAS backing, with no
        # NAS descriptor of its own: what it reads counts all the same
        a = os.open(p, os.O_RDONLY)
        try:
            ctl_check(self, ["promote", "--wait", p])
            wfstest.drop_caches()
            b = os.open(p, os.O_RDONLY)
        finally:
            os.close(a)
        try:
            self.assertEqual(wait_passthrough(p, 1), 1)  # (a's RELEASE comes after its close)
            got = os.pread(b, len(want) + 1, 0)
        finally:
            os.close(b)
        self.assertEqual(got, want)
        self.assertEqual(wait_passthrough(p, 0), 0)
        l2, n2 = wfstest.served_bytes(self, self.mnt)
        self.assertGreaterEqual(n2 - n1, len(want), "an open joined after the promotion")


if __name__ == "__main__":
    wfstest.main()
