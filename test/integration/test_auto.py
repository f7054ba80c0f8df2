#!/usr/bin/env python3
"""Automatic promotion, exclusions, and revisions as the unit -- through a
real mount, read with real system calls, no wfsctl call unless the test is
about wfsctl:

  Hot            reading a blob through the mount past the threshold makes it
                 local by itself; less than the threshold does not
  Off            with -o auto_promote=off nothing becomes local, however much
                 is read
  Siblings       a hot shard queues the other shards of its revision
                 (model-0000N-of-0000M.*, and files a weight_map lists with it)
  Exclusions     excluded paths stay on the NAS however hot; wfsctl promote of
                 an excluded path says so and needs --force
  Priority       an explicit promote is served while an automatic copy runs:
                 it is done before the capped automatic copy is
  RefPin         wfsctl pin --ref main: the revision is local and pinned; when
                 refs/main moves the new one is, the old one is unpinned (not
                 what is pinned by hand too), and the pin survives a remount
"""

import hashlib
import json
import mmap
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_json, run_wfsctl, state_of  # noqa: E402

MiB = 1 << 20
REPO = "models--acme--auto"
REFREPO = "models--acme--ref"
AUTO_MBPS = 4          # the automatic copies' cap in this file (MB/s)
# hot after 2 MiB from the NAS; opens do not count (reads are what the tests drive)
OPTS = ["auto_bytes=2M", "auto_opens=0", "auto_mbps=%d" % AUTO_MBPS, "exclude=*/pack/*",
        "exclude=*.gguf", "ref_poll=0.3", "copy_workers=2"]


NBARRIERS = 8          # small files read to fence the policy thread (policy_barrier)


def ref_pin(tc, m, repo):
    """The ref pin of `repo` in the status of mount `m` ({} if none).
    Asked on the control socket itself, not through wfsctl: tests poll it."""
    rep = wfstest.ctl_request(os.path.join(m.local, "wfs.sock"), {"op": "status"}, timeout=60)
    tc.assertTrue(rep and rep.get("ok"), "status of %s: %r" % (m.mnt, rep))
    return next((r for r in rep.get("ref_pins", []) if r.get("repo") == repo), None) or {}


class Fix:
    base = hub = None
    mounts = {}
    files = {}      # snapshot name -> bytes
    rev = None
    barriers = 0    # barrier files used so far


def snap(name, repo=REPO, rev=None):
    return os.path.join(Fix.mounts["on"].mnt, repo, "snapshots", rev or Fix.rev, name)


def build_hub(hub):
    f = {}
    for i in range(1, 5):
        f["model-%05d-of-00004.safetensors" % i] = wfstest.det_bytes("shard%d" % i, 3 * MiB)
    f["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": {
        "w%d" % i: "model-%05d-of-00004.safetensors" % i for i in range(1, 5)}}).encode()
    for p in "abc":
        f["part-%s.safetensors" % p] = wfstest.det_bytes("part" + p, 3 * MiB)
    f["consolidated.safetensors.index.json"] = json.dumps({"weight_map": {
        "x": "part-a.safetensors", "y": "part-b.safetensors"}}).encode()
    f["big.bin"] = wfstest.det_bytes("big", 8 * MiB)
    f["partial.bin"] = wfstest.det_bytes("partial", 8 * MiB)
    f["slow.bin"] = wfstest.det_bytes("slow", 16 * MiB)
    f["fast.bin"] = wfstest.det_bytes("fast", 4 * MiB)
    f["config.json"] = b'{"model_type": "test"}\n'
    f["q4.gguf"] = wfstest.det_bytes("gguf", 3 * MiB)
    f["pack/extra.bin"] = wfstest.det_bytes("pack", 3 * MiB)
    for i in range(NBARRIERS):
        f["barrier-%02d.bin" % i] = wfstest.det_bytes("barrier%d" % i, 4096)
    Fix.files = f
    Fix.rev = wfstest.make_hf_repo(hub, REPO, f, real=("pack/extra.bin",))
    Fix.ref_rev1 = wfstest.make_hf_repo(hub, REFREPO, {
        "a.bin": wfstest.det_bytes("ref-a", MiB), "shared.bin": wfstest.det_bytes("ref-s", MiB)},
        commit="1" * 40)


