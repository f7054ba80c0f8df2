"""wfs bench: the read figures of NAS-served files (seq, mmap, rand), the
walk, page-cache growth, and the same through kernel overlayfs and bindfs."""

import os
import random
import shutil
import subprocess
import time

import json

from common import (bdi_read_ahead_path, drop_caches, find_daemon, fmt, is_mounted, log,
                    meminfo, read_ahead_kb, resident_bytes, set_enable_uring, Skip, wait_mounted)
from frame import (abba, col, gib_s, mmap_read, rand_read, seq_read, tree_walk, unmount_extra,
                   wfs_argv)


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


def m_noise(ctx):
    """The rig's own noise: the seq, mmap and rand visits with the largest
    shard read directly on both sides of every pair (an A/A run).  A wfs
    ratio inside this figure's lo-hi, on the same rig in the same run, is
    not told apart from parity."""
    p = ctx.big_path("direct")
    read_rows(ctx, {"direct": p, "wfs": p}, ctx.big["size"], "noise",
              "A/A (direct on both sides): ")


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


def mount_wfs_uring(ctx, hub, mnt):
    """A second wfs mount of the hub with -o fuse_uring=on (LOCAL_STORE of
    its own, auto_promote=off), the kernel's enable_uring set until its rings
    took a request and put back then (the kernel reads it when it sends
    INIT and again when it applies the reply).  Returns (why not, None) or
    (None, mnt) once a request went through a ring (the daemon's
    fuse_uring_requests counter)."""
    local = os.path.join(os.path.dirname(mnt), "uring-local")
    os.makedirs(mnt, exist_ok=True)
    was = set_enable_uring("1")
    if was is None:
        return "this kernel has no FUSE over io_uring", None
    # registered before wfs starts: a mount that comes up late, or after a
    # timeout, is still unmounted by the caller's cleanup (m_compare's
    # finally, unmount_all; unmount_extra looks whether it is mounted)
    ctx.extra_mounts.append({"mnt": mnt, "local": local})
    try:
        r = subprocess.run(wfs_argv(ctx.args, hub, local, mnt,
                                    ["auto_promote=off", "fuse_uring=on"]),
                           timeout=120, capture_output=True, text=True)
        if r.returncode != 0 or not wait_mounted(mnt, timeout=10):
            return f"wfs -o fuse_uring=on did not mount: {r.stderr.strip()}", None
        find_daemon(mnt, local)
        deadline, n = time.perf_counter() + 5, 0
        while not n and time.perf_counter() < deadline:
            os.stat(os.path.join(mnt, ctx.big["nas_real"]))
            q = subprocess.run([ctx.args.wfsctl, "--json", "stats", mnt], capture_output=True,
                               text=True, timeout=60)
            try:
                n = json.loads(q.stdout)["metrics"]["fuse_uring_requests"]
            except (ValueError, KeyError):
                n = 0
            if not n:
                time.sleep(0.05)
    finally:
        set_enable_uring(was)
    if not n:
        return "wfs -o fuse_uring=on mounted, but took no request through io_uring", None
    deadline = time.perf_counter() + 3  # the daemon raises its read-ahead after INIT
    while read_ahead_kb(mnt) != read_ahead_kb(ctx.mnt) and time.perf_counter() < deadline:
        time.sleep(0.05)
    return None, mnt


def m_compare(ctx):
    """The NAS-side read figures (seq cold/warm, mmap cold, rand 4 KiB
    cold/warm, walk cold/warm, page-cache growth) through kernel overlayfs
    (mount -t overlay, the NAS hub as its single read-only lowerdir),
    bindfs (-r, default options; installed with apt-get if missing) and a
    second wfs mount with -o fuse_uring=on (where the kernel has it) over the
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
        if ctx.args.wfsctl and os.access(ctx.args.wfsctl, os.X_OK):
            why, m = mount_wfs_uring(ctx, hub, os.path.join(cdir, "uring"))
            if why:
                notes.append(f"fuse_uring rows skipped: {why}")
            else:
                mnts["fuse_uring"] = m
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
        if "fuse_uring" in mnts:
            parts.append("fuse_uring = wfs -o fuse_uring=on (FUSE over io_uring, NAS reads on "
                         f"the rings), bdi read_ahead_kb {ra['fuse_uring']}")
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
