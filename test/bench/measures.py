"""wfs bench: the figures.  Every figure is a function m_<name>(ctx)
registered in MEASUREMENTS at the end; it adds rows with ctx.pair_row()
(ratio figures: one value per side and pair, the median ratio and its
spread), ctx.row() (single figures) or ctx.alt() (comparison filesystems,
columns of a row).

Pairs: abba() visits the sides of a figure --pairs times, alternating which
side goes first (direct, wfs | wfs, direct | direct, wfs ...; with more sides
every other round runs in reverse), each visit starting from the same state
(caches dropped for cold figures, the same file).  The ratio of a figure is
the median of the per-pair ratios; lo-hi is their range.

Python standard library only.
"""

import hashlib
import json
import mmap
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time

from common import (GiB, MiB, Skip, bdi_read_ahead_path, cpu_split, drop_caches, drops_mark,
                    find_daemon, fmt, foreign_drops, is_mounted, log, median, meminfo,
                    proc_cpu_s, proc_status, proc_ticks, read_ahead_kb, resident_bytes,
                    run_cmd_timed, sys_cpu, unmount_one, wait_daemon_exit, wait_mounted,
                    CLK_TCK)


# --------------------------------------------------------------------------
# goals (issue 12 and, for the rows outside its table, the passthrough issue)

# key: (op, value, applies to "ratio" or "wfs", wording)
GOALS = {
    "nas.seq.cold": (">=", 0.90, "ratio"),
    "nas.seq.warm": (">=", 0.90, "ratio"),
    "nas.mmap.cold": (">=", 0.90, "ratio"),
    "nas.rand.cold": (">=", 0.90, "ratio"),
    "nas.rand.warm": (">=", 0.90, "ratio"),
    "walk.cold": ("<=", 1.50, "ratio"),
    "walk.warm": ("<=", 1.10, "ratio"),
    "pagecache": ("<=", 1.05, "wfs"),
    "local.seq.cold": (">=", 0.97, "ratio"),
    "local.seq.warm": (">=", 0.97, "ratio"),
    "local.mmap.cold": (">=", 0.95, "ratio"),
    "local.rand.cold": (">=", 0.90, "ratio"),
    "local.rand.warm": (">=", 0.90, "ratio"),
    "part.seq.cold": (">=", 0.90, "ratio"),
    "part.seq.warm": (">=", 0.90, "ratio"),
    "promote.blob": (">=", 0.80, "ratio"),
    "promote.rev": (">=", 0.70, "ratio"),
    "startup.cold": ("<=", 1.0, "wfs"),
    "startup.warm": ("<=", 1.0, "wfs"),
    "memory.rss": ("<=", 64.0, "wfs"),
    "memory.idle": ("<=", 0.05, "wfs"),
}


def goal_text(key):
    g = GOALS.get(key)
    if not g:
        return ""
    op, v, what = g
    return f"{op} {v:g}" + ("x" if what == "ratio" else "")


def goal_met(row):
    g = GOALS.get(row.get("key"))
    if not g:
        return None
    op, v, what = g
    x = row.get(what)
    if x is None:
        return None
    return x >= v if op == ">=" else x <= v


# --------------------------------------------------------------------------
# I/O primitives (the same code path for every side)

def seq_read(path, bs=MiB):
    """Read the whole file with bs-sized preads into one preallocated buffer."""
    buf = bytearray(bs)
    mv = [buf]
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        t0 = time.perf_counter()
        while True:
            n = os.preadv(fd, mv, off)
            if n <= 0:
                break
            off += n
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return off, dt


def seq_read_range(path, off, length, bs=MiB):
    """Bytes [off, off+length) with bs-sized preads (the last one shorter)
    into one preallocated buffer.  Returns (bytes read, seconds)."""
    buf = bytearray(bs)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, end = off, off + length
        t0 = time.perf_counter()
        while pos < end:
            n = os.preadv(fd, [mv[:min(bs, end - pos)]], pos)
            if n <= 0:
                break
            pos += n
        dt = time.perf_counter() - t0
    finally:
        mv.release()
        os.close(fd)
    return pos - off, dt


