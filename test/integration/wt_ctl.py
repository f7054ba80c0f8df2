"""wfs integration tests: wfsctl and the control socket, the store's files,
and an ext4 image on a loop device."""

import atexit
import json
import os
import shutil
import subprocess
import tempfile

from wt_base import is_mounted, REPO, run_captured, skip_or_fail, wait_until
from wt_hub import errname, Mount


# ---------------------------------------------------------------- promotion / wfsctl

XATTR_STATE = "user.wfs.state"
XATTR_ID = "user.wfs.id"
XATTR_SOCKET = "user.wfs.socket"
CTL_TIMEOUT = 180         # seconds a wfsctl command (e.g. promote --wait) may take


def wfsctl_bin():
    return os.environ.get("WFSCTL_BIN") or os.path.join(REPO, "build", "tools", "wfsctl")


def require_wfsctl():
    p = wfsctl_bin()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        skip_or_fail("wfsctl (WFSCTL_BIN) not found or not executable: " + p)
    reachable(p)  # now, not in a forked child that would leave the copy behind


def without_leak_check(env):
    """`env` with LeakSanitizer off in an AddressSanitizer build (address and
    undefined checks stay on).  The integration tests run wfsctl ~780 times
    a suite, and its exit-time leak scan was ~60 ms of a run's ~85 ms of
    CPU; the unit test `wfsctl` runs every command with leak checks on."""
    env = dict(env)
    if env.get("ASAN_OPTIONS"):
        env["ASAN_OPTIONS"] += ":detect_leaks=0"   # (the last setting wins)
    return env


def run_wfsctl(args, uid=None, timeout=CTL_TIMEOUT):
    """Run wfsctl (as uid/gid `uid` if given).  Returns (rc or None on
    timeout, stdout, stderr)."""
    if uid is not None:
        return run_as_uid([wfsctl_bin()] + list(args), uid, timeout, leak_check=False)
    return run_captured([wfsctl_bin()] + list(args), timeout, cwd="/",
                        env=without_leak_check(os.environ))


# ---------------------------------------------------------------- programs run as another uid
#
# The checkout may sit where other uids cannot enter (a clone in a 0700
# `mktemp -d`).  A program a test runs as another uid is run from a copy in
# a directory every uid can enter, and so are the files a sanitizer build is
# told to use (ASAN/LSAN/UBSAN_OPTIONS suppressions= and log_path=, which
# test/run points into the checkout).

_REACH = {"dir": None, "copies": {}}


def _reach_dir():
    if _REACH["dir"] is None:
        d = tempfile.mkdtemp(prefix="wfs-it-bin-", dir="/tmp")
        os.chmod(d, 0o755)
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(d, ignore_errors=True))
        _REACH["dir"] = d
    return _REACH["dir"]


def reachable(path, mode=0o755):
    """A copy of the file `path` that every uid can reach (made once per
    test process, removed at its exit)."""
    real = os.path.realpath(path)
    copy = _REACH["copies"].get(real)
    if copy is None:
        copy = os.path.join(_reach_dir(), "%d-%s" % (len(_REACH["copies"]), os.path.basename(real)))
        shutil.copyfile(real, copy)
        os.chmod(copy, mode)
        _REACH["copies"][real] = copy
    return copy


def _sanitizer_env(uid):
    """os.environ with the sanitizer files made reachable by `uid`: returns
    (env, [(log directory of the run, directory test/run reads logs from)])."""
    env, logs = dict(os.environ), []
    for var in ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS"):
        if not env.get(var):
            continue
        opts = []
        for opt in env[var].split(":"):
            key, _, val = opt.partition("=")
            if key == "suppressions" and val:
                opt = key + "=" + reachable(val, 0o644)
            elif key == "log_path" and val and val not in ("stdout", "stderr"):
                d = tempfile.mkdtemp(prefix="log-", dir=_reach_dir())
                os.chown(d, uid, uid)
                logs.append((d, os.path.dirname(os.path.abspath(val))))
                opt = key + "=" + os.path.join(d, os.path.basename(val))
            opts.append(opt)
        env[var] = ":".join(opts)
    return env, logs


def run_as_uid(argv, uid, timeout, leak_check=True):
    """Run argv (argv[0] a path to a program) as uid/gid `uid` with no
    supplementary groups, from / and from a copy of the program that `uid`
    can reach; sanitizer logs it writes end up where the caller's options
    said (LeakSanitizer off unless `leak_check`).  Returns (rc or None on
    timeout, stdout, stderr)."""
    env, logs = _sanitizer_env(uid)
    if not leak_check:
        env = without_leak_check(env)
    try:
        return run_captured([reachable(argv[0])] + list(argv[1:]), timeout, cwd="/", env=env,
                            user=uid, group=uid, extra_groups=[])
    finally:
        for tmp, dest in logs:
            for name in os.listdir(tmp):
                shutil.move(os.path.join(tmp, name), os.path.join(dest, name))
            os.rmdir(tmp)


