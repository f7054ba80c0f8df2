#!/usr/bin/env python3
"""Where operators use wfs, on real mounts:

- containers: the mount (-o allow_other) bind-mounted read-only into another
  mount namespace and read there by uid 65534, bytes equal to the NAS; writes
  refused; wfsctl status through the control socket made available there,
  state changes refused to that uid; a "container" started before the mount
  sees it with rslave propagation (Docker :rslave, Kubernetes
  HostToContainer) and does not without;
- `mount -t fuse.wfs NAS MNT -o local=...` through the standard FUSE mount
  helper, an /etc/fstab-style line (mount -T), and the `/path/to/wfs#NAS`
  form for installs outside the helper's PATH;
- clean shutdown on SIGTERM and on umount in the middle of a promotion:
  the mount goes, LOCAL_STORE/tmp is empty, index.json is whole, the next
  mount is ready at once with the earlier verified copies local;
- metrics: `wfsctl stats --prometheus` and the -o metrics_file= textfile pass
  `promtool check metrics`, with figures that follow what was done;
- every write a client might try on the cache path gets EROFS (root) with
  one log line naming the path; other uids are refused by the kernel;
- the systemd template unit wfs@.service, run the way systemd would: start,
  pre-stage, stop, and a restart over the dead mount kill -9 leaves.
"""

import errno
import json
import os
import select
import signal
import stat
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import (NOBODY, ctl_check, ctl_json, run_wfsctl, sh, state_of,  # noqa: E402
                     wait_state)

MiB = 1 << 20
FIX = wfstest.HubFixture(options=("allow_other",), scale_mib=4, many=20, mount=False)
BIG = None


def setUpModule():
    global BIG
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    FIX.setup()
    try:
        # 48 MiB at promote_mbps=30 (a third of it a copy): ~5 s of copying to stop the daemon in
        BIG = wfstest.add_big_repo(FIX.hub, size=48 * MiB)
    except BaseException:
        FIX.teardown(raise_problems=False)
        raise


def tearDownModule():
    FIX.teardown()


def fresh(name):
    """A LOCAL_STORE path and an empty mount point of its own."""
    d = os.path.join(FIX.gen, name)
    os.makedirs(os.path.join(d, "mnt"))
    os.chmod(d, 0o755)
    return os.path.join(d, "local"), os.path.join(d, "mnt")


rev_of, snap = FIX.ref_commit, FIX.snapshot_entry  # at refs/main


def smalls():
    """Two small blobs (one SHA-256 named, one git SHA-1 named)."""
    return [snap("models--acme--packs", "model.safetensors"),
            snap("models--acme--standard", "config.json")]


def nas_tree(root):
    """path -> (type, size, mtime) of everything under root (lstat)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def pid_from_lock(local):
    try:
        with open(os.path.join(local, "wfs.lock")) as f:
            txt = f.read().strip()
        return int(txt) if txt.isdigit() else None
    except OSError:
        return None


# ---------------------------------------------------------------- containers

def _read_all(root, entries):
    """As the reader: every file's bytes through `root`; the problems."""
    bad, total = [], 0
    for path, sha, size in entries:
        try:
            got, n = wfstest.sha256_file(os.path.join(root, path))
        except OSError as e:
            bad.append("%s: %s" % (path, wfstest.errname(e.errno)))
            continue
        total += n
        if (got, n) != (sha, size):
            bad.append("%s: read %d bytes sha256 %s, NAS has %d bytes %s"
                       % (path, n, got[:12], size, sha[:12]))
    return bad, total


def _try(fn):
    try:
        r = fn()
    except OSError as e:
        return e.errno
    if isinstance(r, int):
        os.close(r)
    return None