def mmap_read(path, chunk=MiB):
    """mmap the file and copy every byte out in chunk-sized memcpys (touches
    every page, like a loader copying tensors out of a safetensors mmap)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        t0 = time.perf_counter()
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            mv = memoryview(mm)
            buf = bytearray(chunk)
            off = 0
            while off < size:
                n = min(chunk, size - off)
                buf[:n] = mv[off:off + n]
                off += n
            mv.release()
        finally:
            mm.close()
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return size, dt


def rand_read(path, offsets, bs=4096):
    buf = bytearray(bs)
    mv = [buf]
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        for off in offsets:
            if os.preadv(fd, mv, off) != bs:
                raise IOError(f"short read at {off} in {path}")
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    return len(offsets), dt


def tree_walk(root):
    """find + lstat: every entry below root, lstat each, recurse into dirs
    (never follows symlinks).  Returns (entries, seconds)."""
    t0 = time.perf_counter()
    n = 0
    stack = [root]
    lstat = os.lstat
    isdir = stat.S_ISDIR
    while stack:
        d = stack.pop()
        for e in os.scandir(d):
            p = e.path
            st = lstat(p)
            n += 1
            if isdir(st.st_mode):
                stack.append(p)
    return n, time.perf_counter() - t0


_SHA_BUF = []


def sha256_rate(threads, per_thread=GiB):
    """MB/s of SHA-256 (hashlib, i.e. OpenSSL's, as the daemon's libcrypto)
    over a 64 MiB in-memory buffer: `threads` threads hash per_thread bytes
    each at once (hashlib drops the GIL while hashing)."""
    if not _SHA_BUF:
        _SHA_BUF.append(random.Random(7).randbytes(64 * MiB))
    buf = _SHA_BUF[0]
    reps = max(1, per_thread // len(buf))

    def work():
        h = hashlib.sha256()
        for _ in range(reps):
            h.update(buf)
        h.digest()

    ts = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    return threads * reps * len(buf) / dt / 1e6


def ncpu():
    return len(os.sched_getaffinity(0))


# --------------------------------------------------------------------------
# context, pairs and rows

class Ctx:
    """What the figures of one rig share: the rig, its fixture and mount,
    and the rows made."""

    def __init__(self, args, rig=None, workdir=None):
        self.args = args
        self.rig = rig
        self.workdir = workdir or (rig.dir if rig else None)
        self.rows = []
        self.errors = []
        self.fixture = None
        self.hub = None
        self.local = None
        self.mnt = None
        self.manifest = None
        self.big = None         # {"path" (mount-relative), "nas_real", "size"}
        self.shards = None      # the revision of rigs.add_shards_repo
        self.daemon_pid = None
        self.read_ahead = None
        self.extra_mounts = []  # [{"mnt", "local"} (wfs) or {"mnt", "proc"} (bindfs)
        #                         or {"mnt"} (overlayfs)] mounted by a measurement
        self.alt_names = []     # comparison filesystems with columns in the table
        self.compare_info = None

    def big_path(self, side):
        return os.path.join(self.hub, self.big["nas_real"]) if side == "direct" \
            else os.path.join(self.mnt, self.big["path"])

    def root(self, side):
        return self.hub if side == "direct" else self.mnt

    def daemon_cpu(self):
        return proc_cpu_s(self.daemon_pid) if self.daemon_pid else None

    def timed(self, side, fn):
        """fn() and the daemon CPU seconds it cost (side wfs only, else None)."""
        c0 = self.daemon_cpu() if side == "wfs" else None
        r = fn()
        c1 = self.daemon_cpu() if side == "wfs" else None
        return r, (c1 - c0) if None not in (c0, c1) else None

    def row(self, key, metric, unit, direct, wfs, kind, note="", extra=None):
        """A single figure.  kind: 'rate' (higher better, ratio wfs/direct),
        'time' (lower better, ratio = time wfs/direct), 'frac' (ratio
        wfs/direct), 'info' (no ratio)."""
        ratio = None
        if kind != "info" and direct not in (None, 0) and wfs is not None:
            ratio = wfs / direct
        r = {"key": key, "metric": metric, "unit": unit, "direct": direct, "wfs": wfs,
             "ratio": ratio, "lo": None, "hi": None, "pairs": None, "kind": kind,
             "note": note, "goal": goal_text(key)}
        if extra:
            r.update(extra)
        r["met"] = goal_met(r)
        self.rows.append(r)
        log(f"  {metric}: direct={fmt(direct)} wfs={fmt(wfs)} ratio={fmt(ratio, 3)} {note}")
        return r

    def pair_row(self, key, metric, unit, kind, base, vals, cpu=None, note="", extra=None,
                 res=None):
        """A figure measured in pairs: base[i] and vals[i] from pair i.
        direct/wfs = medians, ratio = median of vals[i]/base[i], lo-hi their
        range, daemon_cpu_s = median of cpu[i].  res: the Rounds measured
        (its redone / disturbed rounds are noted)."""
        if res is not None and res.note():
            note = (note + "; " if note else "") + res.note()
        ratios = [v / b for b, v in zip(base, vals) if b and v is not None]
        r = {"key": key, "metric": metric, "unit": unit, "kind": kind,
             "direct": median(base), "wfs": median(vals), "ratio": median(ratios),
             "lo": min(ratios) if ratios else None, "hi": max(ratios) if ratios else None,
             "pairs": len(ratios), "ratios": ratios, "values": {"direct": base, "wfs": vals},
             "daemon_cpu_s": median(cpu) if cpu else None, "note": note,
             "goal": goal_text(key)}
        if extra:
            r.update(extra)
        r["met"] = goal_met(r)
        self.rows.append(r)
        log(f"  {metric}: direct={fmt(r['direct'])} wfs={fmt(r['wfs'])} "
            f"ratio={fmt(r['ratio'], 3)} ({fmt(r['lo'], 3)}-{fmt(r['hi'], 3)}, "
            f"{len(ratios)} pairs) {note}")
        return r

    def alt(self, key, metric, unit, kind, name, base, vals, note=""):
        """Comparison figures: a filesystem `name` and direct measured in the
        same pairs, attached to the row of `key` (made without wfs figures if
        there is none)."""
        r = next((x for x in self.rows if x["key"] == key), None)
        if r is None:
            r = self.row(key, metric, unit, median(base), None, kind, note)
        elif note and f"compare rounds: {note}" not in r["note"]:
            r["note"] = (r["note"] + "; " if r["note"] else "") + f"compare rounds: {note}"
        ratios = [v / b for b, v in zip(base, vals) if b and v is not None]
        if name not in self.alt_names:
            self.alt_names.append(name)
        r.setdefault("alt", {})[name] = {
            "value": median(vals), "direct": median(base), "ratio": median(ratios),
            "lo": min(ratios) if ratios else None, "hi": max(ratios) if ratios else None,
            "ratios": ratios}
        log(f"  {metric}: {name}={fmt(median(vals))} ratio={fmt(median(ratios), 3)}")


class Rounds(dict):
    """{side: [dict per round]}, and how many rounds were redone / kept
    though disturbed."""
    redone = 0
    disturbed = 0

    def note(self):
        out = []
        if self.redone:
            out.append(f"{self.redone} round(s) redone: another process dropped caches "
                       "during them")
        if self.disturbed:
            out.append(f"{self.disturbed} round(s) kept though another process dropped "
                       "caches during them (--redo exhausted)")
        return "; ".join(out)


def abba(ctx, sides, visit, n=None):
    """Visit every side n (--pairs) times; round i in the order of `sides`
    when i is even, reversed when odd (two sides: A B, B A, A B, ...).
    visit(side) -> dict of figures.  A round during which another process
    dropped the caches (its cold/warm state is then not what the visit set
    up) is measured again, at most --redo times a figure.  Returns
    Rounds {side: [dict per round]}."""
    n = n or ctx.args.pairs
    sides = tuple(sides)
    out = Rounds({s: [] for s in sides})
    i = 0
    while i < n:
        mark = drops_mark()
        got = {}
        for s in (sides if i % 2 == 0 else sides[::-1]):
            got[s] = visit(s)
        foreign = foreign_drops(mark)
        if foreign:
            if out.redone < ctx.args.redo:
                out.redone += 1
                log(f"  round {i + 1}: another process dropped caches {foreign} time(s) "
                    "during it: measuring it again")
                continue
            out.disturbed += 1
        for s in sides:
            out[s].append(got[s])
        i += 1
    return out


def col(res, side, k):
    return [v.get(k) for v in res[side]]


def gib_s(size):
    return f"{size / GiB:.2f} GiB"


# --------------------------------------------------------------------------
# read figures: visits

def seq_visit(ctx, paths, size):
    """Caches dropped, one cold sequential read, one warm one."""
    def visit(side):
        p = paths[side]
        drop_caches()
        out = {}
        for k in ("cold", "warm"):
            if k == "warm" and side == "direct":
                # what the cold read left cached (someone else dropping
                # caches, or memory pressure, would make "warm" a lie); not
                # asked of FUSE sides: a FUSE open without keep_cache drops
                # the file's cache
                rb = resident_bytes(p)
                out["resident"] = None if rb is None else rb / size
            (n, dt), dc = ctx.timed(side, lambda: seq_read(p))
            if n != size:
                raise IOError(f"{side}: read {n} bytes of {p}, expected {size}")
            out[k], out["cpu_" + k] = n / dt / 1e6, dc
        return out
    return visit


def warm_note(res, sides):
    """A note when a warm seq read did not find the whole file cached."""
    low = [(s, r) for s in sides for r in col(res, s, "resident") if r is not None and r < 0.99]
    if not low:
        return ""
    s, r = min(low, key=lambda x: x[1])
    return (f"WARM NOT WARM: {len(low)} warm read(s) found less than the whole file cached "
            f"(least: {s} {r * 100:.0f}%)")


def mmap_visit(ctx, paths):
    def visit(side):
        drop_caches()
        (n, dt), dc = ctx.timed(side, lambda: mmap_read(paths[side]))
        return {"cold": n / dt / 1e6, "cpu_cold": dc}
    return visit


def rand_offsets(ctx, size):
    rng = random.Random(ctx.args.seed)
    nblk = size // 4096
    return [rng.randrange(nblk) * 4096 for _ in range(ctx.args.random_count)]


def rand_visit(ctx, paths, offs):
    """4 KiB random preads at the same offsets for every side; cold, warm."""
    def visit(side):
        p = paths[side]
        drop_caches()
        out = {}
        for k in ("cold", "warm"):
            (n, dt), dc = ctx.timed(side, lambda: rand_read(p, offs))
            out[k], out["cpu_" + k] = n / dt, dc
        return out
    return visit


def walk_visit(ctx, roots):
    def visit(side):
        drop_caches()
        out = {}
        for k in ("cold", "warm", "again"):
            (n, dt), dc = ctx.timed(side, lambda: tree_walk(roots[side]))
            out[k], out["cpu_" + k], out["n"] = dt, dc, n
        return out
    return visit


def read_rows(ctx, paths, size, pre, label, which=("seq", "mmap", "rand")):
    """The seq / mmap / rand figures over paths {"direct", "wfs"}, as rows
    with keys pre.seq.cold ... and metrics label + name."""
    offs = rand_offsets(ctx, size)
    g = gib_s(size)
    if "seq" in which:
        res = abba(ctx, ("direct", "wfs"), seq_visit(ctx, paths, size))
        for k in ("cold", "warm"):
            ctx.pair_row(f"{pre}.seq.{k}", f"{label}seq 1 MiB {k} ({g})", "MB/s", "rate",
                         col(res, "direct", k), col(res, "wfs", k), col(res, "wfs", "cpu_" + k),
                         warm_note(res, ("direct", "wfs")) if k == "warm" else "", res=res)
    if "mmap" in which:
        res = abba(ctx, ("direct", "wfs"), mmap_visit(ctx, paths))
        ctx.pair_row(f"{pre}.mmap.cold", f"{label}mmap cold (every page)", "MB/s", "rate",
                     col(res, "direct", "cold"), col(res, "wfs", "cold"),
                     col(res, "wfs", "cpu_cold"), res=res)
    if "rand" in which:
        res = abba(ctx, ("direct", "wfs"), rand_visit(ctx, paths, offs))
        for k in ("cold", "warm"):
            ctx.pair_row(f"{pre}.rand.{k}", f"{label}4 KiB random {k} ({len(offs)} reads)",
                         "IOPS", "rate", col(res, "direct", k), col(res, "wfs", k),
                         col(res, "wfs", "cpu_" + k), res=res)


def nas_paths(ctx):
    return {s: ctx.big_path(s) for s in ("direct", "wfs")}


def m_seq(ctx):
    """Sequential 1 MiB reads of the largest shard (NAS-served), cold then warm."""
    read_rows(ctx, nas_paths(ctx), ctx.big["size"], "nas", "NAS: ", ("seq",))


def m_mmap(ctx):
    """mmap the largest shard (NAS-served) and touch every page, cold."""
    read_rows(ctx, nas_paths(ctx), ctx.big["size"], "nas", "NAS: ", ("mmap",))


def m_rand(ctx):
    """4 KiB random aligned preads in the largest shard (NAS-served)."""
    read_rows(ctx, nas_paths(ctx), ctx.big["size"], "nas", "NAS: ", ("rand",))


def pin_daemon(pid, cpus):
    """Every thread of the daemon onto the CPU set @cpus (threads it
    starts later inherit their creator's mask)."""
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(t), cpus)
        except ProcessLookupError:
            pass


