"""FaultNAS: test/faultfs (a read-only FUSE view of a directory with faults
a test turns on and off) driven from Python: the NAS a wfs test can freeze,
break, slow down or make vanish.

  nas = FaultNAS(src, mnt, ctl).start()   # mounted when it returns
  nas.cmd("hang")                         # every NAS call blocks ...
  nas.wait_hung(1)                        # ... one is blocked now
  nas.cmd("ok")                           # ... and they all go on
  nas.vanish()                            # kill -9: the mount answers ENOTCONN
  nas.restore()                           # umount -l the dead mount, start again
  problems = nas.stop()

The binary is WFS_FAULTFS (default <repo>/build/test/faultfs); without it
the tests skip, or fail under CI=true (wfstest.skip_or_fail).
"""

import errno
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import time

import wfstest

CTL_TIMEOUT = 10       # seconds one control command may take (it is instant)
START_TIMEOUT = 10     # seconds faultfs may take to mount
EXIT_TIMEOUT = 10      # seconds it may take to exit once unmounted


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
    unix socket `ctl`."""

    def __init__(self, src, mnt, ctl):
        self.src, self.mnt, self.ctl = src, mnt, ctl
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
            self.proc = subprocess.Popen([faultfs_bin(), "-f", "--ctl", self.ctl, self.src, self.mnt],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        ok = wait_mounts(lambda: self._mounted_live() or self.proc.poll() is not None,
                         START_TIMEOUT)
        if not (ok and self._mounted_live()):
            self.proc.kill()
            self.proc.wait()
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
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                problems.append("faultfs (pid %d) still running %d s after its unmount"
                                % (self.proc.pid, EXIT_TIMEOUT))
                self.proc.kill()
                self.proc.wait()
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
        """Back to a healthy NAS: no hang or failure, no eio ranges, no latency."""
        for line in ("ok", "clear", "latency 0"):
            self.check(line)

    def state(self):
        r = self.cmd("state")
        try:
            return json.loads(r)
        except ValueError:
            raise AssertionError("faultfs state replied %r" % r)

    def wait_hung(self, n=1, timeout=10):
        """Wait until at least n calls are blocked by `hang`; returns the state."""
        last = {}

        def enough():
            last.update(self.state())
            return last["hung"] >= n
        if not wfstest.wait_until(enough, timeout, step=0.01):
            raise AssertionError("faultfs: %d call(s) hung after %d s, waited for %d: %s"
                                 % (last.get("hung", -1), timeout, n, last))
        return dict(last)