def setUpModule():
    wfstest.require_mount_capability()
    wfstest.require_wfsctl()
    Fix.base = wfstest.make_base("wfs-it-auto-")
    try:
        Fix.hub = os.path.join(Fix.base, "hub")
        build_hub(Fix.hub)
        # "off" reads the refs it pins once an hour (RefPinSettles)
        for name, opts in (("on", OPTS), ("off", ["auto_promote=off", "ref_poll=3600"])):
            local, mnt = os.path.join(Fix.base, "local-" + name), os.path.join(Fix.base, "mnt-" + name)
            os.mkdir(mnt)
            Fix.mounts[name] = wfstest.Mount(Fix.hub, local, mnt, opts).start()
            wfstest.wait_ctl(mnt)
    except BaseException:
        tearDownModule(raise_problems=False)
        raise


def tearDownModule(raise_problems=True):
    problems = []
    for m in Fix.mounts.values():
        problems += m.stop()
    Fix.mounts = {}
    if Fix.base and not any(wfstest.is_mounted(os.path.join(Fix.base, d))
                            for d in os.listdir(Fix.base) if d.startswith("mnt")):
        import shutil
        shutil.rmtree(Fix.base, ignore_errors=True)
    if problems and raise_problems:
        raise AssertionError("teardown: " + "; ".join(problems))


def read_through(path, limit=None):
    """Read a file through the mount with plain read(2): all of it, or the
    first `limit` bytes."""
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        while limit is None or len(out) < limit:
            b = f.read(MiB if limit is None else min(MiB, limit - len(out)))
            if not b:
                break
            out += b
    return bytes(out)


def policy_barrier(tc):
    """Wait until the daemon's policy thread has dealt with every blob that
    became hot before this call.  A read marks a blob hot before it returns;
    the policy thread takes hot blobs in that order, queueing each or holding
    it (excluded).  So once a fresh small blob, read in full now (hot: smaller
    than auto_bytes), is queued or further, every earlier one was handled."""
    tc.assertLess(Fix.barriers, NBARRIERS, "no barrier file left: raise NBARRIERS")
    name = "barrier-%02d.bin" % Fix.barriers
    Fix.barriers += 1
    p = snap(name)
    tc.assertEqual(read_through(p), Fix.files[name])
    st = wfstest.wait_state(p, ("queued", "copying", "local"), 60)
    tc.assertIn(st, ("queued", "copying", "local"),
                "%s read in full did not get queued: the policy thread is stuck" % name)


class Hot(unittest.TestCase):
    def test_read_past_threshold_promotes_without_wfsctl(self):
        p = snap("big.bin")
        self.assertEqual(state_of(p), "nas")
        t0 = time.monotonic()
        self.assertTrue(read_through(p) == Fix.files["big.bin"], "bytes read from the NAS differ")
        left = wfstest.wait_states([p], "local", 30)
        took = time.monotonic() - t0
        self.assertEqual(left, {}, "8 MiB read through the mount (threshold 2 MiB): not promoted")
        print("\n  big.bin (8 MiB) read once: local %.1f s later (auto cap %d MB/s)"
              % (took, AUTO_MBPS), file=sys.stderr)
        wfstest.drop_pages(p)
        self.assertTrue(read_through(p) == Fix.files["big.bin"], "bytes read from the copy differ")
        st = ctl_json(self, ["status", Fix.mounts["on"].mnt])
        self.assertGreaterEqual(st.get("auto", {}).get("queued", 0), 1, st.get("auto"))

    def test_read_below_threshold_stays_on_nas(self):
        p = snap("partial.bin")
        # The daemon counts what it serves.  O_DIRECT: the kernel asks it for
        # these bytes once -- no read-ahead, and no page cache that a
        # drop_caches beside this test (test/run's solo lane) could empty
        # mid-read, making the kernel ask for the rest again.
        fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, MiB)   # page-aligned, as O_DIRECT wants
        try:
            self.assertEqual(os.preadv(fd, [buf], 0), MiB)
            self.assertEqual(buf[:], Fix.files["partial.bin"][:MiB])
        finally:
            os.close(fd)
            buf.close()
        policy_barrier(self)
        self.assertEqual(state_of(p), "nas", "1 MiB of 8 read (threshold 2 MiB)")
        st = ctl_json(self, ["status", Fix.mounts["on"].mnt])
        self.assertLess(st["served"]["nas_bytes"], 100 * MiB)

    def test_refs_are_never_copied(self):
        # A ref is rewritten in place on the NAS: a copy of it would serve
        # an old commit.  Read past every threshold (its size), it stays on
        # the NAS, a rewrite shows on the next open, and promote refuses it.
        ref = os.path.join(Fix.mounts["on"].mnt, REPO, "refs", "main")
        nas = os.path.join(Fix.hub, REPO, "refs", "main")
        with open(nas, "rb") as f:
            orig = f.read()

        def restore():
            with open(nas, "wb") as f:
                f.write(orig)
        for _ in range(5):
            self.assertEqual(read_through(ref), orig)
        policy_barrier(self)
        self.assertEqual(state_of(ref), "nas", "refs/main read 5 times (hot threshold: its size)")
        self.addCleanup(restore)
        new = hashlib.sha1(orig).hexdigest().encode()
        with open(nas, "wb") as f:   # in place, as huggingface_hub writes it
            f.write(new)
        self.assertEqual(read_through(ref), new, "the open right after the rewrite")
        rc, out, err = run_wfsctl(["promote", ref])
        self.assertIsNotNone(rc, "wfsctl promote did not finish")
        self.assertNotEqual(rc, 0, "wfsctl promote of a ref exited 0: %s%s" % (out, err))
        self.assertIn(REPO + "/refs/main", err)
        self.assertIn("not weight data", err)
        self.assertEqual(state_of(ref), "nas")


