"""Shared helpers for the wfs integration tests (python3 stdlib only).

The tests mount the real filesystem with the real daemon and use real system
calls.  Locations:
  WFS_BIN    the daemon       (default: <repo>/build/fs/wfs)
  WFS_MKHUB  fixture generator (default: <repo>/test/mkhub)
  WFSCTL_BIN the control tool  (default: <repo>/build/tools/wfsctl)
When mounting is impossible (no /dev/fuse, not root, a binary missing) the
module is skipped with the reason -- except under CI=true, where it fails.
"""

import atexit
import errno
import json
import os
import pickle
import shutil
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


def is_mounted(path):
    return os.path.realpath(path) in mount_points()


def mount_entry(path):
    path = os.path.realpath(path)
    for line in mount_lines():
        fields = line.split(" ")
        if len(fields) >= 3 and _unescape_mount_field(fields[1]) == path:
            return fields
    return None


# ---------------------------------------------------------------- processes

def _proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rfind(")") + 2:].split(" ", 1)[0]


def pid_alive(pid):
    """True while the process exists and is not a zombie."""
    st = _proc_state(pid)
    return st is not None and st != "Z"


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
            p.wait()
            rc = None
        out.seek(0)
        err.seek(0)
        return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace")


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


def unmount(mnt):
    """umount, falling back to umount -l.  Returns a list of problems."""
    problems = []
    if not is_mounted(mnt):
        return problems
    r = subprocess.run(["umount", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        # a reader may still be finishing; retry briefly before going lazy
        ok = wait_until(lambda: subprocess.run(["umount", mnt], capture_output=True).returncode == 0
                        or not is_mounted(mnt), 3, step=0.2)
        if not ok:
            problems.append("umount %s failed (%s); used umount -l" % (mnt, r.stderr.strip()))
            subprocess.run(["umount", "-l", mnt], capture_output=True)
    if not wait_until(lambda: not is_mounted(mnt), 5):
        problems.append("%s still in /proc/self/mounts after umount" % mnt)
    return problems


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


# ---------------------------------------------------------------- hub + mount

def make_base(prefix):
    """A temp dir under /tmp that uid 65534 can traverse."""
    base = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(base, 0o755)
    return base


def generate_hub(outdir, scale_mib=8, many=200, seed=1):
    """Run test/mkhub; return the parsed manifest."""
    r = subprocess.run([mkhub_bin(), "--scale-mib", str(scale_mib), "--many", str(many),
                        "--seed", str(seed), outdir], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError("mkhub failed (rc %d): %s%s" % (r.returncode, r.stdout, r.stderr))
    with open(os.path.join(outdir, "manifest.json")) as f:
        return json.load(f)


class Mount:
    """One running wfs daemon: wfs [opts] NAS LOCAL MNT."""

    def __init__(self, nas, local, mnt, options=()):
        self.nas, self.local, self.mnt = nas, local, mnt
        self.options = list(options)
        self.pids = []
        self.ready_on_return = False
        self.rc = self.out = self.err = None

    def start(self):
        args = []
        if self.options:
            args += ["-o", ",".join(self.options)]
        args += [self.nas, self.local, self.mnt]
        self.rc, self.out, self.err = run_wfs(args)
        if self.rc != 0:
            raise AssertionError("wfs %s exited %s\nstdout: %s\nstderr: %s"
                                 % (" ".join(args), self.rc, self.out, self.err))
        self.ready_on_return = is_mounted(self.mnt)
        if not wait_until(lambda: is_mounted(self.mnt), 5):
            raise AssertionError("wfs exited 0 but %s is not mounted 5 s later" % self.mnt)
        self.pids = wait_until(lambda: daemon_pids(self.local, self.mnt), 2)
        return self

    def stop(self):
        """Unmount and check the daemon exited.  Returns a list of problems."""
        problems = unmount(self.mnt)
        if not self.pids:
            problems.append("could not identify the daemon process for %s" % self.mnt)
        problems += stop_daemon(self.pids, self.mnt)
        return problems


class HubFixture:
    """Generated hub + mounted wfs, once per test module.

        FIX = HubFixture()
        def setUpModule(): FIX.setup()
        def tearDownModule(): FIX.teardown()

    Attributes: base, gen (mkhub OUTDIR), hub (NAS), local, mnt, manifest,
    entries (list), by_path (dict).
    The mount is a sibling of the NAS hub (OUTDIR/hub, OUTDIR/mnt) so that a
    relative link leaving the hub leaves the mount the same way."""

    def __init__(self, options=("allow_other",), scale_mib=8, many=200, mount=True):
        self.options = options
        self.scale_mib, self.many = scale_mib, many
        self.do_mount = mount
        self.base = self.gen = self.mnt = None
        self.mount = None

    def setup(self):
        require_mount_capability()
        self.base = make_base("wfs-it-")
        try:
            self.gen = os.path.join(self.base, "gen")
            self.manifest = generate_hub(self.gen, self.scale_mib, self.many)
            self.hub = self.manifest["hub"]
            self.outside = self.manifest["outside"]
            self.entries = self.manifest["entries"]
            self.by_path = {e["path"]: e for e in self.entries}
            self.local = os.path.join(self.gen, "local")
            self.mnt = os.path.join(self.gen, "mnt")
            os.mkdir(self.mnt)
            os.chmod(self.gen, 0o755)
            if self.do_mount:
                self.mount = Mount(self.hub, self.local, self.mnt, self.options).start()
        except BaseException:
            self.teardown(raise_problems=False)
            raise

    def teardown(self, raise_problems=True):
        problems = []
        if self.mount is not None:
            problems = self.mount.stop()
            self.mount = None
        elif self.mnt and is_mounted(self.mnt):  # a start that failed half-way
            pids = daemon_pids(self.local, self.mnt)
            problems = unmount(self.mnt) + stop_daemon(pids, self.mnt)
        if self.base and os.path.isdir(self.base):
            if self.mnt and is_mounted(self.mnt):
                problems.append("not removing %s: still mounted" % self.base)
            else:
                shutil.rmtree(self.base, ignore_errors=True)
        if problems and raise_problems:
            raise AssertionError("teardown: " + "; ".join(problems))

    # --- manifest helpers
    def m(self, rel):
        return os.path.join(self.mnt, rel) if rel else self.mnt

    def n(self, rel):
        return os.path.join(self.hub, rel) if rel else self.hub

    def of(self, type_=None, follow=None):
        return [e for e in self.entries
                if (type_ is None or e["type"] == type_)
                and (follow is None or e.get("follow") == follow)]

    def readable(self):
        """Entries that read as a file through the mount: files and links with
        follow=file."""
        return [e for e in self.entries
                if e["type"] == "file" or (e["type"] == "link" and e.get("follow") == "file")]

    def children(self):
        """dir path ('' = root) -> sorted names of its children, from the manifest."""
        kids = {"": []}
        for e in self.entries:
            if e["type"] == "dir":
                kids.setdefault(e["path"], [])
        for e in self.entries:
            parent, name = os.path.split(e["path"])
            kids.setdefault(parent, []).append(name)
        return {k: sorted(v) for k, v in kids.items()}


# ---------------------------------------------------------------- other uid

def in_child(fn, *args, uid=None, gid=None):
    """Run fn(*args) in a forked child (with uid/gid, and no supplementary
    groups, when uid is given): what it did never touches the test runner,
    a signal that kills it included.  Returns ("ok", result),
    ("errno", errno of the OSError it raised), ("exc", repr of any other
    exception) or ("signal", the signal that killed it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            try:
                if uid is not None:
                    os.setgroups([])
                    os.setresgid(gid, gid, gid)
                    os.setresuid(uid, uid, uid)
                payload = ("ok", fn(*args))
            except OSError as e:
                payload = ("errno", e.errno)
            except BaseException as e:  # noqa: BLE001 -- report, never escape the child
                payload = ("exc", repr(e))
            data = pickle.dumps(payload)
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        c = os.read(r, 1 << 20)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    return pickle.loads(b"".join(chunks)) if chunks else ("exc", "child died")


def as_uid(fn, *args, uid=NOBODY, gid=NOBODY):
    """Run fn(*args) in a forked child with uid/gid 65534.  Returns
    (result, None) or (None, errno) (errno of the OSError the call raised)."""
    kind, val = in_child(fn, *args, uid=uid, gid=gid)
    if kind == "ok":
        return val, None
    if kind == "errno":
        return None, val
    raise RuntimeError("child raised %s" % (val,))


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def drop_pages(path):
    """Drop the kernel's cached pages of one file: its next read reaches the
    daemon (or the passthrough backing) again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def errno_of(fn, *args, **kw):
    """Errno of the OSError fn raises, or None if it succeeded."""
    try:
        fn(*args, **kw)
    except OSError as e:
        return e.errno
    return None


def errname(e):
    return "success" if e is None else errno.errorcode.get(e, str(e))


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


def run_wfsctl(args, uid=None, timeout=CTL_TIMEOUT):
    """Run wfsctl (as uid/gid `uid` if given).  Returns (rc or None on
    timeout, stdout, stderr)."""
    if uid is not None:
        return run_as_uid([wfsctl_bin()] + list(args), uid, timeout)
    return run_captured([wfsctl_bin()] + list(args), timeout, cwd="/")


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


def run_as_uid(argv, uid, timeout):
    """Run argv (argv[0] a path to a program) as uid/gid `uid` with no
    supplementary groups, from / and from a copy of the program that `uid`
    can reach; sanitizer logs it writes end up where the caller's options
    said.  Returns (rc or None on timeout, stdout, stderr)."""
    env, logs = _sanitizer_env(uid)
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


def ctl_raw(sock, data, timeout=20):
    """Send raw bytes on a fresh connection to the control socket and read one
    reply line.  Returns (parsed reply or None, raw bytes received, error
    string or None)."""
    import socket as _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.settimeout(timeout)
    got, problem = b"", None
    try:
        s.connect(sock)
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
    """Wait until the daemon behind `mnt` answers a status request on the
    socket its root names.  Returns the socket path."""
    sock = [None]

    def ready():
        try:
            sock[0] = socket_of(mnt)
        except OSError:
            return False
        rep = ctl_request(sock[0], {"op": "status"}, timeout=5)
        return bool(rep and rep.get("ok"))
    if not wait_until(ready, timeout, 0.1):
        raise AssertionError("the daemon at %s does not answer status on its control socket %s "
                             "within %d s" % (mnt, sock[0], timeout))
    return sock[0]


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


def main():
    unittest.main(verbosity=2)


# ---------------------------------------------------------------- passthrough

XATTR_DAEMON_READS = "user.wfs.daemon_reads"   # READ requests the daemon served for the inode
XATTR_PASSTHROUGH = "user.wfs.passthrough"     # opens of the inode the kernel serves itself


def xattr_int(path, name):
    """An integer-valued xattr of a path in the mount."""
    v = os.getxattr(path, name).decode(errors="replace").strip()
    try:
        return int(v)
    except ValueError:
        raise AssertionError("xattr %s of %s is not an integer: %r" % (name, path, v))


def daemon_reads(path):
    return xattr_int(path, XATTR_DAEMON_READS)


def passthrough_opens(path):
    return xattr_int(path, XATTR_PASSTHROUGH)


def kernel_version():
    """(major, minor) of the running kernel."""
    import re
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def kernel_has_fuse_passthrough():
    """FUSE passthrough (FUSE_PASSTHROUGH, backing ids) is in Linux >= 6.9."""
    return kernel_version() >= (6, 9)


def served_bytes(tc, mnt):
    """(local_bytes, nas_bytes) of `wfsctl --json status`'s "served"."""
    st = ctl_json(tc, ["status", mnt])
    s = st.get("served") or {}
    tc.assertIn("local_bytes", s, "wfsctl --json status has no served.local_bytes: %s" % s)
    tc.assertIn("nas_bytes", s, "wfsctl --json status has no served.nas_bytes: %s" % s)
    return s["local_bytes"], s["nas_bytes"]


# ---------------------------------------------------------------- auto-promotion, capacity

def det_bytes(seed, n):
    """n deterministic pseudo-random bytes for `seed` (fast)."""
    import hashlib
    h = hashlib.sha256(str(seed).encode()).digest()
    out, i = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(h + i.to_bytes(8, "little")).digest() * 128
        i += 1
    return bytes(out[:n])


def make_hf_repo(hub, repo, files, commit=None, ref="main", real=()):
    """Write one revision of `repo` under `hub` as huggingface_hub does:
    blobs/<sha256 of content>, snapshots/<commit>/<name> -> ../../blobs/<sha>
    (one more ../ per directory level), refs/<ref> = commit (written
    atomically, as moving a ref on a live NAS must be).  `files` maps names
    in the snapshot to bytes; the names in `real` are real files in the
    snapshot (optional packs).  Returns the commit."""
    import hashlib
    base = os.path.join(hub, repo)
    os.makedirs(os.path.join(base, "blobs"), exist_ok=True)
    if commit is None:
        commit = hashlib.sha1(repr((repo, sorted((k, hashlib.sha256(v).hexdigest())
                                                  for k, v in files.items()))).encode()).hexdigest()
    for name, data in files.items():
        p = os.path.join(base, "snapshots", commit, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if name in real:
            with open(p, "wb") as f:
                f.write(data)
            continue
        sha = hashlib.sha256(data).hexdigest()
        bp = os.path.join(base, "blobs", sha)
        if not os.path.exists(bp):
            with open(bp, "wb") as f:
                f.write(data)
        os.symlink("../" * (name.count("/") + 2) + "blobs/" + sha, p)
    if ref:
        set_hf_ref(hub, repo, ref, commit)
    return commit


def set_hf_ref(hub, repo, ref, commit):
    p = os.path.join(hub, repo, "refs", ref)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p + ".tmp", "w") as f:
        f.write(commit)
    os.rename(p + ".tmp", p)


def store_blocks(local):
    """Bytes of blocks taken by the copies (every regular file under
    LOCAL_STORE/data and LOCAL_STORE/tmp): what store_max bounds."""
    total = 0
    for sub in ("data", "tmp"):
        for root, dirs, files in os.walk(os.path.join(local, sub)):
            for n in files:
                try:
                    total += os.lstat(os.path.join(root, n)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return total


class Sampler:
    """Calls fn() every `step` seconds in a thread until stop(); keeps the
    largest value seen and how many samples were taken."""

    def __init__(self, fn, step=0.005):
        import threading
        self.fn, self.step = fn, step
        self.max, self.n, self.errors = None, 0, []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                v = self.fn()
            except Exception as e:  # noqa: BLE001 -- reported by the test
                self.errors.append(repr(e))
                v = None
            if v is not None and (self.max is None or v > self.max):
                self.max = v
            self.n += 1
            time.sleep(self.step)

    def start(self):
        self._t.start()
        return self

    def stop(self):
        self._stop.set()
        self._t.join(10)
        return self.max


CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)


def next_use_tick(timeout=10):
    """The store stamps each use of a copy with CLOCK_REALTIME_COARSE (its
    LRU order; room for a request is made only from copies used before it),
    a clock that moves a few milliseconds at a time.  Wait until it has moved
    on: whatever the daemon stamps after this is later than every stamp it
    made before the call."""
    t = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
    if not wait_until(lambda: time.clock_gettime_ns(CLOCK_REALTIME_COARSE) > t, timeout, 0.001):
        raise AssertionError("CLOCK_REALTIME_COARSE did not move in %d s" % timeout)


def wait_states(paths, want, timeout, step=0.05):
    """Poll until every path's user.wfs.state is in `want`; returns
    {path: last state} of those that are not."""
    if isinstance(want, str):
        want = (want,)
    last = {}

    def ok():
        last.clear()
        for p in paths:
            try:
                s = state_of(p)
            except OSError as e:
                s = "error " + errname(e.errno)
            if s not in want:
                last[p] = s
        return not last
    wait_until(ok, timeout, step)
    return dict(last)


def blob_pinned(tc, path):
    """Whether the blob behind a mount path is pinned (wfsctl promote
    --dry-run --json reports it without changing anything)."""
    rep = ctl_json(tc, ["promote", "--dry-run", "--force", path])
    blobs = rep.get("blobs") or []
    tc.assertEqual(len(blobs), 1, "dry run of %s: %s" % (path, rep))
    return bool(blobs[0].get("pinned"))


# ---------------------------------------------------------------- operations

def promtool_bin():
    return shutil.which("promtool")


def require_promtool():
    if not promtool_bin():
        skip_or_fail("promtool not found (Debian package prometheus; tools/install-deps installs it)")


def promtool_check(text):
    """`promtool check metrics` on `text`.  Returns (ok, what promtool said)."""
    r = subprocess.run([promtool_bin(), "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).strip()


def prom_samples(text):
    """Prometheus text -> {'name{labels}': float} (the exposition as written)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


CLONE_NEWNS = 0x00020000


def enter_slave_mntns():
    """unshare(CLONE_NEWNS) and make every mount a slave of ours: mounts made
    outside later still arrive here, nothing mounted here leaks out (what a
    container with rslave / HostToContainer propagation sees)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "unshare(CLONE_NEWNS): " + os.strerror(e))
    sh("mount", "--make-rslave", "/")


def sh(*argv, env=None, timeout=60):
    """Run a command; raise AssertionError with its output unless it exits 0.
    Returns stdout."""
    r = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise AssertionError("%s exited %d: %s%s" % (" ".join(argv), r.returncode, r.stdout,
                                                     r.stderr))
    return r.stdout


class MntnsChild:
    """fn(*args) in a forked child living in its own mount namespace (see
    enter_slave_mntns).  start() returns at once; result() waits and gives
    fn's return value, or raises AssertionError with the child's traceback.
    Pipes made before start() are shared with the child (for hand-shakes)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args
        self.pid = None
        self.rfd = None

    def start(self):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(r)
                try:
                    enter_slave_mntns()
                    payload = ("ok", self.fn(*self.args))
                except BaseException:  # noqa: BLE001 -- report, never escape the child
                    import traceback
                    payload = ("exc", traceback.format_exc())
                data = pickle.dumps(payload)
                while data:
                    data = data[os.write(w, data):]
            finally:
                os._exit(0)
        os.close(w)
        self.pid, self.rfd = pid, r
        return self

    def result(self, timeout=120):
        chunks = []
        deadline = time.monotonic() + timeout
        import select
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                os.close(self.rfd)
                raise AssertionError("mount-namespace child did not finish within %d s" % timeout)
            c = os.read(self.rfd, 65536)
            if not c:
                break
            chunks.append(c)
        os.close(self.rfd)
        os.waitpid(self.pid, 0)
        kind, val = pickle.loads(b"".join(chunks)) if chunks else ("exc", "child died")
        if kind != "ok":
            raise AssertionError("in the mount-namespace child:\n" + val)
        return val


def in_mntns(fn, *args, timeout=120):
    return MntnsChild(fn, *args).start().result(timeout)


class ForegroundMount(Mount):
    """wfs -f -o log=stderr,... in the background, its log in a file
    (Mount runs it detached, logging to syslog)."""

    def start(self):
        self.logf = tempfile.NamedTemporaryFile(prefix="wfs-log-", suffix=".txt", delete=False)
        opts = ["log=stderr"] + self.options
        args = [wfs_bin(), "-f", "-o", ",".join(opts), self.nas, self.local, self.mnt]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=self.logf)
        if not wait_until(lambda: is_mounted(self.mnt) or self.proc.poll() is not None, 10):
            self.proc.kill()
        if not is_mounted(self.mnt):
            self.proc.wait()
            raise AssertionError("wfs -f %s: no mount (rc %s); log:\n%s"
                                 % (" ".join(args), self.proc.returncode, self.log()))
        self.logf.close()  # the daemon has its own descriptor
        self.pids = [self.proc.pid]
        return self

    def log(self):
        with open(self.logf.name, errors="replace") as f:
            return f.read()

    def stop(self):
        problems = unmount(self.mnt)
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            problems.append("wfs -f (pid %d) still running %ds after umount"
                            % (self.proc.pid, EXIT_TIMEOUT))
            self.proc.kill()
            self.proc.wait()
        return problems

    def cleanup(self):
        try:
            os.unlink(self.logf.name)
        except OSError:
            pass


def add_big_repo(hub, repo="models--ops--big", size=48 << 20):
    """A repo with one LFS blob of `size` random bytes (named by its SHA-256)
    and a snapshot link to it, written into the NAS hub.  Returns a dict:
    repo, rev, blob and snap (hub-relative paths), sha256, size."""
    import hashlib
    data = os.urandom(size)
    sha = hashlib.sha256(data).hexdigest()
    rev = hashlib.sha1(repo.encode()).hexdigest()
    top = os.path.join(hub, repo)
    os.makedirs(os.path.join(top, "blobs"))
    os.makedirs(os.path.join(top, "refs"))
    os.makedirs(os.path.join(top, "snapshots", rev))
    with open(os.path.join(top, "blobs", sha), "wb") as f:
        f.write(data)
    with open(os.path.join(top, "refs", "main"), "w") as f:
        f.write(rev)
    os.symlink("../../blobs/" + sha, os.path.join(top, "snapshots", rev, "model.safetensors"))
    return {"repo": repo, "rev": rev, "blob": "%s/blobs/%s" % (repo, sha),
            "snap": "%s/snapshots/%s/model.safetensors" % (repo, rev), "sha256": sha, "size": size}
