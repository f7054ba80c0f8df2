#!/usr/bin/env python3
"""FUSE over io_uring (-o fuse_uring=on): requests taken through the rings
(the daemon's counter says so) get the same bytes and answers as through
/dev/fuse; an open file moves to its local copy; the daemon's threads are
named (wfs-ring, wfs-copy, ...); the mount unmounts with readers busy; and
without the kernel's consent (enable_uring off) the mount serves as before,
through /dev/fuse, as it does when the daemon cannot make its rings (the
INIT reply then does not ask for them)."""

import errno
import fcntl
import hashlib
import os
import random
import shutil
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

ENABLE = "/sys/module/fuse/parameters/enable_uring"
FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off", "fuse_uring=on"),
                         scale_mib=16, many=50)
MiB = 1 << 20
SAVED = {}


def set_enable(value):
    with open(ENABLE, "w") as f:
        f.write(value)


def enable_uring():
    """Let the kernel offer FUSE over io_uring to the mounts made from now
    on (it reads the parameter at each mount's INIT); returns the value to
    put back with restore_uring().  Skips (fails under CI) without it.

    The parameter is the machine's: this test turns it off for a while,
    and test_uringfault's mounts need it on.  Whoever calls this holds a
    lock on it until the process ends, so the two never run at once."""
    wfstest.require_mount_capability()
    if not os.path.exists(ENABLE):
        wfstest.skip_or_fail("this kernel has no FUSE over io_uring (%s missing)" % ENABLE)
    if "lock" not in SAVED:
        fd = os.open("/run/wfs-test-enable_uring.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        SAVED["lock"] = fd
    with open(ENABLE) as f:
        saved = f.read().strip()
    set_enable("1")
    return saved


def restore_uring(saved):
    if saved is not None:
        set_enable(saved)


def set_up():
    FIX.setup()
    # The mount's first answer comes once the kernel has applied its INIT
    # reply, which reads enable_uring again: only then may Declined turn it
    # off.  (The reply waits for the daemon's rings to be made: under load
    # Declined's switch came first, and the kernel ignored the reply's ask.)
    os.stat(FIX.mnt)


def setUpModule():
    SAVED["enable"] = enable_uring()
    wfstest.set_up_or_undo(set_up, tearDownModule)  # (the machine's switch, the mount)


def tearDownModule():
    try:
        FIX.teardown()
    finally:
        restore_uring(SAVED.get("enable"))


def ring_requests(tc, mnt):
    return wfstest.ctl_json(tc, ["stats", mnt])["metrics"]["fuse_uring_requests"]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


class ThroughRings(unittest.TestCase):
    def test_every_file_reads_its_bytes(self):
        before = ring_requests(self, FIX.mnt)
        files = [e for e in FIX.readable() if e["type"] == "file"]
        bad = [e["path"] for e in files if sha256_of(FIX.m(e["path"])) != e["sha256"]]
        self.assertEqual(bad, [], "read through the rings, these differ from the NAS")
        # every open and read went through a ring: at least one request each
        self.assertGreaterEqual(ring_requests(self, FIX.mnt) - before, len(files))
        self.assertEqual(wfstest.route_of(self, FIX.mnt, "fuse_uring"), ("on", None))

    def test_preads_at_odd_offsets(self):
        e = max(FIX.of("file"), key=lambda e: e["size"])
        rnd = random.Random(7)
        fd, nfd = os.open(FIX.m(e["path"]), os.O_RDONLY), os.open(FIX.n(e["nas_real"]), os.O_RDONLY)
        try:
            for _ in range(300):
                off, ln = rnd.randrange(e["size"] + 10), rnd.choice([1, 4095, 4096, 65537, MiB + 3])
                self.assertEqual(os.pread(fd, ln, off), os.pread(nfd, ln, off),
                                 "pread(%d, %d) of %s" % (ln, off, e["path"]))
        finally:
            os.close(fd)
            os.close(nfd)

    def test_listings_links_and_errors(self):
        for e in FIX.of("dir")[:40]:
            self.assertEqual(sorted(os.listdir(FIX.m(e["path"]))),
                             sorted(os.listdir(FIX.n(e["path"]))), e["path"])
        for e in FIX.of("link")[:40]:
            self.assertEqual(os.readlink(FIX.m(e["path"])), os.readlink(FIX.n(e["path"])))
        with self.assertRaises(OSError) as cm:
            os.stat(FIX.m("models--no--such-repo"))
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        with self.assertRaises(OSError) as cm:
            os.open(FIX.m("new-file"), os.O_WRONLY | os.O_CREAT, 0o644)
        self.assertIn(cm.exception.errno, (errno.EROFS, errno.EACCES, errno.EPERM))

    def test_concurrent_readers(self):
        files = sorted(FIX.of("file"), key=lambda e: -e["size"])[:8]
        bad = []

        def read(e):
            if sha256_of(FIX.m(e["path"])) != e["sha256"]:
                bad.append(e["path"])

        threads = [threading.Thread(target=read, args=(e,)) for e in files * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(bad, [])

    def test_threads_are_named(self):
        # what an operator sees in `top -H` or `ps -L` (the comm of each
        # task): one name a role, FUSE workers left as the process's own
        pids = wfstest.daemon_pids(FIX.local, FIX.mnt)
        self.assertEqual(len(pids), 1, "one daemon: %s" % pids)
        names = []
        for t in os.listdir("/proc/%d/task" % pids[0]):
            try:
                with open("/proc/%d/task/%s/comm" % (pids[0], t)) as f:
                    names.append(f.read().strip())
            except FileNotFoundError:
                pass  # a thread that ended meanwhile
        # (the NAS threads, wfs-nas, come and go with the calls)
        want = ["wfs-ring", "wfs-copy", "wfs-copyrange", "wfs-ctl", "wfs-ctl-work",
                "wfs-nasprobe", "wfs-inval", "wfs-dirattr", "wfs-record", "wfs-auto",
                "wfs-recheck"]
        self.assertEqual([n for n in want if n not in names], [],
                         "threads not named so (the daemon's: %s)" % sorted(names))
        self.assertGreaterEqual(names.count("wfs-copy"), 2, sorted(names))

    def test_open_file_moves_to_its_local_copy(self):
        e = max((x for x in FIX.of("file") if "/blobs/" in x["path"]), key=lambda x: x["size"])
        p, n = FIX.m(e["path"]), FIX.n(e["nas_real"])
        with open(p, "rb") as f, open(n, "rb") as g:
            self.assertEqual(f.read(e["size"] // 3), g.read(e["size"] // 3))
            wfstest.ctl_check(self, ["promote", "--wait", p])
            self.assertEqual(f.read(), g.read(), "after promotion, through the same open")
        self.assertEqual(sha256_of(p), e["sha256"], "a new open of the local copy")


class Unmount(unittest.TestCase):
    def test_unmount_with_readers_busy(self):
        base = wfstest.make_base("wfs-uring-")
        local, mnt = os.path.join(base, "local"), os.path.join(base, "mnt")
        os.mkdir(mnt)
        m = wfstest.Mount(FIX.hub, local, mnt, ("auto_promote=off", "fuse_uring=on")).start()
        stop, errors = threading.Event(), []
        e = max(FIX.of("file"), key=lambda e: e["size"])

        def reader():
            try:
                while not stop.is_set():
                    with open(os.path.join(mnt, e["path"]), "rb") as f:
                        while f.read(MiB):
                            pass
            except OSError as err:  # the mount going away under it
                errors.append(err.errno)

        try:
            self.assertGreater(ring_requests(self, mnt), 0)
            threads = [threading.Thread(target=reader) for _ in range(4)]
            for t in threads:
                t.start()
            # unmount (lazily: the readers hold the mount busy); the daemon
            # must exit, and the readers get errors, not a hang
            problems = [p for p in m.stop() if "used umount -l" not in p]
            stop.set()
            for t in threads:
                t.join(30)
                self.assertFalse(t.is_alive(), "a reader hung after the unmount")
            self.assertEqual(problems, [])
            self.assertTrue(all(x in (errno.ENOTCONN, errno.ENOENT, errno.EIO, errno.ECONNABORTED)
                                for x in errors), errors)
        finally:
            stop.set()
            if wfstest.is_mounted(mnt):
                m.stop()
            shutil.rmtree(base, ignore_errors=True)


class Declined(unittest.TestCase):
    def test_without_enable_uring_the_mount_serves_through_dev_fuse(self):
        base = wfstest.make_base("wfs-uring-")
        local, mnt = os.path.join(base, "local"), os.path.join(base, "mnt")
        os.mkdir(mnt)
        set_enable("0")
        try:
            m = wfstest.Mount(FIX.hub, local, mnt, ("auto_promote=off", "fuse_uring=on")).start()
        finally:
            set_enable("1")
        try:
            e = max(FIX.of("file"), key=lambda e: e["size"])
            self.assertEqual(sha256_of(os.path.join(mnt, e["path"])), e["sha256"])
            self.assertEqual(ring_requests(self, mnt), 0)
            self.assertEqual(wfstest.route_of(self, mnt, "fuse_uring"), ("not_offered", None))
        finally:
            self.assertEqual(m.stop(), [])
            shutil.rmtree(base, ignore_errors=True)


SHA256_OF = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"


class RingsRefused(unittest.TestCase):
    def test_fuse_uring_where_rings_cannot_be_made(self):
        """-o fuse_uring=on in a daemon that cannot make a ring (run under
        `test/confine --no-io-uring`, as in a container whose seccomp
        profile refuses io_uring), the kernel offering the protocol: the INIT reply must
        not ask for it -- from a reply that does, the kernel holds every
        request until each queue has a ring registered, and the mount
        hangs (it did).  Reads are right, through /dev/fuse, and the log
        says why, once."""
        self.check_reads_without_rings(wfstest.NoRingMount)

    def test_fuse_uring_where_rings_cannot_submit(self):
        """The same where rings are made but io_uring_enter is refused
        (`confine --no-io-uring-enter`): no REGISTER could reach the kernel, so a
        ring made is not enough to ask for the protocol (the mount hung)."""
        self.check_reads_without_rings(wfstest.NoEnterMount)

    def check_reads_without_rings(self, mount_class):
        wfstest.require_confine()
        base = wfstest.make_base("wfs-uring-")
        local, mnt = os.path.join(base, "local"), os.path.join(base, "mnt")
        os.mkdir(mnt)
        m = mount_class(FIX.hub, local, mnt, ["auto_promote=off", "fuse_uring=on"])
        rc = 0
        try:
            m.start()
            e = max(FIX.of("file"), key=lambda e: e["size"])
            # in a child: a read the kernel holds is killable, a thread here is not
            rc, out, err = wfstest.run_captured([sys.executable, "-c", SHA256_OF,
                                                 os.path.join(mnt, e["path"])], timeout=30)
            self.assertIsNotNone(rc, "a read through the mount still waited after 30 s (the "
                                 "kernel holding requests for rings never made?)")
            self.assertEqual((rc, out.strip()), (0, e["sha256"]), err)
            self.assertEqual(ring_requests(self, mnt), 0)
            said = [l for l in m.log().splitlines() if "FUSE over io_uring not asked for" in l]
            self.assertEqual(len(said), 1, m.log()[-3000:])
            self.assertIn("Operation not permitted", said[0])
            self.assertEqual(wfstest.route_of(self, mnt, "fuse_uring"),
                             ("refused", "Operation not permitted"))
        finally:
            if m.pids and rc is None:
                # the kernel holds every request of that mount (an umount's
                # stat too): only the daemon's end lets them go
                wfstest.kill_daemon(self, m.pids)
                wfstest.drop_dead_mount(self, mnt)
                m.proc.wait()
                m.cleanup()
            elif m.pids:
                self.assertEqual(m.stop(), [])
                m.cleanup()
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    wfstest.main()