def _client_writes(root, repo, rev, blob):
    """What clients try on a cache path: name -> (callable, the mount-relative
    path the daemon's log line must name)."""
    j = os.path.join
    brel = "%s/blobs/%s" % (repo, blob)
    srel = "%s/snapshots/%s" % (repo, rev)
    nrel = "%s/.no_exist/%s" % (repo, rev)
    b, s = j(root, brel), j(root, srel)
    w = {
        "lock file create": (lambda: os.open(j(root, ".locks", repo, blob + ".lock"),
                                             os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o664),
                             ".locks/%s/%s.lock" % (repo, blob)),
        "mkdir .locks/<new repo>": (lambda: os.mkdir(j(root, ".locks", "models--x--y")),
                                    ".locks/models--x--y"),
        "download temp create": (lambda: os.open(b + ".1a2b3c4d.incomplete",
                                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644),
                                 brel + ".1a2b3c4d.incomplete"),
        "rename blob": (lambda: os.rename(b, b + ".old"), brel),
        "snapshot symlink": (lambda: os.symlink("../../blobs/" + blob, j(s, "new.bin")),
                             srel + "/new.bin"),
        "ref write (O_TRUNC)": (lambda: os.open(j(root, repo, "refs", "main"),
                                                os.O_WRONLY | os.O_TRUNC), repo + "/refs/main"),
        "ref write (O_WRONLY)": (lambda: os.open(j(root, repo, "refs", "main"), os.O_WRONLY),
                                 repo + "/refs/main"),
        "trees file": (lambda: os.open(j(root, repo, "trees", rev + ".new.json"),
                                       os.O_WRONLY | os.O_CREAT, 0o644),
                       "%s/trees/%s.new.json" % (repo, rev)),
        "CACHEDIR.TAG rewrite": (lambda: os.open(j(root, "CACHEDIR.TAG"), os.O_WRONLY | os.O_TRUNC),
                                 "CACHEDIR.TAG"),
        "blob append": (lambda: os.open(b, os.O_WRONLY | os.O_APPEND), brel),
        "blob O_RDWR": (lambda: os.open(b, os.O_RDWR), brel),
        "truncate": (lambda: os.truncate(b, 0), brel),
        "chmod": (lambda: os.chmod(b, 0o644), brel),
        "chown": (lambda: os.chown(b, 0, 0), brel),
        "utime (touch)": (lambda: os.utime(b), brel),
        "unlink snapshot entry": (lambda: os.unlink(j(s, "config.json")), srel + "/config.json"),
        "rmdir snapshot": (lambda: os.rmdir(s), srel),
        "setxattr": (lambda: os.setxattr(b, "user.test", b"1"), brel),
        "removexattr": (lambda: os.removexattr(b, "user.wfs.state"), brel),
        "hard link": (lambda: os.link(b, b + ".link"), brel + ".link"),
        "mkfifo": (lambda: os.mkfifo(j(s, "fifo")), srel + "/fifo"),
    }
    if os.path.isdir(j(root, nrel)):
        w[".no_exist marker"] = (lambda: os.open(j(root, nrel, "x.json"), os.O_WRONLY | os.O_CREAT,
                                                 0o644), nrel + "/x.json")
    else:
        w[".no_exist marker"] = (lambda: os.mkdir(j(root, nrel)), nrel)
    return w


def _write_errnos(root, repo, rev, blob):
    return {name: _try(fn) for name, (fn, _) in _client_writes(root, repo, rev, blob).items()}


def a_blob(repo):
    for e in FIX.entries:
        if e["path"].startswith(repo + "/blobs/") and e["type"] == "file":
            return e["path"].rsplit("/", 1)[1]
    raise AssertionError("no blob in " + repo)


