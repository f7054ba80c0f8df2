"""wfs bench: the figures that need promotion -- one blob, a revision,
reads of the verified copy, and a partial file's range."""

import json
import os
import shutil
import subprocess
import time

from common import (cpu_split, drop_caches, fmt, GiB, log, median, MiB, resident_bytes,
                    run_cmd_timed, Skip, sys_cpu)
from frame import abba, col, gib_s, ncpu, seq_read, seq_read_range, sha256_rate
from reads import read_rows, warm_note


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


def m_many(ctx):
    """Promotion of a dataset of many small files (the fixture's
    datasets--acme--many: --many blobs of a few dozen bytes, 100 snapshot
    links a directory) with `wfsctl promote --wait` of the repo, against
    `cp -rL` of its snapshot into LOCAL_STORE's filesystem + sync; caches
    dropped before each side; seconds (time ratio, no goal).  Each copy is
    checked and fsynced, and renamed into place (two directory fsyncs), and
    the index and record follow: what cp + sync does not.  Evicted after
    each promotion."""
    repo = "datasets--acme--many"
    snaps = os.path.join(ctx.hub, repo, "snapshots")
    revs = sorted(os.listdir(snaps)) if os.path.isdir(snaps) else []
    if not revs:
        raise Skip(f"no {repo} snapshot in the fixture (mkhub --many)")
    nas = os.path.join(snaps, revs[0])
    names = sorted(os.path.join(d, f) for d, _, fs in os.walk(nas) for f in fs)
    size = sum(os.stat(p).st_size for p in names)
    probe = os.path.join(ctx.mnt, repo, "snapshots", revs[0], os.path.relpath(names[0], nas))
    dst = os.path.join(cp_dir(ctx, "cp", size + len(names) * 4096), "many")
    ensure_nas(ctx, probe)

    def visit(side):
        drop_caches()
        if side == "cp":
            t_cp, _, _ = run_cmd_timed(["cp", "-rL", nas, dst])
            t_sync, _, _ = run_cmd_timed(["sync"])
            shutil.rmtree(dst)
            os.sync()
            log(f"  cp -rL {t_cp:.2f} s, + sync {t_cp + t_sync:.2f} s")
            return {"s": t_cp + t_sync}
        c0 = ctx.daemon_cpu()
        dt, note = promote_tree(ctx, ctx.mnt, repo)
        c1 = ctx.daemon_cpu()
        expect_state(probe, "local", "promote --wait")
        if note:
            raise RuntimeError(f"promote --wait of {repo}: {note}")
        evict(ctx, os.path.join(ctx.mnt, repo), [probe])
        log(f"  promote --wait {len(names)} files: {dt:.2f} s ({len(names) / dt:.0f} files/s)")
        return {"s": dt, "cpu": (c1 - c0) if None not in (c0, c1) else None}

    try:
        res = abba(ctx, ("cp", "wfs"), visit)
    finally:
        if os.path.exists(dst):
            shutil.rmtree(dst, ignore_errors=True)
    ctx.pair_row("promote.many", f"promote --wait of {len(names)} small files vs cp -rL + sync",
                 "s", "time", col(res, "cp", "s"), col(res, "wfs", "s"), col(res, "wfs", "cpu"),
                 f"direct = cp -rL of the snapshot + sync, caches dropped; no goal; "
                 f"copy_workers {copy_workers(ctx)}", res=res)


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