def m_walk(ctx):
    """find + lstat over the whole tree, cold (caches dropped) then warm."""
    roots = {s: ctx.root(s) for s in ("direct", "wfs")}
    mask = os.sched_getaffinity(0)
    if ctx.args.walk_cpus:
        r, d = (int(x) for x in ctx.args.walk_cpus.split(","))
        log(f"  walk: walker on CPU {r}, daemon on CPU {d}")
        pin_daemon(ctx.daemon_pid, {d})
        os.sched_setaffinity(0, {r})
    try:
        res = abba(ctx, ("direct", "wfs"), walk_visit(ctx, roots))
    finally:
        os.sched_setaffinity(0, mask)
        if ctx.args.walk_cpus:
            pin_daemon(ctx.daemon_pid, mask)
    nd, nw = res["direct"][-1]["n"], res["wfs"][-1]["n"]
    note = "" if nd == nw else f"ENTRY COUNT DIFFERS direct={nd} wfs={nw}"
    # "again": a third walk.  The first listing of a directory read from
    # the daemon leaves its atime stale in the kernel (on a writable mount),
    # so the second walk asks for each directory's attributes once; the
    # third shows what every later walk costs.
    for k, what in (("cold", "cold"), ("warm", "warm"), ("again", "warm, third walk")):
        ctx.pair_row(f"walk.{k}", f"walk find+lstat {what} ({nd} entries)", "s", "time",
                     col(res, "direct", k), col(res, "wfs", k), col(res, "wfs", "cpu_" + k),
                     note, extra={"entries": {"direct": nd, "wfs": nw}}, res=res)


def pagecache_measure(paths, size, nas_path):
    """Page-cache growth (MemInfo Cached) from one cold sequential read of
    each side's path, as a fraction of the file size, and what is resident
    afterwards of the NAS file and of the file read."""
    res = {}
    for side, p in paths.items():
        drop_caches()
        time.sleep(0.5)
        before = meminfo("Cached")
        seq_read(p)
        after = meminfo("Cached")
        nas_res = resident_bytes(nas_path)
        mnt_res = None
        if p != nas_path:
            try:
                mnt_res = resident_bytes(p)
            except OSError:
                mnt_res = None
        res[side] = {"growth": (after - before) / size,
                     "nas_resident": None if nas_res is None else nas_res / size,
                     "mnt_resident": None if mnt_res is None else mnt_res / size}
    return res


PAGECACHE_METRIC = "page cache growth / file size (one cold read)"


def m_pagecache(ctx):
    """Page-cache growth from one cold sequential read, as a fraction of the
    file size, and what stays resident of the NAS file after a mount read
    (one read a side: no pairs)."""
    res = pagecache_measure(nas_paths(ctx), ctx.big["size"], ctx.big_path("direct"))
    ctx.row("pagecache", PAGECACHE_METRIC, "x", res["direct"]["growth"], res["wfs"]["growth"],
            "frac", "goal on the wfs figure: one copy (2.0 = two)")
    ctx.row("pagecache.nas", "NAS file resident after a mount read / size", "x",
            res["direct"]["nas_resident"], res["wfs"]["nas_resident"], "info",
            "ideal wfs ~0 (fincore of the NAS file)")


# ---- promotion: wfsctl helpers and the figures that need it ---------------

def wfsctl(ctx, *args, check=True, timeout=3600):
    """Run `wfsctl --json ARGS...`; returns (rc, parsed JSON reply or None,
    stderr).  With check, a non-zero exit or an {"ok": false} reply raises."""
    cmd = [ctx.args.wfsctl, "--json"] + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    reply = None
    out = r.stdout.strip()
    if out:
        try:
            reply = json.loads(out)
        except ValueError:
            try:
                reply = json.loads(out.splitlines()[-1])
            except ValueError:
                reply = None
    if check and (r.returncode != 0 or (reply is not None and reply.get("ok") is False)):
        msg = (reply or {}).get("error") or r.stderr.strip() or out
        raise RuntimeError(f"{' '.join(cmd[1:])}: exit {r.returncode}: {msg}")
    return r.returncode, reply, r.stderr


def wfs_state(path):
    """xattr user.wfs.state of a file in the mount (follows links)."""
    return os.getxattr(path, "user.wfs.state").decode(errors="replace").rstrip("\0")


def expect_state(path, want, after):
    """The file's user.wfs.state must be `want` now (after `after`): else the
    figure would measure something else."""
    st = wfs_state(path)
    if st != want:
        raise RuntimeError(f"{path}: state {st} after {after}, expected {want}")


def wfs_xattr_int(path, name):
    """An integer xattr of a file in the mount (None if the daemon has none)."""
    try:
        return int(os.getxattr(path, name).decode().rstrip("\0"))
    except (OSError, ValueError):
        return None