class Containers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.local, cls.mnt = fresh("containers")
        cls.mount = wfstest.Mount(FIX.hub, cls.local, cls.mnt, ["allow_other", "auto_promote=off"]).start()
        cls.sock = wfstest.wait_ctl(cls.mnt)

    @classmethod
    def tearDownClass(cls):
        problems = cls.mount.stop()
        if problems:
            raise AssertionError("; ".join(problems))

    def test_readonly_bind_read_by_other_uid(self):
        """docker run -v MNT:/hub:ro --user 65534 -v LOCAL/wfs.sock:/run/wfs.sock"""
        ct = os.path.join(FIX.gen, "ct1")
        dst = os.path.join(ct, "hub")
        ctsock = os.path.join(ct, "run", "wfs.sock")
        os.makedirs(dst)
        os.makedirs(os.path.dirname(ctsock))
        open(ctsock, "w").close()
        for d in (ct, os.path.dirname(ctsock)):
            os.chmod(d, 0o755)
        entries = [(e["path"], e["sha256"], e["size"]) for e in FIX.readable()]
        self.assertGreater(len(entries), 20)
        shard = snap("models--acme--standard", "model-00001-of-00002.safetensors")["path"]
        repo, rev, blob = "models--acme--standard", rev_of("models--acme--standard"), \
            a_blob("models--acme--standard")

        def container():
            sh("mount", "--bind", self.mnt, dst)
            sh("mount", "-o", "remount,bind,ro", dst)
            sh("mount", "--bind", self.sock, ctsock)
            try:
                opts = wfstest.mount_entry(dst)[3].split(",")
                res, err = wfstest.as_uid(_read_all, dst, entries)
                bad, total = res if res else (None, None)
                writes, _ = wfstest.as_uid(_write_errnos, dst, repo, rev, blob)
                st = run_wfsctl(["--socket", ctsock, "--json", "status"], uid=NOBODY, timeout=30)
                st_plain = run_wfsctl(["--socket", ctsock, "status", dst], uid=NOBODY, timeout=30)
                pr = run_wfsctl(["--socket", ctsock, "promote", os.path.join(dst, shard)],
                                uid=NOBODY, timeout=30)
                ev = run_wfsctl(["--socket", ctsock, "evict", os.path.join(dst, shard)],
                                uid=NOBODY, timeout=30)
                return dict(opts=opts, bad=bad, total=total, read_err=err, writes=writes,
                            status=st, status_plain=st_plain, promote=pr, evict=ev)
            finally:
                subprocess_quiet("umount", ctsock)
                subprocess_quiet("umount", dst)

        data0 = wfstest.store_files(self.local)
        r = wfstest.in_mntns(container)
        self.assertIn("ro", r["opts"], "the bind mount is not read-only: %s" % r["opts"])
        self.assertIsNone(r["read_err"], "reading as uid %d: %s" % (NOBODY, wfstest.errname(r["read_err"])))
        self.assertEqual(r["bad"], [], "uid %d through the read-only bind" % NOBODY)
        self.assertEqual(r["total"], sum(e[2] for e in entries))
        # The read-only bind refuses at the VFS (EROFS); opening an existing
        # 0444 file for writing, and truncate, are refused by the permission
        # check that comes first (EACCES).  Nothing may succeed.
        kernel_perm_first = {"ref write (O_WRONLY)", "blob append", "blob O_RDWR", "truncate"}
        for name, e in r["writes"].items():
            want = (errno.EROFS, errno.EACCES) if name in kernel_perm_first else (errno.EROFS,)
            self.assertIn(e, want, "%s as uid %d in the container: %s" % (name, NOBODY, wfstest.errname(e)))
        rc, out, err = r["status"]
        self.assertEqual(rc, 0, "wfsctl --json status as uid %d through the socket bound into the "
                         "container: rc %s\n%s%s" % (NOBODY, rc, out, err))
        obj = wfstest.parse_json_out(out)
        self.assertTrue(obj and obj.get("ok"), out)
        self.assertIn("models--acme--standard", [x.get("repo") for x in obj.get("repos", [])])
        self.assertEqual(r["status_plain"][0], 0, r["status_plain"])
        for what in ("promote", "evict"):
            rc, out, err = r[what]
            self.assertNotEqual(rc, 0, "wfsctl %s as uid %d succeeded:\n%s%s" % (what, NOBODY, out, err))
            self.assertTrue("EPERM" in out + err or "only root" in out + err,
                            "wfsctl %s as uid %d: no permission error:\n%s%s" % (what, NOBODY, out, err))
        self.assertEqual(state_of(os.path.join(self.mnt, shard)), "nas")
        self.assertEqual(wfstest.store_files(self.local), data0, "LOCAL_STORE/data changed")

    def test_container_started_before_the_mount(self):
        """Mount propagation: a bind made before wfs mounts shows the mount
        only as a slave (rslave / HostToContainer), not as a private bind."""
        prop = os.path.join(FIX.gen, "prop")
        pmnt = os.path.join(prop, "mnt")
        plocal = os.path.join(FIX.gen, "prop-local")
        ct = os.path.join(FIX.gen, "ct2")
        os.makedirs(pmnt)
        for d in ("slave", "private"):
            os.makedirs(os.path.join(ct, d))
        sh("mount", "--bind", prop, prop)
        m = None
        try:
            sh("mount", "--make-shared", prop)
            ready_r, ready_w = os.pipe()
            go_r, go_w = os.pipe()
            e = snap("models--acme--standard", "config.json")

            def container():
                sh("mount", "--bind", pmnt, os.path.join(ct, "slave"))      # a slave of ours
                sh("mount", "--bind", pmnt, os.path.join(ct, "private"))
                sh("mount", "--make-private", os.path.join(ct, "private"))
                os.write(ready_w, b"r")
                if not select.select([go_r], [], [], 60)[0]:
                    raise AssertionError("no go from the test")
                os.read(go_r, 1)
                sees = wfstest.wait_until(
                    lambda: "models--acme--standard" in os.listdir(os.path.join(ct, "slave")), 5)
                got = wfstest.sha256_file(os.path.join(ct, "slave", e["path"])) if sees else None
                priv = os.listdir(os.path.join(ct, "private"))
                subprocess_quiet("umount", os.path.join(ct, "private"))
                subprocess_quiet("umount", "-R", os.path.join(ct, "slave"))
                return dict(sees=bool(sees), got=got, private=priv)

            child = wfstest.MntnsChild(container).start()
            self.assertTrue(select.select([ready_r], [], [], 30)[0], "the container never got ready")
            os.read(ready_r, 1)
            m = wfstest.Mount(FIX.hub, plocal, pmnt, ["allow_other", "auto_promote=off"]).start()
            os.write(go_w, b"g")
            r = child.result(60)
            for fd in (ready_r, ready_w, go_r, go_w):
                os.close(fd)
            self.assertTrue(r["sees"], "a slave bind made before the mount does not show it")
            self.assertEqual(r["got"], (e["sha256"], e["size"]))
            self.assertEqual(r["private"], [], "a private bind made before the mount shows it")
        finally:
            if m is not None:
                problems = m.stop()
                self.assertEqual(problems, [])
            subprocess_quiet("umount", prop)


def subprocess_quiet(*argv):
    import subprocess
    subprocess.run(list(argv), capture_output=True)


# ---------------------------------------------------------------- mount(8), fstab

