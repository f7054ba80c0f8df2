"""wfs bench: the figures measured once a run, on fixtures of their own:
start-up, and the daemon's memory and idle CPU with a large hub."""

import hashlib
import json
import os
import subprocess
import sys
import time

from common import (drop_caches, find_daemon, fmt, log, median, MiB, proc_cpu_s, proc_status,
                    proc_ticks, wait_daemon_exit, wait_mounted, CLK_TCK)
from frame import tree_walk, unmount_extra, wfs_argv
from promotion import promote_tree, wfs_state, wfsctl


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
    with user.wfs.state = local.  Cold (caches dropped) and warm, each
    --startup-runs times (default 5), alternating; the figure is the median
    run (seconds), with the runs' min-max, and the goal is judged on it."""
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
    reps = a.startup_runs
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
        tot = [x["total"] for x in runs]
        med = {k: median([x[k] for x in runs]) for k in ("total", "mount", "status", "read",
                                                          "daemon_cpu_s")}
        first = sorted({x["local_files"] for x in runs}, key=str)
        ctx.row(f"startup.{mode}", f"startup {mode}, {r['local_files']} local blobs (store {blobs})", "s",
                None, med["total"], "info",
                f"median of {len(runs)} runs, min-max {min(tot):.3f}-{max(tot):.3f}; medians: "
                f"wfs {med['mount']:.3f}, status {med['status']:.3f}, read {med['read']:.3f}; "
                f"{'/'.join(str(x) for x in first)} local at 1st status"
                + (f"; {pnote}" if pnote and i == 0 else ""),
                extra={"daemon_cpu_s": med["daemon_cpu_s"], "runs": runs,
                       "lo": min(tot), "hi": max(tot), "samples": len(runs),
                       "sample_kind": "run", "promote_s": dt, "promote_note": pnote})


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