class Off(unittest.TestCase):
    def test_auto_off_promotes_nothing(self):
        m = Fix.mounts["off"]
        snapdir = os.path.join(m.mnt, REPO, "snapshots", Fix.rev)
        paths = [os.path.join(snapdir, n) for n in Fix.files]
        for _ in range(3):
            for p in paths:
                self.assertTrue(read_through(p) == Fix.files[os.path.relpath(p, snapdir)], p)
                wfstest.drop_pages(p)
        # The read that passes a threshold marks the blob hot before it
        # returns; with auto_promote=off no read does, so nothing is to come.
        st = ctl_json(self, ["status", m.mnt])
        self.assertIs(st.get("policy", {}).get("auto"), False, st.get("policy"))
        self.assertEqual((st["auto"]["queued"], st["store"]["queued"], st["store"]["copying"],
                          st["copies"]), (0, 0, 0, []), "copies queued with auto_promote=off")
        states = {os.path.relpath(p, snapdir): state_of(p) for p in paths}
        self.assertEqual({k: v for k, v in states.items() if v != "nas"}, {},
                         "with auto_promote=off, reading everything 3 times promoted these")
        self.assertEqual(wfstest.store_files(m.local), {}, "LOCAL_STORE/data is not empty")
        self.assertGreater(st["served"]["nas_bytes"], 3 * sum(map(len, Fix.files.values())) // 2)


class RefPinSettles(unittest.TestCase):
    def test_settles_when_its_copies_land(self):
        """A ref pin's revision, all local, is the one it keeps from then
        on -- status no longer says it is moving to it -- without waiting
        for the next read of the ref (ref_poll: an hour on this mount)."""
        m = Fix.mounts["off"]
        repo, rev = "models--acme--settle", "5" * 40
        files = {"a.bin": wfstest.det_bytes("settle-a", 2 * MiB),
                 "b.bin": wfstest.det_bytes("settle-b", MiB)}
        wfstest.make_hf_repo(Fix.hub, repo, files, commit=rev)
        out, _ = wfstest.ctl_check(self, ["pin", "--ref", "main", os.path.join(m.mnt, repo)])
        # leave the store as found (Off asserts it holds nothing)
        self.addCleanup(run_wfsctl, ["evict", os.path.join(m.mnt, repo)])
        self.addCleanup(run_wfsctl, ["unpin", "--ref", "main", os.path.join(m.mnt, repo)])
        self.assertIn(rev, out)
        paths = [os.path.join(m.mnt, repo, "snapshots", rev, n) for n in files]
        self.assertEqual(wfstest.wait_states(paths, "local", 60), {})

        def pin():
            return ref_pin(self, m, repo)
        ok = wfstest.wait_until(lambda: (pin().get("commit"), pin().get("pending")) == (rev, ""),
                                60, 0.2)
        self.assertTrue(ok, "the ref pin's revision is local, but the pin still waits for the "
                        "next ref_poll: %s" % pin())
        for p in paths:
            self.assertTrue(read_through(p) == files[os.path.basename(p)], p)


class Siblings(unittest.TestCase):
    def test_hot_shard_queues_its_siblings(self):
        shards = [snap("model-%05d-of-00004.safetensors" % i) for i in range(1, 5)]
        self.assertEqual({state_of(p) for p in shards}, {"nas"})
        # the engine opens the snapshot name; the kernel follows the link to blobs/<id>
        self.assertTrue(read_through(shards[1]) == Fix.files["model-00002-of-00004.safetensors"])
        t0 = time.monotonic()
        left = wfstest.wait_states(shards, "local", 40)
        self.assertEqual(left, {}, "reading shard 2 of 4 did not bring its siblings local")
        print("\n  shard 2 of 4 read: all 4 shards (12 MiB) local %.1f s later"
              % (time.monotonic() - t0), file=sys.stderr)
        for i, p in enumerate(shards, 1):
            wfstest.drop_pages(p)
            self.assertTrue(read_through(p) == Fix.files["model-%05d-of-00004.safetensors" % i], p)

    def test_weight_map_lists_siblings(self):
        a, b, c = (snap("part-%s.safetensors" % x) for x in "abc")
        self.assertTrue(read_through(b) == Fix.files["part-b.safetensors"])
        left = wfstest.wait_states([a, b], "local", 30)
        self.assertEqual(left, {}, "part-b read; part-a is in the same weight_map")
        policy_barrier(self)
        self.assertEqual(state_of(c), "nas", "part-c is in no weight_map with part-b")


class Exclusions(unittest.TestCase):
    def test_excluded_paths_stay_on_nas(self):
        pack, gguf = snap("pack/extra.bin"), snap("q4.gguf")
        for _ in range(3):
            for p, n in ((pack, "pack/extra.bin"), (gguf, "q4.gguf")):
                self.assertTrue(read_through(p) == Fix.files[n], p)
                wfstest.drop_pages(p)
        gid = hashlib.sha256(Fix.files["q4.gguf"]).hexdigest()

        def held_now():
            st = ctl_json(self, ["status", Fix.mounts["on"].mnt])
            h = {x.get("id"): x for x in st.get("held", [])}
            names = [x.get("name") or "" for x in h.values() if x.get("hold") == "excluded"]
            return h if gid in h and any(n.endswith("/pack/extra.bin") for n in names) else None
        held = wfstest.wait_until(held_now, 30, 0.1)
        self.assertTrue(held, "the excluded files, read past the threshold, are not held as "
                        "excluded in wfsctl status")
        self.assertEqual((state_of(pack), state_of(gguf)), ("nas", "nas"),
                         "excluded files read 3 times past the threshold")
        self.assertEqual(held[gid].get("hold"), "excluded")
        self.assertIn("*.gguf", held[gid].get("reason", ""))
        out = run_wfsctl(["status", Fix.mounts["on"].mnt])[1]
        self.assertIn("excluded by '*/pack/*'", out, "human status:\n" + out)

    def test_explicit_promote_of_excluded_path_needs_force(self):
        pack = snap("pack/extra.bin")
        rc, out, err = run_wfsctl(["promote", "--wait", pack])
        self.assertEqual(rc, 1, "promote of an excluded path exited %s\n%s%s" % (rc, out, err))
        self.assertIn("excluded", err, "no word of the exclusion:\n" + err)
        self.assertIn("--force", err)
        self.assertEqual(state_of(pack), "nas")
        # a repo holding excluded files: the rest is promoted, the excluded are not
        gguf = snap("q4.gguf")
        rc, out, err = run_wfsctl(["promote", "--wait", os.path.join(Fix.mounts["on"].mnt, REPO)])
        self.assertEqual(rc, 0, "promote of the repo: rc %s\n%s%s" % (rc, out, err))
        self.assertIn("excluded", out)
        self.assertEqual((state_of(gguf), state_of(pack)), ("nas", "nas"))
        self.assertEqual(state_of(snap("config.json")), "local")
        # --force
        wfstest.ctl_check(self, ["promote", "--wait", "--force", pack])
        self.assertEqual(state_of(pack), "local")
        self.assertTrue(read_through(pack) == Fix.files["pack/extra.bin"])
        wfstest.ctl_check(self, ["evict", os.path.join(Fix.mounts["on"].mnt, REPO)])


    def test_promote_of_a_directory_all_excluded(self):
        """promote of a directory every file of which an exclusion glob
        keeps on the NAS (pack/, by */pack/*) says there is nothing to
        promote, names the glob and --force, and exits 1 -- it prints no
        "0 blobs local" report that reads as success first."""
        pack = snap("pack")
        for extra in ([], ["--wait"]):
            rc, out, err = run_wfsctl(["promote"] + extra + [pack])
            self.assertEqual((rc, out), (1, ""), "promote %s of pack/: %s" % (extra, err))
            self.assertIn(": nothing to promote: its one blob is excluded by '*/pack/*' "
                          "(wfs -o exclude) and kept on the NAS; --force promotes it anyway", err)
            self.assertEqual(state_of(snap("pack/extra.bin")), "nas")
            rep = wfstest.parse_json_out(run_wfsctl(["--json", "promote"] + extra + [pack])[1])
            self.assertEqual(([r.get("glob") for r in rep["refused"]], rep["refused"][0].get("count"),
                              rep["blobs"]), (["*/pack/*"], 1, []), rep)

    def test_promote_by_blob_name_honours_exclusions(self):
        """A blob is excluded when any of its names is: naming it as
        <repo>/blobs/<id> (or promoting <repo>/blobs) does not get past a
        glob its snapshot name matches."""
        repo = os.path.join(Fix.mounts["on"].mnt, REPO)
        gid = hashlib.sha256(Fix.files["q4.gguf"]).hexdigest()
        gblob, gguf = os.path.join(repo, "blobs", gid), snap("q4.gguf")
        rc, out, err = run_wfsctl(["promote", "--wait", gblob])
        self.assertEqual(rc, 1, "promote of an excluded blob by its blobs/ name exited %s\n%s%s"
                         % (rc, out, err))
        self.assertIn("excluded by '*.gguf'", err, "no word of the exclusion:\n" + err)
        self.assertEqual(state_of(gblob), "nas")
        rc, out, err = run_wfsctl(["--json", "promote", "--dry-run", gblob])
        rep = wfstest.parse_json_out(out) or {}
        self.assertEqual(rc, 1, "dry run of an excluded blob: %s%s" % (out, err))
        self.assertEqual([(e.get("glob"), e.get("name")) for e in rep.get("refused", [])],
                         [("*.gguf", "%s/snapshots/%s/q4.gguf" % (REPO, Fix.rev))], rep)
        self.assertEqual(rep.get("bytes_to_copy"), 0, rep)
        # the whole blobs/ directory: the rest is promoted, the excluded blob is not
        rc, out, err = run_wfsctl(["promote", "--wait", os.path.join(repo, "blobs")])
        self.assertEqual(rc, 0, "promote of blobs/: rc %s\n%s%s" % (rc, out, err))
        self.assertIn("excluded", out)
        self.assertEqual((state_of(gblob), state_of(gguf)), ("nas", "nas"))
        self.assertEqual(state_of(snap("config.json")), "local")
        wfstest.ctl_check(self, ["promote", "--wait", "--force", gblob])
        self.assertEqual(state_of(gguf), "local")
        self.assertTrue(read_through(gguf) == Fix.files["q4.gguf"])
        wfstest.ctl_check(self, ["evict", repo])


    def test_ranges_of_an_excluded_file_need_force(self):
        """promote --range / --part of a file an exclusion glob matches is
        refused like a whole promote of it (exit 1, the glob named, nothing
        copied) unless --force."""
        import struct
        repo = "models--acme--exclparts"
        hdr = json.dumps({"w": {"dtype": "U8", "shape": [8, 4096],
                                "data_offsets": [0, 8 * 4096]}}).encode()
        st = struct.pack("<Q", len(hdr)) + hdr + wfstest.det_bytes("st", 8 * 4096)
        rev = wfstest.make_hf_repo(Fix.hub, repo, {"x.gguf": wfstest.det_bytes("xg", 3 * MiB),
                                                   "pack/w.safetensors": st})
        mnt = Fix.mounts["on"].mnt
        gguf = os.path.join(mnt, repo, "snapshots", rev, "x.gguf")
        stp = os.path.join(mnt, repo, "snapshots", rev, "pack", "w.safetensors")
        for args, path, glob in ((["--range", "0:64K", "--range", "1M:4K"], gguf, "*.gguf"),
                                 (["--part", "2/4"], stp, "*/pack/*")):
            for extra in ([], ["--wait"], ["--pin"]):
                rc, out, err = run_wfsctl(["promote"] + extra + args + [path])
                self.assertEqual(rc, 1, "promote %s of an excluded file: rc %s\n%s%s"
                                 % (" ".join(extra + args), rc, out, err))
                self.assertIn("excluded by '%s'" % glob, err)
                self.assertIn("--force", err)
                self.assertEqual(state_of(path), "nas")
            rc, out, err = run_wfsctl(["--json", "promote", "--dry-run"] + args + [path])
            rep = wfstest.parse_json_out(out) or {}
            self.assertEqual(rc, 1, "dry run: %s%s" % (out, err))
            self.assertEqual([e.get("glob") for e in rep.get("refused", [])], [glob], rep)
            self.assertTrue(rep.get("ranges"), "a dry run still lists the ranges: %s" % rep)
            self.assertEqual(rep.get("bytes_to_copy"), 0, rep)
            # --force stages them
            rep = ctl_json(self, ["promote", "--wait", "--force"] + args + [path])
            self.assertEqual([b.get("state") for b in rep.get("blobs", [])], ["partial"], rep)
            self.assertEqual(state_of(path), "partial")
        wfstest.ctl_check(self, ["evict", os.path.join(mnt, repo)])
        self.assertEqual((state_of(gguf), state_of(stp)), ("nas", "nas"))


class Priority(unittest.TestCase):
    def test_explicit_goes_first(self):
        slow, fast = snap("slow.bin"), snap("fast.bin")
        self.assertTrue(read_through(slow, 3 * MiB) == Fix.files["slow.bin"][:3 * MiB])
        st = wfstest.wait_state(slow, ("copying",), 30, step=0.01)
        self.assertEqual(st, "copying", "the automatic copy of slow.bin did not start")
        wfstest.ctl_check(self, ["promote", "--wait", fast])
        during = state_of(slow)
        self.assertEqual(state_of(fast), "local")
        # 16 MiB at the automatic cap of 4 MB/s take 4 s at least: an explicit
        # promote queued behind it would end after it
        self.assertEqual(during, "copying", "the explicit promote of fast.bin ended after the "
                         "automatic copy it was asked during")
        left = wfstest.wait_states([slow], "local", 60)
        self.assertEqual(left, {}, "slow.bin never became local")


class RefPin(unittest.TestCase):
    def test_pin_ref_follows_the_ref(self):
        m = Fix.mounts["on"]
        repo = os.path.join(m.mnt, REFREPO)
        rev1, rev2 = Fix.ref_rev1, "2" * 40
        a1 = os.path.join(repo, "snapshots", rev1, "a.bin")
        out, _ = wfstest.ctl_check(self, ["pin", "--ref", "main", repo])
        self.assertIn(rev1, out)

        def pin_state():
            return ref_pin(self, m, REFREPO)
        ok = wfstest.wait_until(lambda: pin_state().get("commit") == rev1, 20, 0.2)
        self.assertTrue(ok, "the ref pin never settled on %s: %s" % (rev1, pin_state()))
        files1 = [os.path.join(repo, "snapshots", rev1, n) for n in ("a.bin", "shared.bin")]
        self.assertEqual(wfstest.wait_states(files1, "local", 5), {})
        self.assertTrue(wfstest.blob_pinned(self, a1), "rev1 blobs are not pinned")

        # refs/main moves on the NAS to a revision sharing one blob
        wfstest.make_hf_repo(Fix.hub, REFREPO, {"b.bin": wfstest.det_bytes("ref-b", MiB),
                                                "shared.bin": wfstest.det_bytes("ref-s", MiB)},
                             commit=rev2)
        ok = wfstest.wait_until(lambda: pin_state().get("commit") == rev2
                                and not pin_state().get("pending"), 30, 0.2)
        self.assertTrue(ok, "the ref pin did not follow refs/main to %s: %s" % (rev2, pin_state()))
        b2 = os.path.join(repo, "snapshots", rev2, "b.bin")
        s2 = os.path.join(repo, "snapshots", rev2, "shared.bin")
        self.assertEqual(wfstest.wait_states([b2, s2], "local", 5), {})
        self.assertTrue(wfstest.blob_pinned(self, b2), "rev2's new blob is not pinned")
        self.assertTrue(wfstest.blob_pinned(self, s2), "the blob both revisions share was unpinned")
        self.assertFalse(wfstest.blob_pinned(self, a1), "rev1's own blob is still pinned")
        self.assertTrue(read_through(b2) == wfstest.det_bytes("ref-b", MiB))

        # kept across a remount
        problems = m.stop()
        self.assertEqual(problems, [])
        Fix.mounts["on"] = m = wfstest.Mount(Fix.hub, m.local, m.mnt, OPTS).start()
        wfstest.wait_ctl(m.mnt)
        self.assertEqual(pin_state().get("commit"), rev2, "ref pin lost at the remount")
        rc, out, err = run_wfsctl(["status", m.mnt])
        self.assertIn("%s refs/main -> %s" % (REFREPO, rev2), out, "human status:\n" + out)
        wfstest.ctl_check(self, ["unpin", "--ref", "main", repo])
        self.assertFalse(wfstest.blob_pinned(self, b2))
        self.assertEqual(pin_state(), {}, "the ref pin is still there after unpin --ref")

    def test_ref_pins_leave_hand_pins_alone(self):
        """A blob pinned by hand (wfsctl pin PATH) stays pinned when a ref
        pin holding it too moves on, and when that ref pin is dropped
        (unpin --ref), across a remount as well: each pin is undone only by
        its own unpin.  A blob only the ref pin held is unpinned."""
        m = Fix.mounts["on"]
        repo = "models--acme--refhand"
        rev1, rev2 = "c" * 40, "d" * 40
        wfstest.make_hf_repo(Fix.hub, repo, {"hand.bin": wfstest.det_bytes("rh-hand", MiB),
                                             "ref.bin": wfstest.det_bytes("rh-ref", MiB)},
                             commit=rev1)

        def f(rev, name):
            return os.path.join(m.mnt, repo, "snapshots", rev, name)

        def pin_state():
            return ref_pin(self, m, repo)

        def why(path):
            rep = ctl_json(self, ["promote", "--dry-run", "--force", path])
            return (rep.get("blobs") or [{}])[0].get("pinned_by")

        hand1, ref1 = f(rev1, "hand.bin"), f(rev1, "ref.bin")
        wfstest.ctl_check(self, ["pin", hand1])
        wfstest.ctl_check(self, ["pin", "--ref", "main", os.path.join(m.mnt, repo)])
        ok = wfstest.wait_until(lambda: pin_state().get("commit") == rev1, 20, 0.1)
        self.assertTrue(ok, "the ref pin never settled on %s: %s" % (rev1, pin_state()))
        self.assertEqual(wfstest.wait_states([hand1, ref1], "local", 5), {})

        # refs/main moves to a revision holding neither blob
        wfstest.make_hf_repo(Fix.hub, repo, {"new.bin": wfstest.det_bytes("rh-new", MiB),
                                             "both.bin": wfstest.det_bytes("rh-both", MiB)},
                             commit=rev2)
        ok = wfstest.wait_until(lambda: (pin_state().get("commit"), pin_state().get("pending"))
                                == (rev2, ""), 30, 0.1)
        self.assertTrue(ok, "the ref pin did not follow refs/main to %s: %s" % (rev2, pin_state()))
        self.assertTrue(wfstest.blob_pinned(self, hand1),
                        "the hand pin was lost when the ref pin moved on")
        self.assertEqual(why(hand1), ["hand"])
        self.assertFalse(wfstest.blob_pinned(self, ref1), "rev1's ref-only blob still pinned")
        rc, out, err = run_wfsctl(["evict", hand1])
        self.assertEqual((rc, state_of(hand1)), (1, "local"), "evict of a hand pin: %s%s"
                         % (out, err))

        # both pins on one blob of rev2; both reasons survive a remount
        new2, both2 = f(rev2, "new.bin"), f(rev2, "both.bin")
        wfstest.ctl_check(self, ["pin", both2])
        problems = m.stop()
        self.assertEqual(problems, [])
        Fix.mounts["on"] = m = wfstest.Mount(Fix.hub, m.local, m.mnt, OPTS).start()
        wfstest.wait_ctl(m.mnt)
        self.assertEqual((why(hand1), why(both2), why(new2)), (["hand"], ["hand", "ref"], ["ref"]),
                         "pins after a remount")
        # a hand unpin leaves the ref pin's reason, and says so
        out, _ = wfstest.ctl_check(self, ["unpin", new2])
        self.assertIn("1 still pinned by a ref pin", out)
        self.assertEqual(why(new2), ["ref"])

        wfstest.ctl_check(self, ["unpin", "--ref", "main", os.path.join(m.mnt, repo)])
        self.assertTrue(wfstest.blob_pinned(self, both2), "unpin --ref unpinned a hand pin")
        self.assertTrue(wfstest.blob_pinned(self, hand1), "unpin --ref unpinned a hand pin")
        self.assertFalse(wfstest.blob_pinned(self, new2), "unpin --ref left its blob pinned")
        wfstest.ctl_check(self, ["unpin", hand1, both2])
        self.assertEqual((why(hand1), why(both2)), ([], []))
        wfstest.ctl_check(self, ["evict", os.path.join(m.mnt, repo)])

    def test_pin_ref_counts_what_it_pins(self):
        """pin --ref reports the blobs it pinned: not the excluded ones."""
        m = Fix.mounts["on"]
        repo = "models--acme--refcount"
        wfstest.make_hf_repo(Fix.hub, repo, {"a.bin": wfstest.det_bytes("rc-a", MiB),
                                             "x.gguf": wfstest.det_bytes("rc-x", MiB)})
        path = os.path.join(m.mnt, repo)
        rep = ctl_json(self, ["pin", "--ref", "main", path])
        self.assertEqual(rep.get("count"), 1, rep)
        out, _ = wfstest.ctl_check(self, ["unpin", "--ref", "main", path])
        self.assertIn("1 blob unpinned", out)


def make_bad_rev(repo, commit):
    """A revision of `repo` that can never become local: good.bin, and
    bad.bin whose blob's name (a SHA-256) is not its content's (mismatch).
    refs/main names it."""
    wfstest.make_hf_repo(Fix.hub, repo, {"good.bin": wfstest.det_bytes(commit + "good", MiB)},
                         commit=commit, ref=None)
    data = wfstest.det_bytes(commit + "bad", MiB)
    sha = hashlib.sha256(b"not " + data).hexdigest()
    with open(os.path.join(Fix.hub, repo, "blobs", sha), "wb") as f:
        f.write(data)
    os.symlink("../../blobs/" + sha, os.path.join(Fix.hub, repo, "snapshots", commit, "bad.bin"))
    wfstest.set_hf_ref(Fix.hub, repo, "main", commit)


class RefPinDropped(unittest.TestCase):
    """A revision a ref pin moves to but that never becomes local is dropped
    (unpinned, no longer pending) when the ref moves back, whether the poll
    sees it (ref_poll) or pin --ref is run again."""

    def pinned_by_rev(self, m, repo):
        st = ctl_json(self, ["status", os.path.join(m.mnt, repo)])
        return {v["rev"]: v.get("pinned_files") for v in st["repos"][0]["revisions"]}

    def move_to_bad_and_back(self, m, repo, by_pin):
        rev_a, rev_b = "a" * 40, "b" * 40
        path = os.path.join(m.mnt, repo)
        wfstest.make_hf_repo(Fix.hub, repo, {"a.bin": wfstest.det_bytes(repo + "a", MiB)},
                             commit=rev_a)
        wfstest.ctl_check(self, ["pin", "--ref", "main", path])
        ok = wfstest.wait_until(lambda: ref_pin(self, m, repo).get("commit") == rev_a, 20, 0.1)
        self.assertTrue(ok, "the ref pin never settled on A: %s" % ref_pin(self, m, repo))
        make_bad_rev(repo, rev_b)
        if by_pin:
            wfstest.ctl_check(self, ["pin", "--ref", "main", path])

        def stuck_on_b():
            st = ref_pin(self, m, repo)
            return (st.get("pending") == rev_b and "moving to " + rev_b in st.get("reason", "")
                    and self.pinned_by_rev(m, repo).get(rev_b) == 2)
        ok = wfstest.wait_until(stuck_on_b, 30, 0.1)
        self.assertTrue(ok, "the pin did not start moving to B: %s %s"
                        % (ref_pin(self, m, repo), self.pinned_by_rev(m, repo)))
        wfstest.set_hf_ref(Fix.hub, repo, "main", rev_a)
        if by_pin:
            out, _ = wfstest.ctl_check(self, ["pin", "--ref", "main", path])
            self.assertIn(rev_a, out)

        def back_on_a():
            st = ref_pin(self, m, repo)
            return (st.get("commit"), st.get("pending"), st.get("reason")) == (rev_a, "", "") \
                and self.pinned_by_rev(m, repo) == {rev_a: 1, rev_b: 0}
        ok = wfstest.wait_until(back_on_a, 30, 0.1)
        self.assertTrue(ok, "B was not dropped when the ref moved back to A: %s %s"
                        % (ref_pin(self, m, repo), self.pinned_by_rev(m, repo)))
        rc, out, err = run_wfsctl(["status", m.mnt])
        self.assertNotIn("moving to", out, "a stale reason in status:\n" + out)
        wfstest.ctl_check(self, ["unpin", "--ref", "main", path])
        self.assertEqual(self.pinned_by_rev(m, repo), {rev_a: 0, rev_b: 0})
        self.assertEqual(ref_pin(self, m, repo), {})

    def test_ref_moves_back_seen_by_the_poll(self):
        self.move_to_bad_and_back(Fix.mounts["on"], "models--acme--refback", False)

    def test_pin_ref_again_after_the_ref_moved_back(self):
        # the mount without auto-promotion polls refs every 5 s: pin --ref
        # sees both moves first (the poll may too: the outcome is the same)
        self.move_to_bad_and_back(Fix.mounts["off"], "models--acme--repin", True)


if __name__ == "__main__":
    wfstest.main()