class MountHelper(unittest.TestCase):
    """mount(8) runs /sbin/mount.fuse (fuse3's helper) for type fuse.wfs with
    PATH removed from the environment: the helper's /bin/sh looks for `wfs`
    in its default PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:
    /sbin:/bin).  The test puts the build's wfs there -- in a mount
    namespace of its own, over /usr/local/sbin -- as `meson install` would."""

    def test_mount_t_fuse_wfs_fstab_and_hash_form(self):
        for helper in ("/sbin/mount.fuse", "/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"):
            if os.path.exists(helper):
                break
        else:
            wfstest.skip_or_fail("no FUSE mount helper (/sbin/mount.fuse3, Debian package fuse3)")
        base = os.path.join(FIX.gen, "helper")
        bindir = os.path.join(base, "bin")
        os.makedirs(bindir)
        os.symlink(os.path.abspath(wfstest.wfs_bin()), os.path.join(bindir, "wfs"))
        cases = {}
        for name in ("type", "fstab", "hash"):
            cases[name] = fresh("helper-" + name)
        fstab = os.path.join(base, "fstab")
        with open(fstab, "w") as f:
            f.write("# wfs: the hub cache of the node\n")
            f.write("%s %s fuse.wfs local=%s,allow_other,nodev,nosuid,nofail,_netdev,"
                    "x-systemd.requires=network-online.target 0 0\n"
                    % (FIX.hub, cases["fstab"][1], cases["fstab"][0]))
        e = snap("models--acme--standard", "model-00002-of-00002.safetensors")

        def node():
            sh("mount", "--bind", bindir, "/usr/local/sbin")
            found = sh("env", "-i", "/bin/sh", "-c", "command -v wfs").strip()
            out = {"found": found}
            cmds = {
                "type": ["mount", "-t", "fuse.wfs", FIX.hub, cases["type"][1],
                         "-o", "local=%s,allow_other" % cases["type"][0]],
                "fstab": ["mount", "-T", fstab, cases["fstab"][1]],
                "hash": ["mount", "-t", "fuse", "%s#%s" % (os.path.abspath(wfstest.wfs_bin()), FIX.hub),
                         cases["hash"][1], "-o", "local=%s" % cases["hash"][0]],
            }
            for name, cmd in cmds.items():
                local, mnt = cases[name]
                if name == "hash":  # no wfs on the helper's PATH for this one
                    sh("umount", "/usr/local/sbin")
                import subprocess
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                   stdin=subprocess.DEVNULL)
                res = {"rc": r.returncode, "out": r.stdout + r.stderr}
                try:
                    ent = wfstest.mount_entry(mnt)
                    res["fstype"] = ent[2] if ent else None
                    res["opts"] = ent[3] if ent else None
                    if ent:
                        res["sha"] = wfstest.sha256_file(os.path.join(mnt, e["path"]))
                        res["status"] = run_wfsctl(["--json", "status", mnt], timeout=30)[0]
                        pid = pid_from_lock(local)
                        u = subprocess.run(["umount", mnt], capture_output=True, text=True)
                        res["umount"] = (u.returncode, u.stderr)
                        res["exited"] = bool(wfstest.wait_until(
                            lambda: pid is None or not wfstest.pid_alive(pid), 10))
                finally:
                    if wfstest.is_mounted(mnt):
                        pid = pid_from_lock(local)
                        subprocess_quiet("umount", "-l", mnt)
                        if pid and wfstest.wait_until(lambda: not wfstest.pid_alive(pid), 5) is False:
                            os.kill(pid, signal.SIGKILL)
                out[name] = res
            return out

        r = wfstest.in_mntns(node, timeout=180)
        self.assertEqual(r["found"], "/usr/local/sbin/wfs")
        for name in ("type", "fstab", "hash"):
            res = r[name]
            self.assertEqual(res["rc"], 0, "%s: mount failed: %s" % (name, res["out"]))
            self.assertEqual(res.get("fstype"), "fuse.wfs", "%s: %s" % (name, res))
            self.assertEqual(res.get("sha"), (e["sha256"], e["size"]), name)
            self.assertEqual(res.get("status"), 0, "%s: wfsctl status through the mount" % name)
            self.assertEqual(res.get("umount", (None,))[0], 0, "%s: umount %s" % (name, res.get("umount")))
            self.assertTrue(res.get("exited"), "%s: the daemon did not exit after umount" % name)
        self.assertIn("nosuid", r["fstab"]["opts"].split(","))
        self.assertIn("nodev", r["fstab"]["opts"].split(","))


# ---------------------------------------------------------------- clean shutdown