def parse_json_out(text):
    """The last line of `text` that parses as a JSON object, or None."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def ctl_check(tc, args, uid=None, timeout=CTL_TIMEOUT):
    """Run wfsctl, assert it exited 0, return (stdout, stderr)."""
    rc, out, err = run_wfsctl(args, uid=uid, timeout=timeout)
    tc.assertIsNotNone(rc, "wfsctl %s did not finish within %d s" % (" ".join(args), timeout))
    tc.assertEqual(rc, 0, "wfsctl %s exited %s\nstdout: %s\nstderr: %s"
                   % (" ".join(args), rc, out[-3000:], err[-3000:]))
    return out, err


def ctl_json(tc, args, uid=None, timeout=CTL_TIMEOUT):
    """wfsctl --json ARGS: assert exit 0 and a JSON object with ok=true on stdout."""
    out, err = ctl_check(tc, ["--json"] + list(args), uid=uid, timeout=timeout)
    obj = parse_json_out(out)
    tc.assertIsNotNone(obj, "wfsctl --json %s printed no JSON object:\n%s\nstderr: %s"
                       % (" ".join(args), out[-3000:], err[-3000:]))
    tc.assertIs(obj.get("ok"), True, "wfsctl --json %s: %s" % (" ".join(args), obj))
    return obj


def state_of(path):
    """xattr user.wfs.state of a path in the mount (links followed), as str."""
    return os.getxattr(path, XATTR_STATE).decode(errors="replace")


def wait_state(path, want, timeout, step=0.02):
    """Poll the state until it is in `want` (str or collection); return the
    last state seen."""
    if isinstance(want, str):
        want = (want,)
    last = [None]

    def ok():
        try:
            last[0] = state_of(path)
        except OSError as e:
            last[0] = "error " + errname(e.errno)
        return last[0] in want
    wait_until(ok, timeout, step)
    return last[0]


def socket_of(mnt):
    return os.getxattr(mnt, XATTR_SOCKET).decode()


def connect_unix(path, timeout):
    """A connection to the unix socket `path`, its I/O under `timeout` s.
    The connect is made blocking, bounded by SO_SNDTIMEO, as wfsctl makes
    it: with the listener's backlog full (other users' connections not yet
    accepted) it waits for room, where Python's connect under settimeout()
    fails at once with EAGAIN.  Raises OSError."""
    import socket as _socket
    import struct as _struct
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO,
                     _struct.pack("ll", int(timeout), int(timeout % 1 * 1e6)))
        s.connect(path)
    except OSError:
        s.close()
        raise
    s.settimeout(timeout)
    return s


def ctl_raw(sock, data, timeout=20):
    """Send raw bytes on a fresh connection to the control socket and read one
    reply line.  Returns (parsed reply or None, raw bytes received, error
    string or None)."""
    s = None
    got, problem = b"", None
    try:
        s = connect_unix(sock, timeout)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            problem = "send: " + repr(e)  # the daemon may stop reading early; read its reply
        while b"\n" not in got:
            try:
                c = s.recv(65536)
            except ConnectionResetError as e:
                problem = (problem + "; " if problem else "") + "recv: " + repr(e)
                break
            if not c:
                break
            got += c
    except OSError as e:
        problem = (problem + "; " if problem else "") + repr(e)
    finally:
        if s is not None:
            s.close()
    line = got.split(b"\n", 1)[0]
    try:
        obj = json.loads(line) if line else None
    except ValueError:
        obj = None
    return obj, got, problem


def ctl_request(sock, req, timeout=20):
    """One JSON request object -> reply object (None if none)."""
    return ctl_raw(sock, (json.dumps(req) + "\n").encode(), timeout)[0]


def wait_ctl(mnt, timeout=10):
    """Wait until the daemon behind `mnt` answers a request on the socket
    its root names (stats: a status would walk the whole NAS tree, ~20 ms
    of a ThreadSanitizer daemon's CPU for a test hub, at every start).
    Returns the socket path."""
    sock, last = [None], [None]

    def ready():
        try:
            sock[0] = socket_of(mnt)
        except OSError as e:
            last[0] = "getxattr %s: %s" % (XATTR_SOCKET, e)
            return False
        rep = ctl_request(sock[0], {"op": "stats"}, timeout=5)
        last[0] = "stats replied %r" % (rep,)
        return bool(rep and rep.get("ok"))
    if not wait_until(ready, timeout, 0.1):
        raise AssertionError("the daemon at %s does not answer stats on its control socket %s "
                             "within %d s (last: %s; %s)"
                             % (mnt, sock[0], timeout, last[0],
                                "mounted" if is_mounted(mnt) else "NOT mounted"))
    return sock[0]


def setup_with_ctl(fix):
    """For setUpModule: fix.setup() (a fixture made with mount=False), then
    its daemon started and answering on its control socket; the fixture
    torn down if not.  Skips (fails under CI) without mounts or wfsctl.
    Returns the socket path."""
    require_wfsctl()
    fix.setup()
    try:
        fix.mount = Mount(fix.hub, fix.local, fix.mnt, fix.options).start()
        return wait_ctl(fix.mnt)
    except BaseException:
        fix.teardown(raise_problems=False)
        raise


def repo_status(tc, mnt, repo):
    """The repo's entry of `wfsctl --json status` (whole-mount status)."""
    st = ctl_json(tc, ["status", mnt])
    for r in st.get("repos", []):
        if r.get("repo") == repo:
            return r, st
    tc.fail("wfsctl --json status has no repo %s: %s" % (repo, [r.get("repo") for r in st.get("repos", [])]))


def store_files(local, sub="data"):
    """LOCAL_STORE/<sub>: {relative path: os.stat_result} of regular files."""
    out = {}
    top = os.path.join(local, sub)
    for root, dirs, files in os.walk(top):
        for n in files:
            p = os.path.join(root, n)
            try:
                out[os.path.relpath(p, top)] = os.lstat(p)
            except FileNotFoundError:
                pass
    return out


def tmp_entries(local):
    try:
        return sorted(os.listdir(os.path.join(local, "tmp")))
    except FileNotFoundError:
        return []


def sha256_file(path, chunk=1 << 20):
    import hashlib
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def drop_caches():
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        skip_or_fail("cannot write /proc/sys/vm/drop_caches")
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# A directory promote copies data, not what moves on the NAS or is not data:
# refs, .no_exist markers and trees/ file lists stay on the NAS.
NOT_PROMOTED_AREAS = ("refs", ".no_exist", "trees")


def repo_readable(fix, repo):
    """Manifest entries under <repo>/ that read as files through the mount and
    that promoting <repo> copies (blobs and snapshot entries)."""
    return [e for e in fix.readable() if e["path"].startswith(repo + "/")
            and e["path"].split("/")[1] not in NOT_PROMOTED_AREAS]


def unique_real(entries):
    """nas_real -> one entry, for the entries given (two names, one blob)."""
    out = {}
    for e in entries:
        out.setdefault(e["nas_real"], e)
    return out


class LoopFs:
    """An ext4 image on its own loop device, mounted at `mnt` (a NAS with
    its own block device, whose read counter proves what was read)."""

    def __init__(self, img, mnt, size_mib=256):
        self.img, self.mnt, self.size_mib = img, mnt, size_mib
        self.dev = None

    def setup(self):
        with open(self.img, "wb") as f:
            f.truncate(self.size_mib << 20)
        r = subprocess.run(["mkfs.ext4", "-q", "-F", self.img], capture_output=True, text=True)
        if r.returncode != 0:
            skip_or_fail("mkfs.ext4 failed: " + (r.stderr or r.stdout).strip())
        r = subprocess.run(["losetup", "--find", "--show", self.img], capture_output=True, text=True)
        if r.returncode != 0:
            skip_or_fail("losetup failed: " + r.stderr.strip())
        self.dev = r.stdout.strip()
        os.makedirs(self.mnt, exist_ok=True)
        r = subprocess.run(["mount", "-t", "ext4", self.dev, self.mnt], capture_output=True, text=True)
        if r.returncode != 0:
            self.teardown()  # (its caller may not: a setUp that raises has no tearDown)
            skip_or_fail("mount %s failed: %s" % (self.dev, r.stderr.strip()))
        os.chmod(self.mnt, 0o755)
        return self

    def sectors_read(self):
        """Field 3 of /sys/block/loopN/stat: sectors (512 bytes) read."""
        with open("/sys/block/%s/stat" % os.path.basename(self.dev)) as f:
            return int(f.read().split()[2])

    def teardown(self):
        problems = []
        if self.mnt and is_mounted(self.mnt):
            r = subprocess.run(["umount", self.mnt], capture_output=True, text=True)
            if r.returncode != 0:
                problems.append("umount %s: %s (used umount -l)" % (self.mnt, r.stderr.strip()))
                subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        if self.dev:
            r = subprocess.run(["losetup", "-d", self.dev], capture_output=True, text=True)
            if r.returncode != 0:
                problems.append("losetup -d %s: %s" % (self.dev, r.stderr.strip()))
            self.dev = None
        return problems
