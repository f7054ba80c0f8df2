"""FaultNAS: test/faultfs (a FUSE view of a directory with faults a test
turns on and off) driven from Python: the NAS a wfs test can freeze, break,
slow down or make vanish.

  nas = FaultNAS(src, mnt, ctl).start()   # mounted when it returns
  nas.cmd("hang")                         # every NAS call blocks ...
  nas.wait_hung(1)                        # ... one is blocked now
  nas.cmd("ok")                           # ... and they all go on
  nas.vanish()                            # kill -9: the mount answers ENOTCONN
  nas.restore()                           # umount -l the dead mount, start again
  problems = nas.stop()

FaultDisk: an ext4 filesystem whose blocks fail on demand -- an image file
on faultfs --rw, attached to a loop device, made and mounted -- for a
LOCAL_STORE whose disk returns EIO.

  disk = FaultDisk(base).start(self.addCleanup)  # each undo registered as it is done
  disk.fail_file(path)                    # reads of that file's blocks fail EIO
  disk.heal()

The binary is WFS_FAULTFS (default <repo>/build/test/faultfs); without it
the tests skip, or fail under CI=true (wfstest.skip_or_fail).
"""

import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import wfstest

CTL_TIMEOUT = 10       # seconds one control command may take (it is instant)
START_TIMEOUT = 10     # seconds faultfs may take to mount
EXIT_TIMEOUT = wfstest.EXIT_TIMEOUT


def faultfs_bin():
    return os.environ.get("WFS_FAULTFS") or os.path.join(wfstest.REPO, "build", "test", "faultfs")


def require_faultfs():
    wfstest.require_mount_capability()
    p = faultfs_bin()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        wfstest.skip_or_fail("faultfs (WFS_FAULTFS) not found or not executable: " + p)


def wait_mounts(pred, timeout):
    """Wait until pred() is true, re-checking it each time the mount table
    changes (/proc/self/mountinfo polls POLLPRI then) and at least every
    50 ms (pred may also watch a process).  Returns pred()'s last value."""
    deadline = time.monotonic() + timeout
    with open("/proc/self/mountinfo") as f:
        p = select.poll()
        p.register(f, select.POLLPRI | select.POLLERR)
        while True:
            f.seek(0)
            f.read()  # re-arms the event
            v = pred()
            left = deadline - time.monotonic()
            if v or left <= 0:
                return v
            p.poll(min(left, 0.05) * 1000)