class CleanShutdown(unittest.TestCase):
    def stop_mid_copy(self, how):
        local, mnt = fresh("shutdown-" + how)
        small = smalls()
        m = wfstest.Mount(FIX.hub, local, mnt, ["promote_mbps=30", "auto_promote=off"]).start()
        try:
            wfstest.wait_ctl(mnt)
            ctl_check(self, ["promote", "--wait"] + [os.path.join(mnt, e["path"]) for e in small])
            data0 = {k: (s.st_ino, s.st_mtime_ns) for k, s in wfstest.store_files(local).items()}
            self.assertEqual(len(data0), len(small))
            bigp = os.path.join(mnt, BIG["snap"])
            ctl_check(self, ["promote", bigp])
            self.assertEqual(wait_state(bigp, ("copying",), 10, step=0.01), "copying")
            self.assertTrue(wfstest.wait_until(lambda: wfstest.tmp_entries(local), 10),
                            "no temporary file in LOCAL_STORE/tmp while copying")

            def big_copy():
                st = ctl_json(self, ["status", mnt])
                return next((c for c in st["copies"] if c.get("id") == BIG["sha256"]), None)
            copy = wfstest.wait_until(lambda: (big_copy() or {}).get("bytes_done", 0) >= 4 * MiB, 30)
            self.assertTrue(copy, "the copy of %s did not pass 4 MiB: %s" % (BIG["blob"], big_copy()))
            self.assertEqual(state_of(bigp), "copying", "the copy ended before the stop")
            pids = m.pids
            self.assertTrue(pids)
            if how == "sigterm":
                for p in pids:
                    os.kill(p, signal.SIGTERM)
            else:
                sh("umount", mnt)
            gone = wfstest.wait_until(lambda: not wfstest.is_mounted(mnt), 30)
            exited = wfstest.wait_until(lambda: not any(wfstest.pid_alive(p) for p in pids), 30)
        finally:
            if wfstest.is_mounted(mnt):
                m.stop()
        self.assertTrue(gone, "%s: the mount is still there" % how)
        self.assertTrue(exited, "%s: the daemon is still running" % how)
        self.assertEqual(wfstest.tmp_entries(local), [], "%s: LOCAL_STORE/tmp not empty" % how)
        with open(os.path.join(local, "index.json")) as f:
            idx = json.load(f)
        recs = idx.get("blobs", []) if isinstance(idx, dict) else []
        local_keys = sorted(r.get("key", "") for r in recs if r.get("state") == "local")
        self.assertEqual(len(local_keys), len(small), "index.json local entries: %s" % local_keys)
        for e in small:
            self.assertTrue(any(k.endswith("/" + e["nas_real"]) for k in local_keys),
                            "%s not local in index.json" % e["nas_real"])
        self.assertFalse(any(k.endswith(BIG["blob"]) for k in local_keys),
                         "%s: the stop waited for the copy in flight to end" % how)

        m = wfstest.Mount(FIX.hub, local, mnt, ["promote_mbps=30", "auto_promote=off"]).start()
        try:
            self.assertTrue(m.ready_on_return, "wfs returned before the next mount was there")
            wfstest.wait_ctl(mnt)
            for e in small:
                self.assertEqual(state_of(os.path.join(mnt, e["path"])), "local", e["path"])
                self.assertEqual(wfstest.sha256_file(os.path.join(mnt, e["path"])),
                                 (e["sha256"], e["size"]))
            self.assertEqual(state_of(os.path.join(mnt, BIG["snap"])), "nas")
            self.assertEqual({k: (s.st_ino, s.st_mtime_ns) for k, s in wfstest.store_files(local).items()},
                             data0, "copies verified before the stop were copied again")
        finally:
            problems = m.stop()
        self.assertEqual(problems, [])

    def test_sigterm_mid_promotion(self):
        self.stop_mid_copy("sigterm")

    def test_umount_mid_promotion(self):
        self.stop_mid_copy("umount")


# ---------------------------------------------------------------- metrics

class Metrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        wfstest.require_promtool()

    def test_stats_and_textfile_pass_promtool(self):
        local, mnt = fresh("metrics")
        tdir = os.path.join(FIX.gen, "textfile")
        os.makedirs(tdir)
        prom = os.path.join(tdir, "wfs.prom")
        m = wfstest.Mount(FIX.hub, local, mnt, ["allow_other", "auto_promote=off", "metrics_file=" + prom,
                                                "metrics_interval=1"]).start()
        try:
            wfstest.wait_ctl(mnt)
            small = smalls()
            reads = [snap("models--acme--standard", "model-00002-of-00002.safetensors"),
                     snap("models--acme--standard", "tokenizer.json")]
            for e in reads:
                self.assertEqual(wfstest.sha256_file(os.path.join(mnt, e["path"])), (e["sha256"], e["size"]))
            ctl_check(self, ["promote", "--wait"] + [os.path.join(mnt, e["path"]) for e in small])
            out, _ = ctl_check(self, ["stats", "--prometheus", mnt])
            ok, said = wfstest.promtool_check(out)
            self.assertTrue(ok, "promtool check metrics on wfsctl stats --prometheus:\n%s\n---\n%s"
                            % (said, out))
            v = wfstest.prom_samples(out)
            self.assertGreaterEqual(v['wfs_served_bytes_total{source="nas"}'], sum(e["size"] for e in reads))
            self.assertGreaterEqual(v["wfs_opens_total"], len(reads))
            # (>=: blobs read from the NAS may be promoted by themselves too)
            self.assertGreaterEqual(v["wfs_promotions_verified_total"], len(small))
            self.assertGreaterEqual(v["wfs_promotions_started_total"], v["wfs_promotions_verified_total"])
            self.assertGreaterEqual(v["wfs_store_blobs"], len(small))
            self.assertGreaterEqual(v["wfs_store_bytes"], sum(e["size"] for e in small))
            self.assertGreater(v["wfs_store_free_bytes"], 0)
            self.assertGreaterEqual(v['wfs_blobs{state="local"}'], len(small))
            for name in ("wfs_promotion_queue_depth", "wfs_promotions_in_flight",
                         "wfs_verification_mismatches_total", "wfs_evictions_total",
                         "wfs_passthrough_opens_total", 'wfs_promotions_failed_total{reason="no_space"}',
                         'wfs_promotions_failed_total{reason="io_error"}'):
                self.assertIn(name, v)
            # a local read: counted as local bytes, or as a passthrough open
            before = v['wfs_served_bytes_total{source="local"}'] + v["wfs_passthrough_opens_total"]
            self.assertEqual(wfstest.sha256_file(os.path.join(mnt, small[0]["path"])),
                             (small[0]["sha256"], small[0]["size"]))
            ctl_check(self, ["evict", os.path.join(mnt, small[1]["path"])])
            out2, _ = ctl_check(self, ["stats", "--prometheus", mnt])
            v2 = wfstest.prom_samples(out2)
            self.assertGreater(v2['wfs_served_bytes_total{source="local"}'] + v2["wfs_passthrough_opens_total"],
                               before)
            self.assertEqual(v2["wfs_evictions_total"], 1)
            self.assertEqual(v2["wfs_store_blobs"], v2['wfs_blobs{state="local"}'])

            import re
            families = set(re.findall(r"^# TYPE (\S+) ", out2, re.M))
            metrics_man = "\n".join(wfstest.text_section(wfstest.man_page("wfs.1"), ".SH METRICS", (".SH FSTAB",)))
            in_man = set(re.findall(r"^\.B (wfs_[a-z_]+)", metrics_man, re.M))
            self.assertEqual(sorted(families - in_man), [], "metrics not in wfs.1 METRICS")
            self.assertEqual(sorted(in_man - families), [], "wfs.1 METRICS names metrics wfs does not have")

            js = ctl_json(self, ["stats", mnt])
            self.assertGreaterEqual(js["metrics"]["promotions"]["verified"], len(small))
            self.assertEqual(js["metrics"]["evictions"], 1)
            human, _ = ctl_check(self, ["stats", mnt])
            self.assertIn("promotions", human)
            # the table's cells: counts by name, the routes by name
            self.assertRegex(human, r"\nblobs by state  (\S+=\d+ )*local=%d( |\n)"
                             % js["metrics"]["blobs"]["local"])
            self.assertRegex(human, r"\nroutes          passthrough \w+.*, io_uring \w+.*, "
                             r"fuse_uring \w+")
            rc, o, e = run_wfsctl(["stats", "--json", "--prometheus", mnt])
            self.assertEqual(rc, 2, "--json with --prometheus: %s %s" % (o, e))
            rc, o, e = run_wfsctl(["stats", "--prometheus", mnt], uid=NOBODY)
            self.assertEqual(rc, 0, "stats is read-only: uid %d may ask: %s%s" % (NOBODY, o, e))

            # the node-exporter textfile: whole, current, replaced atomically
            self.assertTrue(wfstest.wait_until(lambda: os.path.exists(prom), 30), "no %s" % prom)
            def evictions():
                return wfstest.prom_samples(wfstest.read_file(prom).decode()).get("wfs_evictions_total")
            ok_file = wfstest.wait_until(lambda: evictions() == 1, 30)
            with open(prom) as f:
                text = f.read()
            self.assertTrue(ok_file, "the textfile never showed the eviction:\n" + text)
            ok, said = wfstest.promtool_check(text)
            self.assertTrue(ok, "promtool check metrics on %s:\n%s" % (prom, said))
            m0 = os.stat(prom).st_mtime_ns
            self.assertTrue(wfstest.wait_until(lambda: os.stat(prom).st_mtime_ns != m0, 30),
                            "the textfile is not rewritten")
            self.assertEqual(stat.S_IMODE(os.stat(prom).st_mode), 0o644)
        finally:
            problems = m.stop()
        self.assertEqual(problems, [])
        self.assertFalse(os.path.exists(prom), "the textfile outlived the daemon")
        self.assertEqual(os.listdir(tdir), [], "leftovers in the textfile directory")

    def test_bad_metrics_file_refused(self):
        local, mnt = fresh("metrics-bad")
        for opt, word in (("metrics_file=relative.prom", "absolute"),
                          ("metrics_file=/nonexistent-dir-wfs/wfs.prom", "/nonexistent-dir-wfs"),
                          ("metrics_interval=0", "metrics_interval")):
            rc, out, err = wfstest.run_wfs(["-o", opt, FIX.hub, local, mnt])
            self.assertNotEqual(rc, 0, "-o %s accepted" % opt)
            self.assertIn(word, err, "-o %s: %s" % (opt, err))
            self.assertFalse(wfstest.is_mounted(mnt), "-o %s left a mount" % opt)


