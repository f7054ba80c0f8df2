"""wfs integration tests: where the binaries are, skipping, mounts and
processes (the daemon found, waited for, stopped)."""

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import unittest


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

NOBODY = 65534
WFS_TIMEOUT = 30          # seconds a foreground-returning `wfs` may take
EXIT_TIMEOUT = 10         # seconds the daemon may take to exit after umount
UMOUNT_TIMEOUT = 20       # seconds an umount may take
KILL_TIMEOUT = 30         # seconds a SIGKILLed child may take to go


def wfs_bin():
    return os.environ.get("WFS_BIN") or os.path.join(REPO, "build", "fs", "wfs")


def mkhub_bin():
    return os.environ.get("WFS_MKHUB") or os.path.join(REPO, "test", "mkhub")


def in_ci():
    return os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason):
    """Skip (locally) or fail (under CI=true): the tests must not be silently
    skipped in CI."""
    if in_ci():
        raise AssertionError("CI=true and the integration tests cannot run: " + reason)
    raise unittest.SkipTest(reason)


def require_mount_capability():
    """Raise SkipTest (or AssertionError under CI) when the tests cannot mount."""
    if not sys.platform.startswith("linux"):
        skip_or_fail("not Linux")
    if not os.path.exists("/dev/fuse"):
        skip_or_fail("/dev/fuse does not exist")
    if os.geteuid() != 0:
        skip_or_fail("not root (euid %d): the tests mount, drop caches and switch uid" % os.geteuid())
    for what, path in (("wfs daemon (WFS_BIN)", wfs_bin()), ("mkhub (WFS_MKHUB)", mkhub_bin())):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            skip_or_fail("%s not found or not executable: %s" % (what, path))


# ---------------------------------------------------------------- mounts

def _unescape_mount_field(s):
    # /proc/self/mounts escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and len(s[i + 1:i + 4]) == 3 and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mount_lines():
    with open("/proc/self/mounts") as f:
        return f.read().splitlines()


def mount_points():
    """List (not set: a path mounted twice appears twice) of mount points."""
    pts = []
    for line in mount_lines():
        fields = line.split(" ")
        if len(fields) >= 2:
            pts.append(_unescape_mount_field(fields[1]))
    return pts


def _mount_path(path):
    """`path` as the mount table names it, without a look at `path` itself:
    its parent resolved, its own name kept.  A stat of a mount point is a
    request to its daemon, which a hung mount never answers."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def set_up_or_undo(set_up, undo):
    """set_up(); if it raises, undo() before the error goes on: unittest
    runs no tearDown(Module) after a setUp(Module) that raised, and what it
    had done (a mount, a machine-wide switch) stayed.  An error of undo()
    is dropped: the one to report is set_up's."""
    try:
        set_up()
    except BaseException:
        try:
            undo()
        except Exception:
            pass
        raise


def is_mounted(path):
    return _mount_path(path) in mount_points()


def mount_entry(path):
    path = _mount_path(path)
    for line in mount_lines():
        fields = line.split(" ")
        if len(fields) >= 3 and _unescape_mount_field(fields[1]) == path:
            return fields
    return None


# ---------------------------------------------------------------- processes

def _stat_fields(path):
    """The fields of a /proc stat file after "PID (COMM)", or None if gone
    (COMM may hold anything: the last ')' ends it)."""
    try:
        with open(path) as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rfind(")") + 2:].split(" ")


def _proc_state(pid):
    """(state letter, number of threads) of a process, or None if gone."""
    fields = _stat_fields("/proc/%d/stat" % pid)
    if fields is None:
        return None
    return fields[0], int(fields[17])   # (fields 3 and 20 of proc(5))


def pid_alive(pid):
    """True while the process exists and is not a zombie.  A leader that
    exited while other threads of it still run (a kill -9 waits for threads
    in the kernel) shows as a zombie, but holds its descriptors and locks
    until the last thread is gone: alive."""
    st = _proc_state(pid)
    return st is not None and (st[0] != "Z" or st[1] > 1)