class FaultNAS:
    """One faultfs process serving `src` at `mnt`, controlled through the
    unix socket `ctl`; rw: faultfs --rw (the files in `src` may be written)."""

    def __init__(self, src, mnt, ctl, rw=False):
        self.src, self.mnt, self.ctl = src, mnt, ctl
        self.rw = rw
        self.proc = None
        self.logname = None

    # ---- life

    def start(self):
        """Spawn faultfs -f and return once its mount is up (the control
        socket is bound before the mount, so it answers too)."""
        os.makedirs(self.mnt, exist_ok=True)
        if self.logname is None:
            fd, self.logname = tempfile.mkstemp(prefix="faultfs-log-", suffix=".txt")
            os.close(fd)
        with open(self.logname, "ab") as log:
            argv = [faultfs_bin(), "-f"] + (["--rw"] if self.rw else []) + ["--ctl", self.ctl]
            self.proc = subprocess.Popen(argv + [self.src, self.mnt],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        ok = wait_mounts(lambda: self._mounted_live() or self.proc.poll() is not None,
                         START_TIMEOUT)
        if not (ok and self._mounted_live()):
            self.proc.kill()
            self.proc.wait()
            if wfstest.is_mounted(self.mnt):  # mounted, not answering yet: dead now
                wfstest.umount_quick(self.mnt, "-l")
            raise AssertionError("faultfs %s %s: no mount within %d s (rc %s); log:\n%s"
                                 % (self.src, self.mnt, START_TIMEOUT, self.proc.returncode,
                                    self.log()))
        return self

    def _mounted_live(self):
        """Mounted by faultfs, not a dead mount left by a killed one."""
        e = wfstest.mount_entry(self.mnt)
        return e is not None and e[2] == "fuse.faultfs" and wfstest.errno_of(os.stat, self.mnt) is None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def vanish(self):
        """kill -9 faultfs: its mount stays, answering ENOTCONN to every
        call (the NAS went away).  Returns once it does."""
        if not self.alive():
            raise AssertionError("faultfs is not running")
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=EXIT_TIMEOUT)
        if not wfstest.wait_until(lambda: wfstest.errno_of(os.stat, self.mnt) == errno.ENOTCONN, 5):
            raise AssertionError("after kill -9 of faultfs, stat %s gives %s, not ENOTCONN"
                                 % (self.mnt, wfstest.errname(wfstest.errno_of(os.stat, self.mnt))))

    def restore(self):
        """After vanish(): lazily unmount the dead mount (its users keep
        their ENOTCONN), then serve the same path again."""
        if self.alive():
            raise AssertionError("restore: faultfs is still running (vanish first)")
        if wfstest.is_mounted(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)
            if not wait_mounts(lambda: not wfstest.is_mounted(self.mnt), 5):
                raise AssertionError("umount -l %s: still mounted" % self.mnt)
        return self.start()

    def stop(self):
        """Release every fault, unmount, wait for the process to exit (kill
        it if it does not).  Returns a list of problems."""
        problems = []
        if self.alive():
            try:
                self.reset()
            except (OSError, AssertionError) as e:
                problems.append("faultfs reset before stop: %s" % e)
        if wfstest.is_mounted(self.mnt):
            r = subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True, text=True)
            if r.returncode != 0:
                problems += wfstest.unmount(self.mnt)  # umount, then umount -l
        if self.proc is not None:
            problems += wfstest.reap_child(self.proc, "faultfs")
            if self.proc.returncode not in (0, -signal.SIGKILL):
                problems.append("faultfs exited %s; log:\n%s" % (self.proc.returncode, self.log()))
        if wfstest.is_mounted(self.mnt):  # dead, e.g. after vanish()
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        if self.logname:  # what it said is in the problems already
            os.unlink(self.logname)
            self.logname = None
        return problems

    def log(self):
        try:
            with open(self.logname, errors="replace") as f:
                return f.read()[-5000:]
        except (OSError, TypeError):
            return ""

    # ---- control

    def cmd(self, line, timeout=CTL_TIMEOUT):
        """Send one command line, return the reply line (without newline)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(self.ctl)
            s.sendall(line.encode() + b"\n")
            got = b""
            while b"\n" not in got:
                c = s.recv(4096)
                if not c:
                    break
                got += c
        finally:
            s.close()
        return got.split(b"\n", 1)[0].decode(errors="replace")

    def check(self, line):
        """cmd(), asserting the reply is `ok`."""
        r = self.cmd(line)
        if r != "ok":
            raise AssertionError("faultfs %r replied %r" % (line, r))
        return r

    def reset(self):
        """Back to a healthy NAS: no hang or failure, no eio ranges, no latency,
        entry types in listings, closes answered at once."""
        for line in ("ok", "clear", "latency 0", "notype 0", "closes 0"):
            self.check(line)

    def state(self):
        r = self.cmd("state")
        try:
            return json.loads(r)
        except ValueError:
            raise AssertionError("faultfs state replied %r" % r)

    def wait_hung(self, n=1, timeout=10, what="hung"):
        """Wait until at least n calls are blocked by `hang` (what="hung_reads":
        n READs); returns the state."""
        last = {}

        def enough():
            last.update(self.state())
            return last[what] >= n
        if not wfstest.wait_until(enough, timeout, step=0.01):
            raise AssertionError("faultfs: %d %s after %d s, waited for %d: %s"
                                 % (last.get(what, -1), what, timeout, n, last))
        return dict(last)


# ------------------------------------------------------------------ a disk that fails

FS_IOC_FIEMAP = 0xC020660B          # _IOWR('f', 11, struct fiemap)
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
# extents whose bytes are not (only) at fe_physical on the device
FIEMAP_NOT_ON_DISK = {0x2: "unknown", 0x4: "delalloc", 0x8: "encoded", 0x80: "encrypted",
                      0x200: "inline", 0x400: "tail", 0x800: "unwritten"}


def fiemap(path, max_extents=256):
    """The extents of a file: [(logical, physical, length, flags)] in bytes,
    from the FS_IOC_FIEMAP ioctl (FIEMAP_FLAG_SYNC: written out first).
    physical is the byte offset on the filesystem's device."""
    hdr = struct.Struct("=QQIIII")            # struct fiemap
    ext = struct.Struct("=QQQQQI12x")         # struct fiemap_extent (56 bytes)
    buf = bytearray(hdr.pack(0, (1 << 64) - 1, FIEMAP_FLAG_SYNC, 0, max_extents, 0)
                    + bytes(ext.size * max_extents))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf, True)
    finally:
        os.close(fd)
    mapped = hdr.unpack_from(buf, 0)[3]
    out = []
    for i in range(mapped):
        logical, physical, length, _, _, flags = ext.unpack_from(buf, hdr.size + i * ext.size)
        out.append((logical, physical, length, flags))
    if out and not out[-1][3] & FIEMAP_EXTENT_LAST:
        raise AssertionError("FIEMAP of %s: more than %d extents" % (path, max_extents))
    return out