def passthrough_opens(path):
    """user.wfs.passthrough while the file is open: > 0 when the kernel reads
    the local copy itself (FUSE passthrough), 0 when reads go to the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)
        return wfs_xattr_int(path, "user.wfs.passthrough")
    finally:
        os.close(fd)


def evict(ctx, path, files=None):
    """wfsctl evict --force PATH; then PATH (or each of files) must be nas."""
    wfsctl(ctx, "evict", "--force", path)
    for f in files or [path]:
        st = wfs_state(f)
        if st != "nas":
            raise RuntimeError(f"after wfsctl evict --force {path}: {f} is {st}, expected nas")


def ensure_nas(ctx, path):
    if wfs_state(path) != "nas":
        log(f"  {path} is {wfs_state(path)}; evicting first")
        evict(ctx, path)


def promote_tree(ctx, mnt, rel, timeout=1800):
    """Promote every blob under mnt/rel and wait until all are local.  Uses
    `wfsctl promote --wait`; if that fails (e.g. a --wait progress request
    over the daemon's 64 KiB limit for ~400+ blobs), falls back to polling
    `wfsctl status`.  Returns (seconds, note or "")."""
    path = os.path.join(mnt, rel)
    repo = rel.split("/", 1)[0]
    t0 = time.perf_counter()
    rc, reply, err = wfsctl(ctx, "promote", "--wait", path, check=False, timeout=timeout)
    note = ""
    if rc != 0:
        first = err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
        log(f"  `wfsctl promote --wait {rel}` failed: {first}; waiting by polling status")
        note = "promote --wait FAILED"
        if "64 KiB" in first:
            note += " (progress request > 64 KiB)"
        note += "; polled status instead"
        if rc != 0 and (reply is None or reply.get("ok") is not True):
            # the queueing may not have happened: make sure it did
            wfsctl(ctx, "promote", path, check=False)
    deadline = t0 + timeout
    while True:
        _, st, _ = wfsctl(ctx, "status", path)
        r = next((x for x in st.get("repos", []) if x.get("repo") == repo), None)
        if r is None:
            raise RuntimeError(f"wfsctl status {path}: repo {repo} not listed")
        states = r.get("states", {})
        bad = {k: v for k, v in states.items() if k in ("failed", "mismatch", "nas")}
        busy = {k: v for k, v in states.items() if k in ("queued", "copying", "verifying")}
        if not busy:
            if bad:
                flagged = st.get("flagged", [])[:3]
                raise RuntimeError(f"promote {rel}: states {states}; flagged {flagged}")
            break
        if time.perf_counter() > deadline:
            raise RuntimeError(f"promote {rel}: still {states} after {timeout} s")
        time.sleep(0.05)
    return time.perf_counter() - t0, note


def local_copy_path(ctx, size):
    """The one file in LOCAL_STORE/data of this size (the big blob's copy)."""
    found = []
    for dirpath, _, names in os.walk(os.path.join(ctx.local, "data")):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.lstat(p).st_size == size:
                found.append(p)
    if len(found) != 1:
        raise RuntimeError(f"expected one file of {size} bytes under {ctx.local}/data, "
                           f"found {len(found)}: {found[:3]}")
    return found[0]


def big_sha256(ctx):
    for e in ctx.manifest["entries"]:
        if e["path"] == ctx.big["path"]:
            return e.get("sha256")
    return None



def promote_visit(ctx, mp, size, done_check, files):
    """The wfs side of a promotion figure: caches dropped, `wfsctl promote
    --wait MP` timed, the copies checked (done_check), then evicted
    (untimed).  Returns {"rate" MB/s, "cpu" daemon s, "busy"/"iowait"}."""
    drop_caches()
    c0, s0 = ctx.daemon_cpu(), sys_cpu()
    t0 = time.perf_counter()
    wfsctl(ctx, "promote", "--wait", mp)
    dt = time.perf_counter() - t0
    c1, s1 = ctx.daemon_cpu(), sys_cpu()
    done_check()
    evict(ctx, mp, files)
    split = cpu_split(s0, s1)
    cpu = (c1 - c0) if None not in (c0, c1) else None
    log(f"  promote --wait: {dt:.2f} s, {size / dt / 1e6:.0f} MB/s, daemon CPU {fmt(cpu, 2)} s, "
        f"all CPUs busy {split['busy'] * 100:.0f}% iowait {split['iowait'] * 100:.0f}%")
    return {"rate": size / dt / 1e6, "cpu": cpu, "busy": split["busy"],
            "iowait": split["iowait"]}


def cp_visit(src, dst, size, recursive=False):
    """Caches dropped, `cp SRC DST` (-rL for a directory: the blobs its links
    name) then `sync`, timed; DST removed after (untimed)."""
    drop_caches()
    t_cp, _, _ = run_cmd_timed(["cp", "-rL", src, dst] if recursive else ["cp", src, dst])
    t_sync, _, _ = run_cmd_timed(["sync"])
    if recursive:
        shutil.rmtree(dst)
    else:
        os.unlink(dst)
    os.sync()
    log(f"  cp {t_cp:.2f} s, cp + sync {t_cp + t_sync:.2f} s")
    return {"cp": size / t_cp / 1e6, "cpsync": size / (t_cp + t_sync) / 1e6}


def cp_dir(ctx, name, size):
    d = os.path.join(ctx.rig.store_root, name)
    os.makedirs(d, exist_ok=True)
    if os.stat(d).st_dev != os.stat(ctx.local).st_dev:
        log(f"  NOTE: {d} is not on LOCAL_STORE's filesystem")
    sv = os.statvfs(d)
    if sv.f_bavail * sv.f_frsize < size + (256 << 20):
        raise Skip(f"not enough free space in {d} for a copy of {size} bytes")
    return d


def promote_rows(ctx, key, what, size, res, sha_label, cp_label):
    cpu = col(res, "wfs", "cpu")
    busy = median(col(res, "wfs", "busy"))
    iow = median(col(res, "wfs", "iowait"))
    main = ctx.pair_row(key, f"promote --wait {what} vs {sha_label}", "MB/s", "rate",
                        col(res, "sha256", "rate"), col(res, "wfs", "rate"), cpu,
                        f"direct = {sha_label} (hashlib over memory); while promoting all "
                        f"CPUs {busy * 100:.0f}% busy, {iow * 100:.0f}% iowait",
                        extra={"busy": busy, "iowait": iow}, res=res)
    if "cp" in res:
        for k, lab in (("cp", cp_label), ("cpsync", cp_label + " + sync")):
            if res["cp"][0].get(k) is None:
                continue
            ctx.pair_row(f"{key}.{k}", f"promote --wait {what} vs {lab}", "MB/s", "rate",
                         col(res, "cp", k), col(res, "wfs", "rate"), cpu,
                         f"direct = {lab}, caches dropped; no goal", res=res)
    return main


def m_promote(ctx):
    """Promotion of the big shard with all verification (`wfsctl promote
    --wait`: caches dropped, the copy read, fsynced, re-read with O_DIRECT,
    SHA-256 of the content address) against the SHA-256 rate of one core in
    the same pairs (goal >= 0.8x), and against cp of the same NAS file into
    LOCAL_STORE's filesystem, then sync (no goal).  The copy is evicted after
    each promotion, so later figures see the NAS state."""
    size = ctx.big["size"]
    nas, mp = ctx.big_path("direct"), ctx.big_path("wfs")
    dst = os.path.join(cp_dir(ctx, "cp", size), "copy")
    ensure_nas(ctx, mp)
    # guest caches are dropped before every side, but a VM's host may cache
    # its disk too: read the NAS file once, untimed, so that every side
    # starts from the same host state
    seq_read(nas)

    def done():
        st = wfs_state(mp)
        if st != "local":
            raise RuntimeError(f"after promote --wait: state {st}, expected local")

    def visit(side):
        if side == "sha256":
            return {"rate": sha256_rate(1)}
        if side == "cp":
            return cp_visit(nas, dst, size)
        return promote_visit(ctx, mp, size, done, [mp])

    try:
        res = abba(ctx, ("sha256", "cp", "wfs"), visit)
    finally:
        if os.path.exists(dst):
            os.unlink(dst)
        try:
            if wfs_state(mp) != "nas":
                evict(ctx, mp)
        except (OSError, RuntimeError) as e:
            log(f"  evict after promote failed: {e}")
    promote_rows(ctx, "promote.blob", f"one blob ({gib_s(size)})", size, res,
                 "SHA-256 one core", "cp")


def m_revision(ctx):
    """Promotion of a revision of --shards shards (the bench's
    models--bench--shards, --shard-mib each) with `wfsctl promote --wait
    REPO/snapshots/REV`, against the SHA-256 rate of all cores (one hashing
    thread a core) in the same pairs (goal >= 0.7x), and against `cp -rL`
    of the NAS snapshot into LOCAL_STORE's filesystem + sync (no goal).
    Evicted after each promotion."""
    sh = ctx.shards
    size = sh["bytes"]
    mp = os.path.join(ctx.mnt, sh["snapshot"])
    nas = os.path.join(ctx.hub, sh["snapshot"])
    dst = os.path.join(cp_dir(ctx, "cp", size), "rev")
    files = [os.path.join(mp, s["name"]) for s in sh["shards"]]
    for f in files:
        ensure_nas(ctx, f)
    threads = ncpu()

    def done():
        bad = {os.path.basename(f): wfs_state(f) for f in files}
        bad = {k: v for k, v in bad.items() if v != "local"}
        if bad:
            raise RuntimeError(f"after promote --wait of the revision: not local: {bad}")

    def visit(side):
        if side == "sha256":
            return {"rate": sha256_rate(threads)}
        if side == "cp":
            return cp_visit(nas, dst, size, recursive=True)
        return promote_visit(ctx, mp, size, done, files)

    try:
        res = abba(ctx, ("sha256", "cp", "wfs"), visit)
    finally:
        if os.path.exists(dst):
            shutil.rmtree(dst, ignore_errors=True)
        try:
            if any(wfs_state(f) != "nas" for f in files):
                evict(ctx, mp, files)
        except (OSError, RuntimeError) as e:
            log(f"  evict after the revision failed: {e}")
    r = promote_rows(ctx, "promote.rev",
                 f"revision of {len(files)} x {sh['shards'][0]['size'] / MiB:.0f} MiB "
                 f"({gib_s(size)})", size, res, f"SHA-256 all {threads} cores", "cp -rL")
    r["note"] += f"; copy_workers {copy_workers(ctx)}"


def copy_workers(ctx):
    """copy_workers of the mount: the -o given, else wfs's default (2)."""
    for o in reversed(ctx.args.wfs_opt):
        if o.startswith("copy_workers="):
            return o.split("=", 1)[1]
    return "default"


def promote_whole(ctx, mp, what):
    """Caches dropped, `wfsctl promote --wait MP`, its time logged."""
    drop_caches()
    t0 = time.perf_counter()
    wfsctl(ctx, "promote", "--wait", mp)
    log(f"  promoted {what} in {time.perf_counter() - t0:.2f} s")


def m_local(ctx):
    """Local-blob reads after promotion of the big shard: the same seq /
    mmap / rand figures as for the NAS, 'direct' = reading the verified
    copy LOCAL_STORE/data/xx/<hash> itself, 'wfs' = the file in the mount.
    Evicts the copy afterwards."""
    size = ctx.big["size"]
    mp = ctx.big_path("wfs")
    try:
        if wfs_state(mp) != "local":
            promote_whole(ctx, mp, ctx.big["path"])
        expect_state(mp, "local", "promote")
        lp = local_copy_path(ctx, size)
        log(f"  local copy {lp}")
        same_bytes(lp, ctx.big_path("direct"), 0, size, "local copy")
        _, st0, _ = wfsctl(ctx, "status", ctx.mnt)
        dr0 = wfs_xattr_int(mp, "user.wfs.daemon_reads")
        pt = passthrough_opens(mp)
        read_rows(ctx, {"direct": lp, "wfs": mp}, size, "local", "local: ")
        _, st1, _ = wfsctl(ctx, "status", ctx.mnt)
        dr1 = wfs_xattr_int(mp, "user.wfs.daemon_reads")
        st = wfs_state(mp)
        s0, s1 = st0.get("served", {}), st1.get("served", {})
        dl = s1.get("local_bytes", 0) - s0.get("local_bytes", 0)
        dn = s1.get("nas_bytes", 0) - s0.get("nas_bytes", 0)
        dr = None if None in (dr0, dr1) else dr1 - dr0
        how = ("kernel passthrough" if pt else "daemon-served") if pt is not None else "?"
        ctx.row("local.reads", "local: READ requests the daemon served", "count", None, dr,
                "info", f"reads were {how} (user.wfs.passthrough={fmt(pt)} while open); "
                f"wfsctl 'served' delta: local {dl / GiB:.2f} GiB, NAS {dn / GiB:.2f} GiB; "
                f"state after: {st}",
                extra={"served_local_bytes": dl, "served_nas_bytes": dn,
                       "daemon_reads": dr, "passthrough_opens": pt})
        if st != "local":
            raise RuntimeError(f"{mp}: state {st} after the local reads, expected local")
    finally:
        try:
            if wfs_state(mp) != "nas":
                evict(ctx, mp)
        except (OSError, RuntimeError) as e:
            log(f"  evict after local failed: {e}")
def part_file(ctx):
    """LOCAL_STORE/parts/<hex>: the one partial copy there."""
    d = os.path.join(ctx.local, "parts")
    names = [n for n in os.listdir(d) if not n.startswith(".")] if os.path.isdir(d) else []
    if len(names) != 1:
        raise RuntimeError(f"expected one partial copy in {d}, found {names}")
    return os.path.join(d, names[0])


def same_bytes(a, b, off, length, what):
    """Spot check: [off, off+length) of files a and b, head, middle, tail MiB."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for o in (off, off + length // 2, max(off, off + length - MiB)):
            fa.seek(o)
            fb.seek(o)
            if fa.read(MiB) != fb.read(MiB):
                raise RuntimeError(f"{what}: {a} and {b} differ at {o}")


def m_part(ctx):
    """Stage part of a file: the second quarter Q:Q of the big blob (Q =
    size/4 rounded down to 4 KiB) promoted as one range (`wfsctl promote
    --range Q:Q --wait`), then sequential 1 MiB reads of exactly that
    quarter, cold (caches dropped before each side) and warm (again right
    after), in the same abba rounds:
      part_wfs      through the mount (daemon-served from the partial copy)
      part_direct   the same bytes of LOCAL_STORE/parts/<hex> itself (goal:
                    part_wfs >= 0.9x of it)
      nas           the same bytes of the NAS file (the gain)
      whole_wfs     the same quarter of another blob of the same size
                    (TWIN_REPO, added to the hub for this figure) promoted
                    whole, through the mount (kernel passthrough)
      whole_direct  that blob's verified copy in LOCAL_STORE/data itself
    Both copies are evicted and the twin repo removed afterwards."""
    from rigs import add_twin_repo, TWIN_REPO
    size = ctx.big["size"]
    q = size // 4 // 4096 * 4096
    if q < 4 * MiB:
        raise Skip(f"the big file ({size} bytes) is too small for a quarter worth timing")
    mp, nas = ctx.big_path("wfs"), ctx.big_path("direct")
    ensure_nas(ctx, mp)
    t0 = time.perf_counter()
    twin = add_twin_repo(ctx.hub, size, ctx.args.seed)
    log(f"  added {twin['blob']} ({size / MiB:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
    twin_mp = os.path.join(ctx.mnt, twin["blob"])
    twin_nas = os.path.join(ctx.hub, twin["blob"])
    try:
        drop_caches()
        t0 = time.perf_counter()
        wfsctl(ctx, "promote", "--range", f"{q}:{q}", "--wait", mp)
        dt = time.perf_counter() - t0
        expect_state(mp, "partial", "promote --range")
        lp = part_file(ctx)
        same_bytes(lp, nas, q, q, "partial copy")
        log(f"  promoted range {q}:{q} of {ctx.big['path']} in {dt:.2f} s "
            f"({q / dt / 1e6:.0f} MB/s); partial copy {lp}")
        promote_whole(ctx, twin_mp, twin["blob"] + " whole")
        expect_state(twin_mp, "local", "promote")
        tlp = local_copy_path(ctx, size)
        same_bytes(tlp, twin_nas, q, q, "whole copy")
        pt_part, pt_whole = passthrough_opens(mp), passthrough_opens(twin_mp)
        paths = {"part_wfs": mp, "part_direct": lp, "nas": nas, "whole_wfs": twin_mp,
                 "whole_direct": tlp}

        def visit(side):
            p = paths[side]
            fuse = side.endswith("_wfs")
            drop_caches()
            out = {}
            for k in ("cold", "warm"):
                if k == "warm" and not fuse:
                    rb = resident_bytes(p)   # the whole file's, only the quarter was read
                    out["resident"] = None if rb is None else rb / q
                (n, t), dc = ctx.timed("wfs" if fuse else side,
                                       lambda: seq_read_range(p, q, q))
                if n != q:
                    raise IOError(f"{side}: read {n} bytes of [{q}, {2 * q}) of {p}")
                out[k], out["cpu_" + k] = q / t / 1e6, dc
            return out

        _, st0, _ = wfsctl(ctx, "status", ctx.mnt)
        sides = ("part_direct", "part_wfs", "nas", "whole_direct", "whole_wfs")
        res = abba(ctx, sides, visit)
        _, st1, _ = wfsctl(ctx, "status", ctx.mnt)
        if wfs_state(mp) != "partial" or wfs_state(twin_mp) != "local":
            raise RuntimeError(f"after the reads: {mp} {wfs_state(mp)} (expected partial), "
                               f"{twin_mp} {wfs_state(twin_mp)} (expected local)")
        g = f"{q / GiB:.2f} GiB" if q >= GiB // 4 else f"{q / MiB:.0f} MiB"
        warm = warm_note(res, [s for s in sides if not s.endswith("_wfs")])
        for k in ("cold", "warm"):
            wn = warm if k == "warm" else ""
            cpu = col(res, "part_wfs", "cpu_" + k)
            ctx.pair_row(f"part.seq.{k}", f"part: quarter via mount vs its partial copy, seq "
                         f"1 MiB {k} ({g})", "MB/s", "rate", col(res, "part_direct", k),
                         col(res, "part_wfs", k), cpu, wn, res=res)
            ctx.pair_row(f"part.nas.{k}", f"part: quarter via mount vs the NAS file, {k}",
                         "MB/s", "rate", col(res, "nas", k), col(res, "part_wfs", k), cpu,
                         "direct = the same bytes of the NAS file: the gain; no goal", res=res)
            ctx.pair_row(f"part.pt.{k}", f"part: quarter via mount vs a whole copy via "
                         f"passthrough, {k}", "MB/s", "rate", col(res, "whole_wfs", k),
                         col(res, "part_wfs", k), cpu,
                         "direct = the same quarter of a blob of the same size promoted whole, "
                         "read through the mount (kernel passthrough): what a partial copy "
                         "costs against it; no goal", res=res)
            ctx.pair_row(f"part.whole.{k}", f"part: whole copy via mount (passthrough) vs "
                         f"that copy, {k}", "MB/s", "rate", col(res, "whole_direct", k),
                         col(res, "whole_wfs", k), col(res, "whole_wfs", "cpu_" + k),
                         "the passthrough baseline's own ratio; no goal", res=res)
        def part_served(st):
            e = next((x for x in st.get("partial", []) if x.get("id") == ctx.big.get("id")
                      or str(x.get("key", "")).endswith(ctx.big["nas_real"])), {})
            return e.get("served_local_bytes", 0)
        s0, s1 = st0.get("served", {}), st1.get("served", {})
        dl = part_served(st1) - part_served(st0)
        dn = s1.get("nas_bytes", 0) - s0.get("nas_bytes", 0)
        reads = len(res["part_wfs"])
        ctx.row("part.served", "part: MiB the daemon served from the NAS during the figure",
                "MiB", None, dn / MiB, "info",
                f"from the partial copy {dl / MiB:.0f} MiB; {reads} cold + {reads} warm quarter "
                f"reads of {q / MiB:.0f} MiB through the mount (the NAS bytes: the kernel's "
                f"read-ahead past the quarter's end); user.wfs.passthrough while open: "
                f"partial {fmt(pt_part)}, whole copy {fmt(pt_whole)}; the range promoted in "
                f"{dt:.2f} s",
                extra={"served_local_bytes": dl, "served_nas_bytes": dn,
                       "passthrough_opens": {"partial": pt_part, "whole": pt_whole},
                       "range": [q, q], "promote_s": dt})
    finally:
        for f in (mp, twin_mp):
            try:
                if os.path.exists(f) and wfs_state(f) != "nas":
                    evict(ctx, f)
            except (OSError, RuntimeError) as e:
                log(f"  evict {f} after part failed: {e}")
        shutil.rmtree(os.path.join(ctx.hub, TWIN_REPO), ignore_errors=True)


def wfs_argv(a, hub, local, mnt, opts=()):
    """The daemon's command line: OPTS, then --wfs-opt (which may override)."""
    return [a.wfs] + sum((["-o", o] for o in list(opts) + list(a.wfs_opt)), []) + [hub, local, mnt]


def many_fixture(ctx, name, n):
    """A hub of its own, `mkhub --scale-mib 1 --many N` in WORKDIR/NAME,
    and where to mount it.  Returns (manifest, hub, the mount's record in
    ctx.extra_mounts ({"mnt", "local"}: cleaned up at exit), wfs argv,
    seconds the generator took)."""
    a = ctx.args
    d = os.path.join(ctx.workdir, name)
    fx = os.path.join(d, "fixture")
    os.makedirs(d, exist_ok=True)
    cmd = [a.mkhub, "--scale-mib", "1", "--many", str(n), "--seed", str(a.seed), fx]
    log("  generating:", " ".join(cmd))
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    gen_s = time.perf_counter() - t0
    log(f"  generated in {gen_s:.1f} s")
    with open(os.path.join(fx, "manifest.json")) as f:
        man = json.load(f)
    hub = man.get("hub") or os.path.join(fx, "hub")
    local, mnt = os.path.join(d, "local"), os.path.join(d, "mnt")
    os.makedirs(mnt, exist_ok=True)
    m = {"mnt": mnt, "local": local}
    ctx.extra_mounts.append(m)
    return man, hub, m, wfs_argv(a, hub, local, mnt), gen_s


def m_startup(ctx):
    """Start-up with N verified blobs (--startup-many, default 1000): a
    separate fixture with `mkhub --many N`, its datasets--acme--many repo
    promoted, unmounted; then time `wfs` (returns when mounted) until
    `wfsctl status` answers and one promoted file reads back (right bytes)
    with user.wfs.state = local.  Cold (caches dropped) and warm; seconds."""
    a = ctx.args
    n = a.startup_many
    man, hub, m, wcmd, _ = many_fixture(ctx, "startup", n)
    local, mnt = m["local"], m["mnt"]
    repo = "datasets--acme--many"
    # a snapshot entry of the repo (a link to its blob), as a loader opens it
    probe = next((e for e in man["entries"] if e["path"].startswith(repo + "/snapshots/")
                  and e["type"] == "link" and e.get("follow") == "file"), None)
    if probe is None:
        raise RuntimeError(f"no snapshot link in {repo} of the startup fixture")
    probe_path = os.path.join(mnt, probe["path"])

    def do_mount():
        r = subprocess.run(wcmd, timeout=120, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")

    def do_unmount():
        pid = find_daemon(mnt, local)
        subprocess.run(["umount", mnt], check=True, capture_output=True)
        if not wait_daemon_exit(pid):
            raise RuntimeError(f"daemon {pid} still alive 10 s after umount {mnt}")

    do_mount()
    drop_caches()
    dt, pnote = promote_tree(ctx, mnt, repo)
    _, st, _ = wfsctl(ctx, "status", mnt)
    r = next(x for x in st["repos"] if x["repo"] == repo)
    blobs = st.get("store", {}).get("blobs")
    log(f"  promoted {repo}: {r['local_files']}/{r['files']} files local, store blobs {blobs}, "
        f"in {dt:.2f} s")
    if wfs_state(probe_path) != "local":
        raise RuntimeError(f"{probe_path}: not local after promotion")
    do_unmount()

    res = {"cold": [], "warm": []}
    reps = 3
    for rep in range(reps):
        for mode in ("cold", "warm"):
            if mode == "cold":
                drop_caches()
            t0 = time.perf_counter()
            do_mount()
            t1 = time.perf_counter()
            deadline = t0 + 30
            while True:
                rc, reply, _ = wfsctl(ctx, "status", mnt, check=False, timeout=30)
                if rc == 0 and reply and reply.get("ok"):
                    break
                if time.perf_counter() > deadline:
                    raise RuntimeError("wfsctl status did not answer within 30 s of mounting")
                time.sleep(0.01)
            t2 = time.perf_counter()
            while True:
                stt = wfs_state(probe_path)
                if stt == "local":
                    with open(probe_path, "rb") as f:
                        data = f.read()
                    if hashlib.sha256(data).hexdigest() != probe["sha256"]:
                        raise RuntimeError(f"{probe_path}: wrong bytes after remount")
                    if wfs_state(probe_path) == "local":
                        break
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{probe_path}: state {stt} 30 s after mounting")
                time.sleep(0.01)
            t3 = time.perf_counter()
            pid = find_daemon(mnt, local)
            cpu = proc_cpu_s(pid) if pid else None
            lr = next((x for x in reply.get("repos", []) if x.get("repo") == repo), {})
            if lr.get("local_files") != r["local_files"]:
                log(f"  NOTE: first status shows {lr.get('local_files')} local files of "
                    f"{r['local_files']} promoted")
            res[mode].append({"total": t3 - t0, "mount": t1 - t0, "status": t2 - t1,
                              "read": t3 - t2, "daemon_cpu_s": cpu,
                              "local_files": lr.get("local_files"),
                              "store_blobs": reply.get("store", {}).get("blobs")})
            log(f"  startup {mode}: {t3 - t0:.3f} s (wfs {t1 - t0:.3f}, status {t2 - t1:.3f}, "
                f"read {t3 - t2:.3f}), daemon CPU {fmt(cpu, 2)} s, "
                f"{lr.get('local_files')} local files at first status")
            do_unmount()
    ctx.extra_mounts.remove(m)
    for i, mode in enumerate(("cold", "warm")):
        runs = res[mode]
        b = min(runs, key=lambda x: x["total"])
        worst = max(x["total"] for x in runs)
        ctx.row(f"startup.{mode}", f"startup {mode}, {r['local_files']} local blobs (store {blobs})", "s",
                None, b["total"], "info",
                f"wfs {b['mount']:.3f} + status {b['status']:.3f} + "
                f"read {b['read']:.3f}; worst of {len(runs)} {worst:.3f}; "
                f"{b['local_files']} local at 1st status"
                + (f"; {pnote}" if pnote and i == 0 else ""),
                extra={"daemon_cpu_s": b["daemon_cpu_s"], "runs": runs,
                       "promote_s": dt, "promote_note": pnote})


# ---- comparison filesystems: kernel overlayfs and bindfs ------------------

def mount_overlay(ctx, hub, mnt):
    """Read-only kernel overlayfs over the NAS hub (no upperdir).  Tries the
    NAS hub as the single lowerdir; kernels that want at least two lower
    layers without an upper one (6.18 says "at least 2 lowerdir are needed
    while upperdir nonexistent") get lowerdir=HUB:EMPTY, an empty directory
    below the hub.  Returns (None, the lowerdir used) or (reason, None)."""
    os.makedirs(mnt, exist_ok=True)
    empty = os.path.join(os.path.dirname(mnt), "overlay-empty")
    os.makedirs(empty, exist_ok=True)
    errs = []
    for lower, shown in ((hub, "NAS_HUB"), (f"{hub}:{empty}", "NAS_HUB:EMPTY")):
        cmd = ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower}", mnt]
        log("  mounting:", " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and is_mounted(mnt):
            ctx.extra_mounts.append({"mnt": mnt})
            return None, shown
        if is_mounted(mnt):
            subprocess.run(["umount", mnt], capture_output=True)
        errs.append(f"lowerdir={shown}: exit {r.returncode}: "
                    + " ".join(r.stderr.split()[:12]))
    return "mount -t overlay failed: " + "; ".join(errs), None


def ensure_bindfs(ctx):
    """Path of bindfs, installing the Debian package if missing (unless
    --no-install).  Returns (path or None, note)."""
    b = shutil.which("bindfs")
    if b:
        return b, ""
    if ctx.args.no_install:
        return None, "bindfs not installed (--no-install)"
    if not shutil.which("apt-get"):
        return None, "bindfs not installed and no apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log("  bindfs missing: apt-get install -y bindfs")
    for cmds in ([["apt-get", "install", "-y", "-q", "bindfs"]],
                 [["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "bindfs"]]):
        try:
            for c in cmds:
                r = subprocess.run(c, capture_output=True, text=True, timeout=600, env=env,
                                   stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            r = None
            err = str(e)
        b = shutil.which("bindfs")
        if b:
            return b, "bindfs installed by the bench (apt-get)"
        err = r.stderr.strip().splitlines()[-1] if r is not None and r.stderr.strip() else \
            (err if r is None else f"exit {r.returncode}")
    return None, f"bindfs not installed and apt-get install failed: {err}"


def bindfs_version(b):
    try:
        r = subprocess.run([b, "--version"], capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "bindfs"


def mount_bindfs(ctx, b, hub, mnt):
    """bindfs -r (read-only mirror, default options otherwise) in the
    foreground as a child of ours, so its pid is known.  Returns (None, proc)
    or (reason, None)."""
    os.makedirs(mnt, exist_ok=True)
    logf = open(os.path.join(ctx.workdir, "bindfs.log"), "w")
    cmd = [b, "-f", "-r", hub, mnt]
    log("  mounting:", " ".join(cmd))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                            start_new_session=True)
    logf.close()
    m = {"mnt": mnt, "proc": proc}
    ctx.extra_mounts.append(m)
    if not wait_mounted(mnt, proc):
        unmount_extra(ctx, m)
        with open(os.path.join(ctx.workdir, "bindfs.log")) as f:
            err = f.read().strip()
        return f"bindfs did not mount (exit {proc.returncode}): {' '.join(err.split())}", None
    if ctx.args.fuse_read_ahead_kb is not None:
        with open(bdi_read_ahead_path(mnt), "w") as f:
            f.write(f"{ctx.args.fuse_read_ahead_kb}\n")
    return None, proc


def m_compare(ctx):
    """The NAS-side read figures (seq cold/warm, mmap cold, rand 4 KiB
    cold/warm, walk cold/warm, page-cache growth) through kernel overlayfs
    (mount -t overlay, the NAS hub as its single read-only lowerdir) and
    bindfs (-r, default options; installed with apt-get if missing) over the
    same files, each as ratios to direct measured in the same rounds
    (abba over direct, overlayfs, bindfs: the order reversed every other
    round).  They land in columns of the rows the wfs figures made."""
    hub = ctx.hub
    rel = ctx.big["nas_real"]
    size = ctx.big["size"]
    cdir = os.path.join(ctx.workdir, "compare")
    notes = []
    mnts = {}
    b, bnote = ensure_bindfs(ctx)
    if bnote:
        notes.append(bnote)
    try:
        why, lower = mount_overlay(ctx, hub, os.path.join(cdir, "overlay"))
        if why:
            notes.append(f"overlayfs rows skipped: {why}")
        else:
            mnts["overlayfs"] = os.path.join(cdir, "overlay")
        if b:
            why, proc = mount_bindfs(ctx, b, hub, os.path.join(cdir, "bindfs"))
            if why:
                notes.append(f"bindfs rows skipped: {why}")
            else:
                mnts["bindfs"] = os.path.join(cdir, "bindfs")
        else:
            notes.append("bindfs rows skipped")
        for n in notes:
            ctx.errors.append({"measurement": "compare", "status": "note", "message": n})
        if not mnts:
            raise Skip("; ".join(notes))
        ra = {k: read_ahead_kb(v) for k, v in mnts.items()}
        parts = []
        if "overlayfs" in mnts:
            parts.append(f"overlayfs = mount -t overlay -o lowerdir={lower} (read-only, "
                         "no upperdir" + (", EMPTY an empty dir: the kernel wants 2 lower "
                                          "layers without an upper" if ":" in lower else "")
                         + ")")
        if "bindfs" in mnts:
            parts.append(f"bindfs = {bindfs_version(b)} -r NAS_HUB (FUSE, default options), "
                         f"bdi read_ahead_kb {ra['bindfs']}")
        ctx.compare_info = "; ".join(parts)
        names = list(mnts)
        paths = {"direct": os.path.join(hub, rel)}
        paths.update({k: os.path.join(v, rel) for k, v in mnts.items()})
        for k, p in paths.items():
            if os.stat(p).st_size != size:
                raise RuntimeError(f"{k}: {p} is not {size} bytes")
        roots = {"direct": hub}
        roots.update(mnts)

        offs = rand_offsets(ctx, size)
        g = gib_s(size)
        sides = ("direct",) + tuple(names)
        specs = [(seq_visit(ctx, paths, size), [("nas.seq.cold", f"NAS: seq 1 MiB cold ({g})",
                                                  "MB/s", "rate", "cold"),
                                                 ("nas.seq.warm", f"NAS: seq 1 MiB warm ({g})",
                                                  "MB/s", "rate", "warm")]),
                 (mmap_visit(ctx, paths), [("nas.mmap.cold", "NAS: mmap cold (every page)",
                                            "MB/s", "rate", "cold")]),
                 (rand_visit(ctx, paths, offs),
                  [(f"nas.rand.{k}", f"NAS: 4 KiB random {k} ({len(offs)} reads)", "IOPS",
                    "rate", k) for k in ("cold", "warm")]),
                 (walk_visit(ctx, roots), [(f"walk.{k}", f"walk find+lstat {k}", "s", "time", k)
                                           for k in ("cold", "warm")])]
        for visit, rows in specs:
            res = abba(ctx, sides, visit)
            for key, metric, unit, kind, k in rows:
                note = "; ".join(x for x in (warm_note(res, sides) if k == "warm" else "",
                                             res.note()) if x)
                for name in names:
                    ctx.alt(key, metric, unit, kind, name, col(res, "direct", k),
                            col(res, name, k), note)
        res = pagecache_measure(paths, size, paths["direct"])
        for name in names:
            ctx.alt("pagecache", PAGECACHE_METRIC, "x", "frac", name, [res["direct"]["growth"]],
                    [res[name]["growth"]])
        for k in names:
            log(f"  {k}: NAS file resident after its read {fmt(res[k]['nas_resident'])}, "
                f"mount file {fmt(res[k]['mnt_resident'])} (x size)")
    finally:
        for m in [m for m in ctx.extra_mounts if m["mnt"].startswith(cdir + "/")]:
            unmount_extra(ctx, m)


# ---- daemon memory and idle CPU with a large hub ---------------------------

def m_memory(ctx):
    """Daemon memory with a large hub: a fixture of its own from `mkhub
    --scale-mib 1 --many N` (--memory-many, default 100,000), a fresh wfs
    mount, every entry walked through it (find + lstat, caches dropped
    first), then VmRSS of the daemon (pid from LOCAL_STORE/wfs.lock) against
    the 64 MiB target.  Then idle: --idle-seconds (default 10) of nothing,
    and the daemon's utime+stime delta over them (target ~0).  Finally the
    RSS again after dropping the kernel's caches (the kernel FORGETs the
    inodes: what the daemon gives back)."""
    a = ctx.args
    n = a.memory_many
    man, hub, m, wcmd, gen_s = many_fixture(ctx, "memory", n)
    local, mnt = m["local"], m["mnt"]
    del man
    try:
        log("  mounting:", " ".join(wcmd))
        r = subprocess.run(wcmd, timeout=120, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")
        if not wait_mounted(mnt):
            raise RuntimeError(f"wfs returned 0 but {mnt} is not a mount")
        with open(os.path.join(local, "wfs.lock")) as f:
            pid = int(f.read().split()[0])
        if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != "wfs":
            raise RuntimeError(f"pid {pid} in {local}/wfs.lock is not wfs")
        st0 = proc_status(pid)
        drop_caches()
        (nd, dtd) = tree_walk(hub)
        drop_caches()
        c0 = proc_cpu_s(pid)
        (nw, dtw) = tree_walk(mnt)
        walk_cpu = proc_cpu_s(pid) - c0
        st1 = proc_status(pid)
        log(f"  walked {nw} entries in {dtw:.2f} s (direct {nd} in {dtd:.2f} s); daemon "
            f"VmRSS {st0['VmRSS'] / MiB:.1f} MiB at mount -> {st1['VmRSS'] / MiB:.1f} MiB")
        k0, w0 = proc_ticks(pid), time.perf_counter()
        time.sleep(a.idle_seconds)
        k1, w1 = proc_ticks(pid), time.perf_counter()
        idle_ticks = k1 - k0
        idle_s = idle_ticks / CLK_TCK
        st2 = proc_status(pid)
        drop_caches()
        time.sleep(2)
        st3 = proc_status(pid)
        log(f"  idle {w1 - w0:.1f} s: {idle_ticks} ticks ({idle_s:.2f} s) of daemon CPU; "
            f"VmRSS after dropping caches {st3['VmRSS'] / MiB:.1f} MiB")
    finally:
        unmount_extra(ctx, m)
    rss = st1["VmRSS"] / MiB
    cnote = "" if nd == nw else f"; ENTRY COUNT DIFFERS direct={nd} wfs={nw}"
    ctx.row("memory.rss", f"daemon VmRSS after walking {nw} entries ({n}-file hub)", "MiB", None,
            rss, "info",
            f"at mount {st0['VmRSS'] / MiB:.1f}, "
            f"anon {st1.get('RssAnon', 0) / MiB:.1f}, HWM {st1['VmHWM'] / MiB:.1f}, "
            f"{st1.get('Threads')} threads; walk {dtw:.1f} s vs direct {dtd:.1f} s; "
            f"fixture made in {gen_s:.0f} s{cnote}",
            extra={"daemon_cpu_s": walk_cpu, "status_at_mount": st0, "status_after_walk": st1,
                   "status_after_idle": st2, "status_after_drop": st3,
                   "entries": {"direct": nd, "wfs": nw}, "walk_s": {"direct": dtd, "wfs": dtw},
                   "mkhub_s": gen_s})
    ctx.row("memory.rss_drop", "daemon VmRSS after drop_caches (kernel forgot inodes)", "MiB", None,
            st3["VmRSS"] / MiB, "info", "what the daemon gives back once the kernel FORGETs")
    ctx.row("memory.idle", f"daemon CPU while idle {w1 - w0:.0f} s after the walk", "s", None,
            idle_s, "info",
            f"utime+stime delta {idle_ticks} ticks "
            f"(1 tick = 1/{CLK_TCK} s)",
            extra={"daemon_cpu_s": idle_s, "ticks": idle_ticks})


# ---- mounts -----------------------------------------------------------------

def unmount_extra(ctx, m):
    """Unmount one of ctx.extra_mounts and forget it: a wfs mount ("local":
    its daemon is waited for), bindfs ("proc": our child, waited for, else
    SIGTERM), or a kernel mount (overlayfs)."""
    try:
        if "local" in m:
            unmount_one(m["mnt"], find_daemon(m["mnt"], m["local"])
                        if is_mounted(m["mnt"]) else None)
        else:
            unmount_one(m["mnt"], None)
        proc = m.get("proc")
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log(f"{proc.args[0]} {proc.pid} still alive after unmount; SIGTERM")
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    except OSError as e:
        log(f"unmounting {m['mnt']}: {e}")
    if m in ctx.extra_mounts:
        ctx.extra_mounts.remove(m)


def unmount(ctx):
    for m in list(reversed(ctx.extra_mounts)):
        unmount_extra(ctx, m)
    if not ctx.mnt:
        return
    unmount_one(ctx.mnt, ctx.daemon_pid)




def mount_main(ctx):
    """The rig's wfs mount of the fixture, auto_promote=off: NAS-served
    figures must stay NAS-served; nothing becomes local unless a figure
    promotes it (an --wfs-opt auto_promote=... overrides)."""
    a = ctx.args
    ctx.local = os.path.join(ctx.rig.store_root, "local")
    ctx.mnt = os.path.join(ctx.rig.mnt_root, "wfs")
    os.makedirs(ctx.mnt, exist_ok=True)
    cmd = wfs_argv(a, ctx.hub, ctx.local, ctx.mnt, ["auto_promote=off"])
    log("mounting:", " ".join(cmd))
    r = subprocess.run(cmd, timeout=120, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"wfs exited {r.returncode}: {r.stderr.strip()}")
    if not wait_mounted(ctx.mnt, timeout=10):
        raise RuntimeError(f"wfs returned 0 but {ctx.mnt} is not a mount")
    ctx.daemon_pid = find_daemon(ctx.mnt, ctx.local)
    if a.fuse_read_ahead_kb is not None:
        with open(bdi_read_ahead_path(ctx.mnt), "w") as f:
            f.write(f"{a.fuse_read_ahead_kb}\n")
        want = a.fuse_read_ahead_kb
    else:
        # the daemon sets the mount's read-ahead itself (-o readahead_kb,
        # default 4096) once FUSE's INIT is done: give it a moment, and say
        # so if it does not hold
        want = 4096
        for o in a.wfs_opt:
            if o.startswith("readahead_kb="):
                want = int(o.split("=", 1)[1])
        deadline = time.perf_counter() + 3
        while read_ahead_kb(ctx.mnt) != want and time.perf_counter() < deadline:
            time.sleep(0.05)
    ctx.read_ahead = {"direct_kb": read_ahead_kb(ctx.hub), "wfs_kb": read_ahead_kb(ctx.mnt),
                      "local_kb": read_ahead_kb(ctx.local), "wfs_wanted_kb": want}
    if ctx.read_ahead["wfs_kb"] != want:
        log(f"  WARNING: the mount's read_ahead_kb is {ctx.read_ahead['wfs_kb']}, wfs asked "
            f"for {want}: measuring it as it is")
    log(f"  mounted, daemon pid {ctx.daemon_pid}, bdi read_ahead_kb "
        f"NAS={ctx.read_ahead['direct_kb']} mount={ctx.read_ahead['wfs_kb']} "
        f"LOCAL_STORE={ctx.read_ahead['local_kb']}")


def unmount_all(ctx):
    if ctx.read_ahead and ctx.mnt and is_mounted(ctx.mnt):
        ctx.read_ahead["wfs_kb_at_end"] = read_ahead_kb(ctx.mnt)
    for m in list(reversed(ctx.extra_mounts)):
        unmount_extra(ctx, m)
    if ctx.mnt and is_mounted(ctx.mnt):
        unmount_one(ctx.mnt, ctx.daemon_pid)
    elif ctx.daemon_pid:
        wait_daemon_exit(ctx.daemon_pid)


class Measurement:
    """once: rig-independent (its own fixture in the work dir), run once a
    run, not on each rig; others use the rig's fixture and mount."""
    def __init__(self, name, fn, default=True, once=False):
        self.name, self.fn, self.default, self.once = name, fn, default, once


MEASUREMENTS = [
    Measurement("seq", m_seq),
    Measurement("mmap", m_mmap),
    Measurement("rand", m_rand),
    Measurement("walk", m_walk),
    Measurement("pagecache", m_pagecache),
    Measurement("compare", m_compare),
    Measurement("promote", m_promote),
    Measurement("revision", m_revision),
    Measurement("local", m_local),
    Measurement("part", m_part),
    Measurement("startup", m_startup, once=True),
    Measurement("memory", m_memory, once=True),
]
