"""wfs bench: system helpers shared by bench.py, rigs.py and the figures.

Python standard library only.
"""

import ctypes
import ctypes.util
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


class Skip(Exception):
    """Raised by a measurement that cannot run here (reason in the message)."""


ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def set_enable_uring(value):
    """Write the fuse module's enable_uring parameter (the kernel offers FUSE
    over io_uring only to mounts made, and applies it only to INIT replies
    answered, while it is set).  Returns what it held before, to put back;
    None: this kernel has no such parameter (nothing written)."""
    if not os.path.exists(ENABLE_URING):
        return None
    with open(ENABLE_URING) as f:
        was = f.read().strip()
    with open(ENABLE_URING, "w") as f:
        f.write(value)
    return was


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def fmt(v, digits=None):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if digits is not None:
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    if a >= 1000:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def gib(n):
    return f"{n / GiB:.2f} GiB"


# --------------------------------------------------------------------------
# system state

_own_drops = [0]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    _own_drops[0] += 1


def vmstat(key):
    with open("/proc/vmstat") as f:
        for line in f:
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    return None


def drops_mark():
    """A mark for foreign_drops(): the kernel's drop_caches counters and ours."""
    return (vmstat("drop_pagecache"), vmstat("drop_slab"), _own_drops[0])


def foreign_drops(mark):
    """How many times another process dropped caches since mark (the
    kernel counts every write to /proc/sys/vm/drop_caches in /proc/vmstat;
    ours write 3, counted once in each counter).  None if it cannot tell."""
    now = drops_mark()
    if None in now or None in mark:
        return None
    own = now[2] - mark[2]
    return max(now[0] - mark[0] - own, now[1] - mark[1] - own, 0)


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k == key:
                return int(v.split()[0]) * 1024
    raise KeyError(key)


def mountinfo():
    """List of (mountpoint, fstype, source)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            mp = left.split()[4].replace("\\040", " ")
            r = right.split()
            out.append((mp, r[0], r[1]))
    return out


def fs_of(path):
    path = os.path.realpath(path)
    best = ("/", "?", "?")
    for mp, fstype, src in mountinfo():
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
            best = (mp, fstype, src)
    return best


def is_mounted(path):
    path = os.path.realpath(path)
    return any(mp == path for mp, _, _ in mountinfo())


def mounts_below(path):
    """Mount points at or below path, deepest first."""
    p = os.path.realpath(path)
    found = [mp for mp, _, _ in mountinfo() if mp == p or mp.startswith(p + "/")]
    return sorted(set(found), key=len, reverse=True)


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path):
    """Bytes of `path` resident in the page cache (what fincore reports).

    Uses fincore(1) if present, else mmap+mincore through ctypes.  Returns
    None if it cannot tell (e.g. the file cannot be mmapped)."""
    if shutil.which("fincore"):
        r = subprocess.run(["fincore", "-b", "-n", "-r", "-o", "RES", path],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return int(r.stdout.split()[0])
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            n = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                return None
            return sum(1 for b in vec if b & 1) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def bdi_read_ahead_path(path):
    """/sys/class/bdi/MAJ:MIN/read_ahead_kb of the filesystem holding path."""
    dev = os.stat(path).st_dev
    return f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"


def read_ahead_kb(path):
    try:
        with open(bdi_read_ahead_path(path)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def sys_cpu():
    """Aggregate /proc/stat cpu jiffies: (busy, iowait, total)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    total = sum(v[:8])
    return (user + nice + system + irq + softirq + steal, iowait, total)


def cpu_split(a, b):
    """System-wide fractions of all CPUs between two sys_cpu() samples."""
    dt = (b[2] - a[2]) or 1
    return {"busy": (b[0] - a[0]) / dt, "iowait": (b[1] - a[1]) / dt}


# --------------------------------------------------------------------------
# processes

def proc_ticks(pid):
    """utime+stime of a process in clock ticks (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state); utime = field 14, stime = field 15
    return int(fields[11]) + int(fields[12])


def proc_cpu_s(pid):
    """utime+stime (seconds) of a process, all threads; None if gone."""
    t = proc_ticks(pid)
    return None if t is None else t / CLK_TCK


def proc_status(pid, keys=("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads")):
    """Fields of /proc/PID/status: kB fields in bytes, others as ints."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                v = v.split()
                out[k] = int(v[0]) * (1024 if len(v) > 1 and v[1] == "kB" else 1)
    return out


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def find_daemon(mnt, local=None):
    """pid of the wfs process serving `mnt`: the pid the daemon writes to
    LOCAL_STORE/wfs.lock, else the process whose argv names `mnt`."""
    if local:
        try:
            with open(os.path.join(local, "wfs.lock")) as f:
                pid = int(f.read().split()[0])
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "wfs":
                return pid
        except (OSError, ValueError, IndexError):
            pass
    mnt = os.path.realpath(mnt)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == "wfs" and \
                any(os.path.realpath(a) == mnt for a in argv[1:] if a.startswith("/")):
            found.append(int(d))
    return min(found) if found else None


def run_cmd_timed(cmd):
    """Run cmd (check) and return (seconds, its CPU seconds, stdout)."""
    t0c = os.times()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    t1c = os.times()
    cpu = (t1c.children_user - t0c.children_user) + (t1c.children_system - t0c.children_system)
    return dt, cpu, r.stdout


def run_checked(cmd, what=None, timeout=600):
    """Run cmd; on failure raise RuntimeError with its stderr."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        msg = " ".join((r.stderr or r.stdout).split())
        raise RuntimeError(f"{what or ' '.join(cmd)}: exit {r.returncode}: {msg}")
    return r.stdout


def wait_daemon_exit(pid, timeout=10.0):
    if not pid:
        return True
    deadline = time.perf_counter() + timeout
    while pid_alive(pid):
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_mounted(mnt, proc=None, timeout=15.0):
    deadline = time.perf_counter() + timeout
    while not is_mounted(mnt):
        if proc is not None and proc.poll() is not None:
            return False
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.05)
    return True


def unmount_one(mnt, pid):
    """Unmount mnt (umount, fusermount3 -u, then lazily) and wait for the
    daemon pid (if any) to exit, SIGTERM after 10 s.  True if unmounted."""
    if is_mounted(mnt):
        log(f"unmounting {mnt}")
        for cmd in (["umount", mnt], ["fusermount3", "-u", mnt], ["umount", "-l", mnt]):
            if subprocess.run(cmd, capture_output=True).returncode == 0 and \
                    not is_mounted(mnt):
                break
            time.sleep(1)
    if pid:
        if not wait_daemon_exit(pid, 10.0):
            log(f"daemon {pid} still alive after unmount; SIGTERM")
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            wait_daemon_exit(pid, 5.0)
    return not is_mounted(mnt)


class no_interrupts:
    """with no_interrupts(): SIGINT, SIGTERM and SIGHUP ignored inside (for
    teardown: a half torn down rig is worse than a slow exit)."""
    SIGS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.old = [signal.signal(s, signal.SIG_IGN) for s in self.SIGS]

    def __exit__(self, *exc):
        for s, h in zip(self.SIGS, self.old):
            signal.signal(s, h)
        return False