class FaultDisk:
    """An ext4 filesystem at `base`/fs whose blocks fail on demand: the image
    `base`/disk-src/disk.img served by faultfs --rw at `base`/disk, that
    file attached to a loop device, mkfs.ext4'd and mounted.  A byte of the
    ext4 is the byte at the same offset of the image, so an `eio` range of
    the image is a bad stretch of the disk: reads of the blocks there (by
    the page cache, O_DIRECT, the kernel's FUSE passthrough) fail EIO.

    start(add_cleanup) registers the undo of each step as soon as it is done
    (unittest's addCleanup or addModuleCleanup): umount, losetup -d, faultfs
    stopped -- a failed test leaves no loop device or mount behind.  Each
    undo raises AssertionError when it could not be done cleanly."""

    IMG = "disk.img"

    def __init__(self, base, size_mib=64):
        self.src = os.path.join(base, "disk-src")
        self.nas = FaultNAS(self.src, os.path.join(base, "disk"), os.path.join(base, "disk.sock"),
                            rw=True)
        self.mnt = os.path.join(base, "fs")
        self.size_mib = size_mib
        self.dev = None
        self.loop_mode = None          # "buffered" or "direct-io", as attached

    def start(self, add_cleanup):
        for tool in ("losetup", "mkfs.ext4"):
            if not shutil.which(tool):
                wfstest.skip_or_fail("%s not found (package util-linux / e2fsprogs)" % tool)
        os.makedirs(self.src)
        with open(os.path.join(self.src, self.IMG), "wb") as f:
            f.truncate(self.size_mib << 20)
        self.nas.start()
        add_cleanup(self._stop_faultfs)
        img = os.path.join(self.nas.mnt, self.IMG)
        errs = []
        for mode, extra in (("buffered", []), ("direct-io", ["--direct-io=on"])):
            r = subprocess.run(["losetup", "--find", "--show"] + extra + [img], capture_output=True,
                               text=True, timeout=60)
            if r.returncode == 0:
                self.dev, self.loop_mode = r.stdout.strip(), mode
                break
            errs.append("losetup %s: %s" % (mode, r.stderr.strip()))
        if not self.dev:
            wfstest.skip_or_fail("cannot attach %s on faultfs --rw to a loop device: %s"
                                 % (img, "; ".join(errs)))
        add_cleanup(self._detach)
        wfstest.sh("mkfs.ext4", "-q", "-F", self.dev)
        os.makedirs(self.mnt, exist_ok=True)
        wfstest.sh("mount", "-t", "ext4", self.dev, self.mnt)
        add_cleanup(self._umount)
        os.chmod(self.mnt, 0o755)
        return self

    # ---- undo, in this order

    def _umount(self):
        problems = wfstest.unmount(self.mnt)
        if problems:
            raise AssertionError("FaultDisk: " + "; ".join(problems))

    def _loop_busy(self):
        """The loop device still has a backing file."""
        return os.path.exists("/sys/block/%s/loop/backing_file" % os.path.basename(self.dev))

    def _detach(self):
        r = subprocess.run(["losetup", "-d", self.dev], capture_output=True, text=True, timeout=60)
        # The kernel lets the file go once the last opener (udev's probe)
        # closes the device; faultfs cannot unmount before.
        if not wfstest.wait_until(lambda: not self._loop_busy(), 10):
            raise AssertionError("FaultDisk: %s still attached 10 s after losetup -d (%s)"
                                 % (self.dev, r.stderr.strip() or "exit %d" % r.returncode))

    def _stop_faultfs(self):
        problems = self.nas.stop()
        if problems:
            raise AssertionError("FaultDisk: faultfs: " + "; ".join(problems))

    # ---- faults

    def extents(self, path):
        """FIEMAP of a file of the ext4: [(physical offset in the image,
        length)], asserting every extent is plain data on the device."""
        out = []
        for logical, physical, length, flags in fiemap(path):
            odd = [name for bit, name in FIEMAP_NOT_ON_DISK.items() if flags & bit]
            if odd:
                raise AssertionError("FIEMAP of %s: extent at %d is %s: its bytes are not only "
                                     "on the device" % (path, logical, "+".join(odd)))
            out.append((physical, length))
        return out

    def fail_file(self, path):
        """Make every read of the blocks of `path` (a file of this ext4) fail
        EIO.  Returns the image ranges [(offset, length)]."""
        ranges = self.extents(path)
        if not ranges:
            raise AssertionError("FIEMAP of %s: no extent (an empty file?)" % path)
        for off, ln in ranges:
            self.nas.check("eio %s %d %d" % (self.IMG, off, ln))
        return ranges

    def heal(self):
        self.nas.check("clear")


# ---------------------------------------------------- a module's NAS, calls that may block

STRAGGLERS = []     # threads left blocked by a failed test; joined once the NAS is healed


def module_nas(fix):
    """setUpModule of a test module on a faultfs NAS: faultfs and wfsctl
    there (else skip or fail), the fixture set up, faultfs over its hub."""
    require_faultfs()
    wfstest.require_wfsctl()
    fix.setup()
    return start_nas(fix)