# ---------------------------------------------------------------- writes

class WritesRefused(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.local, cls.mnt = fresh("writes")
        cls.mount = wfstest.ForegroundMount(FIX.hub, cls.local, cls.mnt, ["allow_other", "auto_promote=off"]).start()
        wfstest.wait_ctl(cls.mnt)

    @classmethod
    def tearDownClass(cls):
        problems = cls.mount.stop()
        cls.mount.cleanup()
        if problems:
            raise AssertionError("; ".join(problems))

    def test_every_client_write_erofs_and_logged(self):
        repo = "models--acme--standard"
        rev, blob = rev_of(repo), a_blob(repo)
        before = nas_tree(FIX.hub)
        errs = _write_errnos(self.mnt, repo, rev, blob)
        rels = {n: rel for n, (_, rel) in _client_writes(self.mnt, repo, rev, blob).items()}
        self.assertEqual(set(rels), set(errs))

        def logged(rel, refused):
            return any(ln.rstrip().split(" of ", 1)[-1].startswith(rel + ":") for ln in refused)

        def refused_lines():
            lines = [ln for ln in self.mount.log().splitlines() if "refused" in ln]
            return lines if all(logged(rel, lines) for rel in rels.values()) else None
        # the daemon logs each refusal before replying; wait for the lines
        # rather than assume the log file has them
        wfstest.wait_until(refused_lines, 30, 0.05)
        refused = [ln for ln in self.mount.log().splitlines() if "refused" in ln]
        problems = []
        for name, e in errs.items():
            if e != errno.EROFS:
                problems.append("%s: %s, not EROFS" % (name, wfstest.errname(e)))
            rel = rels[name]
            if not logged(rel, refused):
                problems.append("%s: no log line naming %s" % (name, rel))
        self.assertEqual(problems, [], "log:\n" + "\n".join(refused))
        for ln in refused:
            self.assertRegex(ln, r"^\S+ wfs\[\w+\]: refused .+ of .+: read-only filesystem$")
        self.assertEqual(nas_tree(FIX.hub), before, "the NAS changed")

    def test_other_uid_refused(self):
        """Another uid is refused by the kernel's permission check (mode minus
        write bits, default_permissions) before the daemon sees the request:
        EACCES/EPERM rather than EROFS, and no log line."""
        repo = "models--acme--standard"
        rev, blob = rev_of(repo), a_blob(repo)
        before = nas_tree(FIX.hub)
        errs, _ = wfstest.as_uid(_write_errnos, self.mnt, repo, rev, blob)
        bad = {n: wfstest.errname(e) for n, e in errs.items()
               if e not in (errno.EROFS, errno.EACCES, errno.EPERM)}
        self.assertEqual(bad, {}, "writes by uid %d not refused" % NOBODY)
        self.assertEqual(nas_tree(FIX.hub), before, "the NAS changed")
        print("\n  uid %d: %s" % (NOBODY, ", ".join("%s %s" % (n, wfstest.errname(e))
                                                    for n, e in sorted(errs.items()))), file=sys.stderr)


# ---------------------------------------------------------------- systemd

def _unit_exec_lines(text, bindir):
    """The [Service] settings of a unit file: (env dict, [(key, argv, ignore_failure)])."""
    import shlex
    env, execs, section = {}, [], None
    for raw in text.replace("@BINDIR@", bindir).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section != "[Service]" or "=" not in line:
            continue
        key, val = line.split("=", 1)
        if key == "Environment":
            k, v = val.split("=", 1)
            env[k] = v
        elif key.startswith("Exec"):
            ignore = val.startswith("-")
            execs.append((key, shlex.split(val.lstrip("-")), ignore))
    return env, execs


def _systemd_argv(argv, env):
    """systemd's substitution: ${VAR} as a word -> one argument, $$ -> $."""
    import re
    out = []
    for a in argv:
        a = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), a)
        out.append(a.replace("$$", "$"))
    return out


