#!/usr/bin/env python3
"""SIGTERM while a cache invalidation waits for a READ nobody will read.

The daemon tells the kernel to forget a demoted blob's pages from its
thread wfs-inval; the kernel's invalidation waits for every locked page of
the inode, and a page stays locked while a READ of it waits for an answer.
At SIGTERM libfuse stops its idle workers: a READ still queued in the
kernel is never read.  Closing /dev/fuse was meant to end it, but the
notice's write() holds the device open: the daemon waited for the notice
forever, in D state (not even SIGKILL ended it), the mount left behind.

Made to happen for real, in order, each step waiting on an event:
  - one FUSE worker (max_threads=1), reads served by the daemon
    (passthrough=off); blob F promoted (local);
  - the NAS freezes lookups in one directory (faultfs `faildir D hang`):
    a stat of a new name there (X) holds the only worker for up to
    nas_timeout (2 s) -- faultfs counts the hung call;
  - a read of F (Y, its pages dropped) queues a READ nobody reads: Y's
    thread shows state D;
  - F's copy is corrupted and `wfsctl verify --full` demotes it (the NAS
    answers: F's source is not in D): wfs-inval sends the notice, which
    waits on Y's page -- the thread wfs-inval shows state D;
  - SIGTERM, while X still holds the worker.
Then the daemon must exit, the mount be gone, and Y's read end with an
error.  A daemon still there after HANG_WAIT is the bug: the test fails,
then ends the connection itself (umount -f, or fusectl's abort) so no
process in D state and no mount are left behind.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faultnas  # noqa: E402
import wfstest  # noqa: E402
from wfstest import ctl_check, errname, run_wfsctl, state_of  # noqa: E402
from wt_base import _unescape_mount_field as unescape_mount_field  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--shutdown"
HUNG_REPO = "datasets--acme--hung"       # its snapshots/ is the frozen directory D
F_NAME = "model.safetensors"
F_BYTES = wfstest.det_bytes("shutdown F", 2 * MiB + 4321)
NAS_TIMEOUT_MS = 2000     # the most wfs allows: the window the steps must fit in
OPTIONS = ("max_threads=1", "passthrough=off", "auto_promote=off",
           "nas_timeout=%d" % NAS_TIMEOUT_MS, "entry_timeout=3600", "attr_timeout=3600",
           "blob_timeout=3600")
STEP_WAIT = 10            # s: one step's event (a hung call, a thread in D)
EXIT_WAIT = 10            # s: the daemon exits after SIGTERM (it needs nas_timeout)
HANG_WAIT = 20            # s: a daemon not gone by then is stuck for good


class Fix:
    base = hub = nas = None


def setUpModule():
    faultnas.require_faultfs()
    wfstest.require_wfsctl()
    Fix.base = wfstest.make_base("wfs-it-shutdown-")
    unittest.addModuleCleanup(remove_base)
    Fix.hub = os.path.join(Fix.base, "hub")
    Fix.rev = wfstest.make_hf_repo(Fix.hub, REPO, {F_NAME: F_BYTES})
    Fix.hung_rev = wfstest.make_hf_repo(Fix.hub, HUNG_REPO, {"data.bin": b"d" * 4096})
    Fix.nas = faultnas.FaultNAS(Fix.hub, os.path.join(Fix.base, "nas"),
                                os.path.join(Fix.base, "faultfs.sock")).start()
    unittest.addModuleCleanup(stop_nas)


def stop_nas():
    problems = Fix.nas.stop()
    if problems:
        raise AssertionError("stopping faultfs: " + "; ".join(problems))


def remove_base():
    under = [p for p in wfstest.mount_points() if p == Fix.base or p.startswith(Fix.base + "/")]
    if under:
        raise AssertionError("not removing %s: still mounted: %s" % (Fix.base, under))
    shutil.rmtree(Fix.base, ignore_errors=True)


# ------------------------------------------------------------------ threads and their states

def thread_state(pid, tid):
    """The state letter of thread tid of process pid, None if gone."""
    try:
        with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split(" ", 1)[0]


def tid_named(pid, name):
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() == name:
                    return int(tid)
        except OSError:
            pass
    return None


class Call(threading.Thread):
    """fn(*args) on a thread of its own: its native id, and how it ended."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args = fn, args
        self.tid = None
        self.started_ev = threading.Event()
        self.value = self.errno = self.exc = None

    def run(self):
        self.tid = threading.get_native_id()
        self.started_ev.set()
        try:
            self.value = self.fn(*self.args)
        except OSError as e:
            self.errno = e.errno
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            self.exc = repr(e)

    def outcome(self):
        if self.is_alive():
            return "still blocked"
        if self.exc:
            return self.exc
        return errname(self.errno) if self.errno is not None else "%d bytes" % len(self.value)