def start_nas(fix):
    """faultfs over the fixture's hub (a HubFixture already set up), at
    <gen>/nas; the fixture is torn down if it cannot start."""
    try:
        return FaultNAS(fix.hub, os.path.join(fix.gen, "nas"),
                        os.path.join(fix.gen, "faultfs.sock")).start()
    except BaseException:
        fix.teardown(raise_problems=False)
        raise


def stop_nas(nas, fix):
    """tearDownModule's half of start_nas: the NAS stopped, blocked calls
    joined, the fixture removed -- unless faultfs is still mounted over it."""
    problems = nas.stop() if nas else []
    heal_stragglers()
    if nas and wfstest.is_mounted(nas.mnt):
        problems.append("not removing %s: faultfs still mounted at %s" % (fix.base, nas.mnt))
        fix.base = None
    fix.teardown()
    if problems:
        raise AssertionError("teardown: " + "; ".join(problems))


def heal_stragglers(timeout=30):
    """Join the blocked threads (the NAS is healthy again), all of them
    within `timeout` together."""
    deadline = time.monotonic() + timeout
    for t in STRAGGLERS:
        t.join(max(0.0, deadline - time.monotonic()))
    STRAGGLERS[:] = [t for t in STRAGGLERS if t.is_alive()]


def pread_file(path, off, n):
    """open, pread n bytes at off, close: one read of a fresh open (a
    bounded() call the tests time as a reader would)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


def nas_of_stats(tc, sock):
    """The daemon's "nas" object (state, counters, reason), from `stats`
    on its control socket: the same object `status` gives, without the
    walk of the whole NAS tree that `status` makes while the NAS is up."""
    # on the socket itself, not through wfsctl: polled every 50 ms, a
    # process each (~75 ms of CPU under a sanitizer) was a cost of its own
    rep = wfstest.ctl_request(sock, {"op": "stats"}, timeout=30)
    tc.assertTrue(rep and rep.get("ok"), "stats on %s: %r" % (sock, rep))
    return rep["metrics"]["nas"]


def wait_nas_state(tc, sock, want, timeout):
    """Wait until the daemon at control socket `sock` says the NAS is
    `want` ("up" or "down"); fail tc naming the last state seen.  Returns
    the "nas" object.  Polled through `stats`: a poll of `status` walks
    the NAS (through faultfs, which caches nothing) at every look, and
    those walks were most of test_nasfault's CPU."""
    last = {}

    def ok():
        last.update(nas_of_stats(tc, sock))
        return last["state"] == want
    if not wfstest.wait_until(ok, timeout, 0.05):
        tc.fail("the daemon's nas.state is %r after %d s, expected %r: %s"
                % (last.get("state"), timeout, want, last))
    return dict(last)


def bounded(fn, *args, timeout):
    """Start fn(*args) in a thread; return a dict: value or errno or exc,
    took (s), done (False: still blocked after `timeout`)."""
    return bounded_all([(fn, args)], timeout)[0]


def bounded_all(calls, timeout):
    """Run every (fn, args) at once, each in its thread; wait until all are
    done or `timeout` passed since the start.  A thread still blocked then
    is kept in STRAGGLERS (joined by heal_stragglers)."""
    out = []

    def run(box, fn, args):
        t0 = time.monotonic()
        try:
            box["value"] = fn(*args)
        except OSError as e:
            box["errno"] = e.errno
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            box["exc"] = repr(e)
        box["took"] = time.monotonic() - t0
        box["done"] = True

    for fn, args in calls:
        box = {"done": False, "errno": None}
        t = threading.Thread(target=run, args=(box, fn, args), daemon=True)
        box["thread"] = t
        out.append(box)
        t.start()
    deadline = time.monotonic() + timeout
    for box in out:
        box["thread"].join(max(0.0, deadline - time.monotonic()))
        if box["thread"].is_alive():
            STRAGGLERS.append(box["thread"])
    return out


# getdents64(2) by hand: a listing read one call at a time, so a test can
# stop the NAS between two calls of one pass (test_nasfault).
SYS_GETDENTS64 = {"x86_64": 217, "aarch64": 61}.get(os.uname().machine)
LIBC = ctypes.CDLL(None, use_errno=True)


def getdents(fd, size):
    """One getdents64(2) of `size` bytes on the directory fd: the names it
    gave ([] at the end), or OSError."""
    buf = ctypes.create_string_buffer(size)
    n = LIBC.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    names, off = [], 0
    while off < n:  # struct linux_dirent64: ino, off, reclen, type, name
        reclen = int.from_bytes(buf.raw[off + 16:off + 18], sys.byteorder)
        names.append(buf.raw[off + 19:off + reclen].split(b"\0", 1)[0].decode())
        off += reclen
    return names