class SystemdUnit(unittest.TestCase):
    """wfs@.service run the way systemd would (no systemd here): its
    ExecStartPre/ExecStart/ExecStartPost with the unit's environment and a
    conf file, SIGTERM to stop, and a restart over a dead mount."""

    def test_mount_unit_example_orders_without_a_cycle(self):
        """_netdev makes systemd order a mount before remote-fs.target: the
        example's After=remote-fs.target was a cycle (systemd dropped the
        hub mount or remote-fs.target at boot), and nothing ordered it after
        the NAS's mount or the store's disk."""
        with open(os.path.join(wfstest.REPO, "systemd", "wfs-hub.mount.example")) as f:
            keys = {}
            for line in f:
                if "=" in line and not line.startswith("#"):
                    k, v = line.strip().split("=", 1)
                    keys.setdefault(k, []).extend(v.split())
        self.assertIn("_netdev", keys["Options"][0].split(","))
        self.assertNotIn("remote-fs.target", keys.get("After", []))
        local = [o.split("=", 1)[1] for o in keys["Options"][0].split(",") if o.startswith("local=")]
        self.assertEqual(set(keys.get("RequiresMountsFor", [])), set(keys["What"] + local))

    def test_template_unit(self):
        import subprocess
        with open(os.path.join(wfstest.REPO, "systemd", "wfs@.service.in")) as f:
            text = f.read()
        base = os.path.join(FIX.gen, "unit")
        bindir = os.path.join(base, "bin")
        os.makedirs(bindir)
        os.symlink(os.path.abspath(wfstest.wfs_bin()), os.path.join(bindir, "wfs"))
        os.symlink(os.path.abspath(wfstest.wfsctl_bin()), os.path.join(bindir, "wfsctl"))
        env, execs = _unit_exec_lines(text.replace("%i", "test"), bindir)
        # the options wfs.conf.example sets, as an operator copies them (its
        # metrics_file= once named a directory only node-exporter makes:
        # wfs refused to start, and the unit restarted every 5 s)
        with open(os.path.join(wfstest.REPO, "systemd", "wfs.conf.example")) as f:
            opts = [l.split("=", 1)[1].strip() for l in f if l.startswith("WFS_OPTIONS=")]
        self.assertEqual(len(opts), 1, opts)
        env["WFS_OPTIONS"] = opts[0]
        self.assertEqual([k for k, _, _ in execs], ["ExecStartPre", "ExecStart", "ExecStartPost"])
        self.assertIn("WFS_LOCAL_STORE", env)
        self.assertIn("Type=forking", text)
        mnt = os.path.join(base, "mnt")   # made by ExecStartPre
        rev = rev_of("models--acme--standard")
        # a glob, as wfs.conf.example says WFS_PROMOTE may hold: it once
        # matched nothing, expanded in the unit's working directory /
        env.update(WFS_NAS_HUB=FIX.hub, WFS_MOUNTPOINT=mnt,
                   WFS_LOCAL_STORE=os.path.join(base, "local"),
                   WFS_PROMOTE="models--acme--standard/snapshots/%s models--acme--pa*" % rev)
        full = dict(os.environ, **env)

        def run(key):
            for k, argv, ignore in execs:
                if k == key:
                    r = subprocess.run(_systemd_argv(argv, env), env=full, capture_output=True,
                                       text=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")
                    self.assertTrue(r.returncode == 0 or ignore, "%s %s: rc %d\n%s%s"
                                    % (key, argv, r.returncode, r.stdout, r.stderr))
                    return r

        def daemon():
            """The live daemon's pid (wfs.lock gets it just after wfs returns)."""
            def live():
                p = pid_from_lock(env["WFS_LOCAL_STORE"])
                return p if p and wfstest.pid_alive(p) else None
            return wfstest.wait_until(live, 5)

        try:
            for key in ("ExecStartPre", "ExecStart"):
                run(key)
            self.assertTrue(wfstest.is_mounted(mnt), "ExecStart returned before the mount was ready")
            r = run("ExecStartPost")
            self.assertEqual(r.returncode, 0, "pre-staging failed: %s" % r.stderr[-2000:])
            for e in (snap("models--acme--standard", "model-00001-of-00002.safetensors"),
                      snap("models--acme--packs", "model.safetensors")):
                self.assertEqual(state_of(os.path.join(mnt, e["path"])), "local",
                                 "%s not pre-staged by ExecStartPost" % e["path"])
            # systemctl stop: SIGTERM to the main process
            pid = daemon()
            os.kill(pid, signal.SIGTERM)
            self.assertTrue(wfstest.wait_until(lambda: not wfstest.is_mounted(mnt), 10))
            self.assertTrue(wfstest.wait_until(lambda: not wfstest.pid_alive(pid), 10))
            # a crash leaves a dead mount: Restart= runs ExecStartPre, which clears it
            run("ExecStart")
            pid = daemon()
            os.kill(pid, signal.SIGKILL)
            self.assertTrue(wfstest.wait_until(lambda: not wfstest.pid_alive(pid), 10))
            self.assertTrue(wfstest.is_mounted(mnt))
            # (the leader is a zombie before its last thread lets go of /dev/fuse)
            self.assertTrue(wfstest.wait_until(lambda: _try(lambda: os.stat(mnt)) == errno.ENOTCONN, 5),
                            "the mount is not dead after kill -9 of the daemon")
            run("ExecStartPre")
            self.assertFalse(wfstest.is_mounted(mnt), "ExecStartPre left the dead mount")
            run("ExecStart")
            self.assertEqual(state_of(os.path.join(mnt, snap("models--acme--packs", "model.safetensors")["path"])),
                             "local", "the copies verified before the crash")
            pid = daemon()
            os.kill(pid, signal.SIGTERM)
            self.assertTrue(wfstest.wait_until(lambda: not wfstest.is_mounted(mnt), 10))
        finally:
            if wfstest.is_mounted(mnt):
                pid = daemon()
                subprocess_quiet("umount", "-l", mnt)
                if pid:
                    wfstest.wait_until(lambda: not wfstest.pid_alive(pid), 5)


if __name__ == "__main__":
    wfstest.main()