def pids_with_arg(arg):
    """Like `pgrep -f`, but exact: processes having `arg` as one argv element."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if os.fsencode(arg) in argv and pid_alive(int(name)):
            found.append(int(name))
    return found


def daemon_pids(local, mnt):
    """Pids of the daemon serving `mnt`: from LOCAL_STORE/wfs.lock if it holds
    a pid of a live process, and from the process table (argv contains mnt)."""
    pids = set(pids_with_arg(mnt))
    try:
        with open(os.path.join(local, "wfs.lock")) as f:
            txt = f.read().strip()
        if txt.isdigit() and pid_alive(int(txt)):
            pids.add(int(txt))
    except OSError:
        pass
    return sorted(pids)


def wait_until(pred, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            return v
        time.sleep(step)


def fork_reporting(child):
    """Fork a child that runs child() -> a picklable report, writes it to a
    pipe and exits: it never returns into the test runner.  Returns (pid,
    the pipe's read end); child_report() of what was read gives the report,
    ("exc", "child died") when there is none."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            data = pickle.dumps(child())
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def child_report(chunks):
    return pickle.loads(b"".join(chunks)) if chunks else ("exc", "child died")


def run_wfs(args, timeout=WFS_TIMEOUT):
    """Run the wfs binary, stdout/stderr captured through files (a daemon that
    keeps the caller's pipes open would otherwise hang the test).  Returns
    (returncode or None on timeout, stdout, stderr)."""
    return run_captured([wfs_bin()] + list(args), timeout)


def run_captured(cmd, timeout, **popen_kw):
    """Run `cmd` with no stdin and stdout/stderr in files.  Returns
    (returncode or None on timeout, stdout, stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, **popen_kw)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                p.wait(timeout=KILL_TIMEOUT)
            except subprocess.TimeoutExpired:
                # a caller whose FUSE request a daemon has read and not
                # answered is unkillable until the answer: say so rather
                # than wait with it for ever
                raise AssertionError("%s did not finish within %d s nor die of SIGKILL within "
                                     "%d s (state %s: waiting in the kernel, for a FUSE daemon?)"
                                     % (cmd[0], timeout, KILL_TIMEOUT, _proc_state(p.pid)))
            rc = None
        out.seek(0)
        err.seek(0)
        return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def _all_threads_stopped(pid):
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except FileNotFoundError:
        return True
    for tid in tids:
        fields = _stat_fields("/proc/%d/task/%s/stat" % (pid, tid))
        if fields is not None and fields[0] not in "tT":
            return False
    return True


@contextlib.contextmanager
def daemon_stopped(pids, timeout=30):
    """SIGSTOP each of `pids` and wait until every thread of each shows
    stopped (/proc/PID/task/*/stat); SIGCONT them on leaving.  kill()
    returns before the threads stop: one still running takes the next FUSE
    request off /dev/fuse and may stop before it answers, and the caller of
    a request the daemon has read waits for the answer even through a
    SIGKILL -- a test so stuck never reaches its SIGCONT."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        if not wait_until(lambda: all(_all_threads_stopped(p) for p in pids), timeout, 0.01):
            raise AssertionError("SIGSTOP sent, but threads of %s still run after %d s"
                                 % (pids, timeout))
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def kill_daemon(tc, pids):
    """kill -9 every pid of a daemon and assert that they are gone."""
    tc.assertTrue(pids, "no daemon pid known")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    tc.assertTrue(wait_until(lambda: not any(pid_alive(p) for p in pids), 10),
                  "daemon %s still alive after SIGKILL" % pids)


def drop_dead_mount(tc, mnt):
    """Take off a mount whose daemon was killed (lazily: it answers
    ENOTCONN) and assert it is gone."""
    r = subprocess.run(["fusermount3", "-uz", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    tc.assertTrue(wait_until(lambda: not is_mounted(mnt), 5), "dead mount still there")


def umount_quick(mnt, *flags):
    """umount [flags] MNT without a look at MNT (-c, its name as the mount
    table has it): util-linux's umount stats the path first, and a stat of
    a mount whose daemon hangs waits for good -- a hang regression then
    showed as meson's timeout in teardown, the mount left behind.  Returns
    (returncode or None when it did not end within UMOUNT_TIMEOUT, stderr)."""
    try:
        r = subprocess.run(["umount", "-c"] + list(flags) + [_mount_path(mnt)],
                           capture_output=True, text=True, timeout=UMOUNT_TIMEOUT)
        return r.returncode, r.stderr.strip()
    except subprocess.TimeoutExpired:
        return None, "no answer within %d s" % UMOUNT_TIMEOUT


def unmount(mnt):
    """umount, falling back to umount -l.  Returns a list of problems."""
    problems = []
    if not is_mounted(mnt):
        return problems
    rc, err = umount_quick(mnt)
    if rc != 0:
        # a reader may still be finishing; retry briefly before going lazy
        ok = wait_until(lambda: umount_quick(mnt)[0] == 0 or not is_mounted(mnt), 3, step=0.2)
        if not ok:
            problems.append("umount %s failed (%s); used umount -l" % (mnt, err))
            umount_quick(mnt, "-l")
    if not wait_until(lambda: not is_mounted(mnt), 5):
        problems.append("%s still in /proc/self/mounts after umount" % mnt)
    return problems


def reap_child(proc, what):
    """After its unmount: wait for a child process we started to exit; kill
    it if it has not within EXIT_TIMEOUT. Returns a list of problems."""
    try:
        proc.wait(timeout=EXIT_TIMEOUT)
        return []
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return ["%s (pid %d) still running %d s after its unmount" % (what, proc.pid, EXIT_TIMEOUT)]


def stop_daemon(pids, what):
    """After umount: wait for the daemon(s) to exit; kill them (by pid) if not.
    Returns a list of problems."""
    problems = []
    left = wait_until(lambda: [p for p in pids if pid_alive(p)] == [], EXIT_TIMEOUT)
    if not left:
        alive = [p for p in pids if pid_alive(p)]
        problems.append("%s: daemon pid(s) %s still running %ds after umount"
                        % (what, alive, EXIT_TIMEOUT))
        for p in alive:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return problems