def mount_dev(mnt):
    """The "major:minor" of the FUSE mount at mnt, from mountinfo (never a stat)."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ")
            if unescape_mount_field(fields[4]) == mnt and " - fuse" in line:
                found = fields[2]
    return found


def abort_connection(dev, mnt):
    """End a stuck daemon's connection (the test's cleanup): umount -f
    (the kernel aborts the connection first), else fusectl's abort file,
    fusectl mounted for it on a directory of our own.  Returns what was done."""
    done = []
    r = subprocess.run(["umount", "-f", mnt], capture_output=True, text=True)
    done.append("umount -f: %s" % (r.stderr.strip() or "ok"))
    major, minor = (int(x) for x in dev.split(":"))
    ctl = tempfile.mkdtemp(prefix="wfs-it-fusectl-")
    try:
        if subprocess.run(["mount", "-t", "fusectl", "none", ctl]).returncode == 0:
            try:
                with open(os.path.join(ctl, str(major << 20 | minor), "abort"), "w") as f:
                    f.write("1")
                done.append("fusectl abort")
            except OSError as e:
                done.append("fusectl abort: %s" % e)
            finally:
                subprocess.run(["umount", ctl])
    finally:
        os.rmdir(ctl)
    return done


# ------------------------------------------------------------------ the test

class SigtermDuringInvalidation(unittest.TestCase):

    def setUp(self):
        Fix.nas.reset()
        n = len([d for d in os.listdir(Fix.base) if d.startswith("mnt")])
        self.local = os.path.join(Fix.base, "local%d" % n)
        self.mnt = os.path.join(Fix.base, "mnt%d" % n)
        os.mkdir(self.mnt)
        self.dev, self.calls, self.fds = None, [], []
        self.mount = wfstest.ForegroundMount(Fix.nas.mnt, self.local, self.mnt,
                                             OPTIONS).start()
        self.addCleanup(self.stop_wfs)
        self.dev = mount_dev(self.mnt)
        self.sock = wfstest.wait_ctl(self.mnt)

    def stop_wfs(self):
        """Whatever the test did: no daemon, no mount, no blocked thread left."""
        problems = []
        if self.mount.proc.poll() is None and self.dev:
            done = abort_connection(self.dev, self.mnt)
            try:
                self.mount.proc.wait(timeout=HANG_WAIT)
            except subprocess.TimeoutExpired:
                problems.append("the daemon is still there after %s" % done)
        Fix.nas.reset()
        for c in self.calls:
            c.join(STEP_WAIT)
            if c.is_alive():
                problems.append("a reader is still blocked")
        for fd in self.fds:
            os.close(fd)
        problems += self.mount.stop()
        self.mount.cleanup()
        if problems:
            raise AssertionError("cleanup: " + "; ".join(problems))

    def log_tail(self):
        return self.mount.log()[-3000:]

    def test_sigterm_exits(self):
        blob = os.path.relpath(os.path.realpath(
            os.path.join(Fix.hub, REPO, "snapshots", Fix.rev, F_NAME)), Fix.hub)
        f_path = os.path.join(self.mnt, blob)
        hung_dir = os.path.join(HUNG_REPO, "snapshots")
        ctl_check(self, ["promote", "--wait", f_path])
        self.assertEqual(state_of(f_path), "local", "F after promote --wait")
        copies = [p for p, st in wfstest.store_files(self.local).items()
                  if st.st_size == len(F_BYTES)]
        self.assertEqual(len(copies), 1, "F's copy in LOCAL_STORE/data: %s" % copies)
        copy = os.path.join(self.local, "data", copies[0])

        # Everything X and Y need but their one request, asked now: the
        # kernel keeps names and attributes (long timeouts)
        os.stat(os.path.join(self.mnt, hung_dir))
        y_fd = os.open(f_path, os.O_RDONLY)
        self.fds.append(y_fd)
        os.fstat(y_fd)
        os.posix_fadvise(y_fd, 0, 0, os.POSIX_FADV_DONTNEED)

        # X holds the only worker: a lookup the NAS does not answer
        Fix.nas.check("faildir %s hang" % hung_dir)
        x = Call(os.stat, os.path.join(self.mnt, hung_dir, "absent"))
        self.calls.append(x)
        x.start()
        Fix.nas.wait_hung(1, timeout=STEP_WAIT)
        t0 = time.monotonic()

        # Y's READ waits in the kernel's queue, its page locked
        y = Call(os.pread, y_fd, 4096, 0)
        self.calls.append(y)
        y.start()
        y.started_ev.wait()
        me = os.getpid()
        self.assertTrue(wfstest.wait_until(lambda: thread_state(me, y.tid) == "D", STEP_WAIT,
                                           step=0.005),
                        "Y (read of F) never blocked: %s" % y.outcome())

        # F demoted: the notice waits on Y's page
        with open(copy, "r+b") as f:
            f.seek(4096)
            f.write(bytes(b ^ 0xFF for b in F_BYTES[4096:8192]))
            os.fsync(f.fileno())
        rc, out, err = run_wfsctl(["--socket", self.sock, "verify", "--full", blob], timeout=60)
        self.assertEqual((rc, "1 demoted" in out), (1, True),
                         "wfsctl verify --full of the corrupt copy: exit %s\nstdout: %s\n"
                         "stderr: %s" % (rc, out, err))
        pid = self.mount.proc.pid
        inval = tid_named(pid, "wfs-inval")
        self.assertIsNotNone(inval, "the daemon has no thread named wfs-inval")
        self.assertTrue(wfstest.wait_until(lambda: thread_state(pid, inval) == "D", STEP_WAIT,
                                           step=0.005),
                        "wfs-inval never blocked on Y's page; log:\n%s" % self.log_tail())

        # SIGTERM while X still holds the worker: Y's READ is never read
        took = time.monotonic() - t0
        self.assertTrue(x.is_alive() and took < NAS_TIMEOUT_MS / 1000,
                        "the steps took %.2f s of the %.1f s X holds the worker for (X: %s): "
                        "too slow to test" % (took, NAS_TIMEOUT_MS / 1000, x.outcome()))
        os.kill(pid, signal.SIGTERM)
        t_term = time.monotonic()

        # the loop ends once X's lookup gives up (nas_timeout): then the
        # NAS may answer again (the gate does not wait for its stuck call)
        self.assertTrue(wfstest.wait_until(lambda: "stopping: " in self.mount.log(), STEP_WAIT),
                        "no 'stopping:' line after SIGTERM; log:\n%s" % self.log_tail())
        Fix.nas.reset()
        try:
            rc = self.mount.proc.wait(timeout=HANG_WAIT)
        except subprocess.TimeoutExpired:
            inval_state = thread_state(pid, inval)
            self.fail("the daemon did not exit within %d s of SIGTERM (wfs-inval in state %s, "
                      "Y: %s); log:\n%s" % (HANG_WAIT, inval_state, y.outcome(),
                                             self.log_tail()))
        took = time.monotonic() - t_term
        self.assertEqual(rc, 0, "the daemon's exit status after SIGTERM; log:\n%s"
                         % self.log_tail())
        self.assertLess(took, EXIT_WAIT, "the daemon took %.1f s to exit after SIGTERM" % took)
        self.assertTrue(faultnas.wait_mounts(lambda: not wfstest.is_mounted(self.mnt), 5),
                        "%s still mounted after the daemon exited" % self.mnt)
        y.join(STEP_WAIT)
        self.assertEqual(y.outcome(), errname(errno.ENOTCONN), "Y's read of F")


if __name__ == "__main__":
    wfstest.main()
