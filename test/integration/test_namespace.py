#!/usr/bin/env python3
"""The tree the mount presents, entry by entry, against the manifest and the
NAS: types, bytes, link texts, where links lead, inodes, readdir, modes,
xattrs."""

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from ns_fix import FIX, Base, sha256, snapshot_parts  # noqa: E402,F401
import ns_readdir  # noqa: E402


def setUpModule():
    FIX.setup()


def tearDownModule():
    FIX.teardown()


class Readdir(ns_readdir.Readdir):
    """ns_readdir.py's listing tests, run here: in this module, so on this
    module's mount (a class of another module would have unittest tear the
    mount down first)."""


class Types(Base):
    def test_fixture_sanity(self):
        # the manifest must exercise every case the spec names, otherwise the
        # other tests check less than they claim
        kinds = {(e["type"], e.get("follow")) for e in FIX.entries}
        for k in [("dir", None), ("file", None), ("link", "file"), ("link", "dir"),
                  ("link", "ENOENT"), ("link", "ELOOP"), ("link", "escape")]:
            self.assertIn(k, kinds, "manifest has no entry of kind %r" % (k,))

    def test_lstat_type_matches(self):
        want = {"dir": stat.S_ISDIR, "file": stat.S_ISREG, "link": stat.S_ISLNK}
        bad = []
        for e in FIX.entries:
            try:
                st = os.lstat(FIX.m(e["path"]))
            except OSError as ex:
                bad.append("%s: lstat -> %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            if not want[e["type"]](st.st_mode):
                bad.append("%s: expected %s, mode %o" % (e["path"], e["type"], st.st_mode))
        self.assertNone(bad, "lstat type")

    def test_mount_root_is_directory(self):
        self.assertTrue(stat.S_ISDIR(os.lstat(FIX.mnt).st_mode))


class Files(Base):
    def test_file_bytes_equal_nas_and_manifest(self):
        bad = []
        for e in FIX.of("file"):
            p = FIX.m(e["path"])
            try:
                data = wfstest.read_file(p)
                st = os.stat(p)
            except OSError as ex:
                bad.append("%s: %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            nas = wfstest.read_file(FIX.n(e["nas_real"]))
            if sha256(nas) != e["sha256"]:
                bad.append("%s: FIXTURE: NAS file %s does not match manifest sha256"
                           % (e["path"], e["nas_real"]))
            if sha256(data) != e["sha256"]:
                bad.append("%s: sha256 of mount bytes differs from manifest (read %d bytes, want %d)"
                           % (e["path"], len(data), e["size"]))
            elif data != nas:
                bad.append("%s: bytes differ from NAS %s" % (e["path"], e["nas_real"]))
            if st.st_size != e["size"]:
                bad.append("%s: st_size %d, want %d" % (e["path"], st.st_size, e["size"]))
        self.assertNone(bad, "regular file content")


class Links(Base):
    def test_readlink_exact(self):
        bad = []
        for e in FIX.of("link"):
            try:
                t = os.readlink(FIX.m(e["path"]))
            except OSError as ex:
                bad.append("%s: readlink -> %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            if t != e["target"]:
                bad.append("%s: readlink %r, want %r" % (e["path"], t, e["target"]))
            if e["follow"] in ("file", "dir") and t.startswith("/"):
                bad.append("%s: link into the hub is absolute: %r" % (e["path"], t))
        self.assertNone(bad, "readlink")

    def test_snapshot_link_depth(self):
        # independent of the manifest's target text: huggingface_hub writes
        # relpath(blobs/<id>, dirname(link)) = ../../blobs/<id> + one ../ per level
        bad, n = [], 0
        for e in FIX.of("link", "file"):
            sp = snapshot_parts(e["path"])
            if sp is None or "blob_id" not in e:
                continue
            n += 1
            want = "../" * (2 + sp[1]) + "blobs/" + e["blob_id"]
            t = os.readlink(FIX.m(e["path"]))
            if t != want:
                bad.append("%s: readlink %r, want %r (depth %d)" % (e["path"], t, want, sp[1]))
        self.assertGreater(n, 0, "no snapshot links to blobs in the manifest")
        self.assertTrue(any(snapshot_parts(e["path"])[1] > 0 for e in FIX.of("link", "file")
                            if snapshot_parts(e["path"])),
                        "manifest has no nested snapshot link (depth > 0)")
        self.assertNone(bad, "snapshot link depth")

    def test_link_lstat_size_is_text_length(self):
        bad = []
        for e in FIX.of("link"):
            st = os.lstat(FIX.m(e["path"]))
            if st.st_size != len(os.fsencode(e["target"])):
                bad.append("%s: lstat st_size %d, readlink text is %d bytes"
                           % (e["path"], st.st_size, len(os.fsencode(e["target"]))))
        self.assertNone(bad, "symlink st_size")

    def test_follow_file_bytes_and_realpath(self):
        bad = []
        for e in FIX.of("link", "file"):
            p = FIX.m(e["path"])
            try:
                data = wfstest.read_file(p)
            except OSError as ex:
                bad.append("%s: open/read through link -> %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            if sha256(data) != e["sha256"]:
                bad.append("%s: sha256 differs from manifest (%d bytes read)" % (e["path"], len(data)))
            elif data != wfstest.read_file(FIX.n(e["nas_real"])):
                bad.append("%s: bytes differ from NAS %s" % (e["path"], e["nas_real"]))
            rp = os.path.realpath(p)
            if not rp.startswith(FIX.mnt + "/"):
                bad.append("%s: realpath leaves the mount: %s" % (e["path"], rp))
                continue
            sp = snapshot_parts(e["path"])
            if "blob_id" in e and sp is not None:
                want = FIX.m(sp[0] + "/blobs/" + e["blob_id"])
                if rp != want:
                    bad.append("%s: realpath %s, want %s" % (e["path"], rp, want))
            if not stat.S_ISREG(os.lstat(rp).st_mode):
                bad.append("%s: realpath %s is not a regular file" % (e["path"], rp))
        self.assertNone(bad, "links with follow=file")

    def test_follow_dir(self):
        if not FIX.of("link", "dir"):
            wfstest.skip_or_fail("the fixture (test/mkhub) has no link resolving to a directory")
        bad = []
        for e in FIX.of("link", "dir"):
            p = FIX.m(e["path"])
            try:
                st = os.stat(p)
            except OSError as ex:
                bad.append("%s: stat -> %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            if not stat.S_ISDIR(st.st_mode):
                bad.append("%s: following gives mode %o, not a directory" % (e["path"], st.st_mode))
            rp = os.path.realpath(p)
            if not rp.startswith(FIX.mnt + "/"):
                bad.append("%s: realpath leaves the mount: %s" % (e["path"], rp))
        self.assertNone(bad, "links with follow=dir")

    def _follow_errno(self, follow, want):
        bad, n = [], 0
        for e in FIX.of("link", follow):
            n += 1
            p = FIX.m(e["path"])
            got = wfstest.errno_of(lambda: open(p, "rb").close())
            if got != want:
                bad.append("%s: open -> %s, want %s" % (e["path"], wfstest.errname(got),
                                                         wfstest.errname(want)))
            got = wfstest.errno_of(os.stat, p)
            if got != want:
                bad.append("%s: stat -> %s, want %s" % (e["path"], wfstest.errname(got),
                                                         wfstest.errname(want)))
        self.assertGreater(n, 0)
        self.assertNone(bad, "links with follow=%s" % follow)

    def test_follow_dangling_enoent(self):
        self._follow_errno("ENOENT", errno.ENOENT)

    def test_follow_loop_eloop(self):
        self._follow_errno("ELOOP", errno.ELOOP)

    def test_realpath_stays_inside_mount(self):
        bad = []
        for e in FIX.entries:
            if e.get("follow") in ("escape", "ENOENT", "ELOOP"):
                continue
            rp = os.path.realpath(FIX.m(e["path"]))
            if not rp.startswith(FIX.mnt + "/"):
                bad.append("%s: realpath %s" % (e["path"], rp))
        self.assertNone(bad, "realpath outside the mount")


class GivenSpelling(Base):
    def test_absolute_links_through_the_hub_path_as_named(self):
        """NAS_HUB named through a link (/home -> /data/home): the hub-level
        store's absolute links written with that spelling stay in the mount
        (a blob is a file, its snapshot entry ../../blobs/<id>), so reads
        are the mount's -- not the NAS's behind the mount's back."""
        base = wfstest.make_base("wfs-spelling-")
        self.addCleanup(shutil.rmtree, base, True)
        os.makedirs(os.path.join(base, "data", "hub"))
        os.symlink(os.path.join(base, "data"), os.path.join(base, "home"))
        hub = os.path.join(base, "home", "hub")  # NAS_HUB, as named
        data = wfstest.det_bytes("spelling", 5000)
        rev = wfstest.make_hf_repo(hub, "models--given--spelling", {"model.safetensors": data})
        blobs = os.path.join(hub, "models--given--spelling", "blobs")
        sha = os.listdir(blobs)[0]
        os.makedirs(os.path.join(hub, "blobs", sha[:2]))
        os.rename(os.path.join(blobs, sha), os.path.join(hub, "blobs", sha[:2], sha))
        os.symlink(os.path.join(hub, "blobs", sha[:2], sha), os.path.join(blobs, sha))
        mnt = os.path.join(base, "mnt")
        os.mkdir(mnt)
        mount = wfstest.ForegroundMount(hub, os.path.join(base, "local"), mnt,
                                        ["auto_promote=off"]).start()
        self.addCleanup(mount.cleanup)
        self.addCleanup(mount.stop)
        repo = os.path.join(mnt, "models--given--spelling")
        self.assertTrue(stat.S_ISREG(os.lstat(os.path.join(repo, "blobs", sha)).st_mode),
                        "blobs/%s: not a file of the mount" % sha)
        snap = os.path.join(repo, "snapshots", rev, "model.safetensors")
        self.assertEqual(os.readlink(snap), "../../blobs/" + sha)
        self.assertEqual(os.path.realpath(snap), os.path.join(repo, "blobs", sha))
        self.assertEqual(wfstest.read_file(snap), data)


class Escape(Base):
    def test_escape_is_link(self):
        bad = []
        esc = FIX.of("link", "escape")
        self.assertTrue(esc, "manifest has no escaping link")
        for e in esc:
            st = os.lstat(FIX.m(e["path"]))
            if not stat.S_ISLNK(st.st_mode):
                bad.append("%s: lstat mode %o, must stay a symlink" % (e["path"], st.st_mode))
        self.assertNone(bad, "escaping links")

    def test_no_regular_file_contains_secret(self):
        bad, nfiles = [], 0
        for root, dirs, files in os.walk(FIX.mnt, followlinks=False):
            for name in files + dirs:
                p = os.path.join(root, name)
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode):
                    continue
                nfiles += 1
                try:
                    data = wfstest.read_file(p)
                except OSError as ex:
                    bad.append("%s: read -> %s" % (p, wfstest.errname(ex.errno)))
                    continue
                if b"WFS-SECRET" in data:
                    bad.append("%s: regular file (mode %o) holds the outside secret"
                               % (os.path.relpath(p, FIX.mnt), st.st_mode))
        self.assertEqual(nfiles, len(FIX.of("file")), "walk found a different number of regular files")
        self.assertNone(bad, "secret exposed")

    def test_nonroot_cannot_read_escape(self):
        # control: uid 65534 can read an ordinary file of the mount, else the
        # check below would pass for the wrong reason
        f = FIX.of("file")[0]
        data, err = wfstest.as_uid(wfstest.read_file, FIX.m(f["path"]))
        self.assertIsNone(err, "uid 65534 cannot read %s through the mount: %s (mounted with allow_other)"
                          % (f["path"], wfstest.errname(err)))
        self.assertEqual(sha256(data), f["sha256"])
        bad = []
        for e in FIX.of("link", "escape"):
            data, err = wfstest.as_uid(wfstest.read_file, FIX.m(e["path"]))
            if err is None:
                bad.append("%s: uid 65534 read %d bytes%s" % (e["path"], len(data),
                           " INCLUDING THE SECRET" if b"WFS-SECRET" in data else ""))
        self.assertNone(bad, "escaping link readable by uid 65534")


class Inodes(Base):
    def test_nodes_follow_the_kernel(self):
        """`stats` fs_nodes counts the inodes the daemon keeps for the
        kernel: one more per name looked up, and back down once the kernel
        forgets them (a cache drop) -- a count that stays up is a leak."""
        sock = os.path.join(FIX.local, "wfs.sock")

        def nodes():
            rep = wfstest.ctl_request(sock, {"op": "stats"})
            self.assertTrue(rep and rep.get("ok"), rep)
            return rep["metrics"]["fs_nodes"]
        files = [e for e in FIX.readable() if e["type"] == "file"]
        distinct = len({e["nas_real"] for e in files})
        # The kernel sends a cache drop's FORGETs after drop_caches returns,
        # so `base` may still count nodes about to go; it is only an upper
        # bound on where the count settles.  Each check below holds
        # whenever those FORGETs arrive.
        wfstest.drop_caches()
        base = nodes()
        for e in files:
            os.lstat(FIX.m(e["path"]))
        looked_up = nodes()
        self.assertGreater(looked_up, distinct,
                           "fs_nodes %d after lstat of %d files (%d distinct NAS files, "
                           "and the root)" % (looked_up, len(files), distinct))
        settle = min(base, looked_up - distinct)

        def settled():
            """One drop_caches may leave unused inodes cached: its passes
            stop once one frees few objects, and an inode just let go by
            its dentry is only marked on the first pass that meets it
            (measured: a drop after a walk of 124 nodes left 50 in 12 of 15
            tries, the next drop none).  So drop again until the count
            settles; a node the daemon leaks never does."""
            if nodes() <= settle:
                return True
            wfstest.drop_caches()
            return False
        self.assertTrue(wfstest.wait_until(settled, 10, 0.2),
                        "fs_nodes still %d after cache drops (it was %d before the "
                        "lookups, %d with them)" % (nodes(), base, looked_up))

    def test_same_nas_file_same_inode(self):
        groups = {}
        for e in FIX.readable():
            groups.setdefault(e["nas_real"], []).append(e["path"])
        self.assertTrue(any(len(v) > 1 for v in groups.values()),
                        "manifest has no NAS file reached by two paths")
        bad = []
        ino_sha = {}
        for real, paths in groups.items():
            inos = {}
            for p in paths:
                try:
                    st = os.stat(FIX.m(p))
                except OSError as ex:
                    bad.append("%s: stat -> %s" % (p, wfstest.errname(ex.errno)))
                    continue
                inos.setdefault(st.st_ino, []).append(p)
                ino_sha.setdefault(st.st_ino, set()).add(FIX.by_path[p]["sha256"])
            if len(inos) > 1:
                bad.append("NAS %s served under %d inodes: %s" % (real, len(inos), inos))
        for ino, shas in ino_sha.items():
            if len(shas) > 1:
                bad.append("inode %d serves %d different contents" % (ino, len(shas)))
        self.assertNone(bad, "inode identity")

    def test_two_filesystems_two_inodes(self):
        """Blobs in a store on a filesystem of its own (-o root=), beside
        NAS_HUB's: the mount shows one st_dev for all, so files of the two
        that have the same inode number on their own filesystems must not
        share an st_ino (os.path.samefile, du, cp -a would take them for
        one file).  Two tmpfs number their inodes alike from 1."""
        base = wfstest.make_base("wfs-twofs-")
        self.addCleanup(shutil.rmtree, base, True)
        hub, store = os.path.join(base, "hub"), os.path.join(base, "store")
        for d in (hub, store):
            os.mkdir(d)
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True)
            self.addCleanup(subprocess.run, ["umount", "-l", d])
        files = {"f%02d.bin" % i: wfstest.det_bytes("twofs%d" % i, 100 + i) for i in range(24)}
        wfstest.make_hf_repo(hub, "models--two--fs", files)
        blobs = os.path.join(hub, "models--two--fs", "blobs")
        for sha in sorted(os.listdir(blobs))[:12]:  # half of them into the store
            shutil.move(os.path.join(blobs, sha), os.path.join(store, sha))
            os.symlink(os.path.join(store, sha), os.path.join(blobs, sha))
        nas = {os.stat(os.path.join(blobs, s)).st_ino for s in os.listdir(blobs)}
        self.assertLess(len(nas), len(files), "no inode number is on both filesystems")
        mnt = os.path.join(base, "mnt")
        os.mkdir(mnt)
        mount = wfstest.ForegroundMount(hub, os.path.join(base, "local"), mnt,
                                        ["auto_promote=off", "root=" + store]).start()
        self.addCleanup(mount.cleanup)
        self.addCleanup(mount.stop)
        snap = os.path.join(mnt, "models--two--fs", "snapshots")
        snap = os.path.join(snap, os.listdir(snap)[0])
        inos = {}
        for name, data in files.items():
            with open(os.path.join(snap, name), "rb") as f:
                self.assertEqual(f.read(), data, name)
                inos.setdefault(os.fstat(f.fileno()).st_ino, []).append(name)
        self.assertEqual({i: n for i, n in inos.items() if len(n) > 1}, {},
                         "different files shown with one st_ino")
        for sha in os.listdir(os.path.join(mnt, "models--two--fs", "blobs")):
            self.assertIn(os.stat(os.path.join(mnt, "models--two--fs", "blobs", sha)).st_ino,
                          inos, "blobs/%s: st_ino not the one its snapshot name shows" % sha)


class SnapshotFile(Base):
    def test_plain_file_size_follows_the_nas(self):
        """A plain file in a snapshot (huggingface_hub without links writes
        the file itself there) seen while it was written: its new size
        shows within a few attr_timeouts, not after blob_timeout (60 s: a
        reader's mmap was cut to the old size for a minute)."""
        snap = sorted({os.path.dirname(e["path"]) for e in FIX.readable()
                       if snapshot_parts(e["path"]) and snapshot_parts(e["path"])[1] == 0})[0]
        rel = snap + "/written-in-place.bin"
        with open(FIX.n(rel), "wb") as f:
            f.write(b"a" * 1000)
        try:
            self.assertEqual(os.stat(FIX.m(rel)).st_size, 1000)
            with open(FIX.n(rel), "ab") as f:
                f.write(b"b" * 9000)
            deadline, size = time.monotonic() + 10, None
            while time.monotonic() < deadline:
                with open(FIX.m(rel), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                if size == 10000:
                    break
                time.sleep(0.1)
            self.assertEqual(size, 10000, "the size seen through the mount 10 s after the file "
                             "grew on the NAS")
        finally:
            os.unlink(FIX.n(rel))


class ReusedInode(Base):
    def test_new_file_on_a_deleted_blobs_inode_number(self):
        """A file the NAS makes with the inode number of a blob deleted
        while the kernel still holds its node (ext4 gives the lowest free
        one in the directory's group): it is its own file -- no blob id,
        and its size follows the NAS (it took the blob's id and its 60 s
        attribute time)."""
        repo = sorted({e["path"].split("/")[0] for e in FIX.readable()
                       if "/blobs/" in e["path"]})[0]
        blob = repo + "/blobs/" + "ab" * 32
        with open(FIX.n(blob), "wb") as f:
            f.write(b"x" * 40)
        made, made_dir = [], False
        try:
            # looked up, never opened: the kernel keeps its node (its
            # dentry, blob_timeout), and nothing holds the NAS inode
            self.assertEqual(os.stat(FIX.m(blob)).st_size, 40)
            self.assertEqual(os.getxattr(FIX.m(blob), "user.wfs.id").decode(), "ab" * 32)
            ino = os.stat(FIX.n(blob)).st_ino
            os.unlink(FIX.n(blob))
            new = None
            if not os.path.isdir(FIX.n(repo + "/trees")):
                os.mkdir(FIX.n(repo + "/trees"))
                made_dir = True
            for i in range(2000):
                rel = repo + "/trees/reused-%d.json" % i
                with open(FIX.n(rel), "wb") as f:
                    f.write(b"y" * 5)
                made.append(rel)
                if os.stat(FIX.n(rel)).st_ino == ino:
                    new = rel
                    break
            self.assertIsNotNone(new, "no new file took inode %d in 2000 tries" % ino)
            self.assertEqual(os.stat(FIX.m(new)).st_size, 5)
            self.assertEqual(wfstest.errno_of(os.getxattr, FIX.m(new), "user.wfs.id"),
                             errno.ENODATA, "the new file took the deleted blob's id")
            with open(FIX.n(new), "ab") as f:
                f.write(b"z" * 95)
            deadline, size = time.monotonic() + 10, None
            while time.monotonic() < deadline:
                size = os.stat(FIX.m(new)).st_size
                if size == 100:
                    break
                time.sleep(0.1)
            self.assertEqual(size, 100, "its size 10 s after it grew on the NAS")
        finally:
            for rel in made:
                os.unlink(FIX.n(rel))
            if made_dir:
                os.rmdir(FIX.n(repo + "/trees"))

    def test_blob_on_a_deleted_plain_files_inode_number(self):
        """A snapshot's plain file, promoted (its node holds a blob, and no
        blob id), then deleted; a repo blob the NAS makes on its inode
        number while the kernel holds the old node took that node and its
        blob: promoted in turn, it stayed "nas" and was read from the NAS,
        its own copy unused."""
        repo = sorted({e["path"].split("/")[0] for e in FIX.readable()
                       if "/blobs/" in e["path"]})[0]
        rev = os.listdir(FIX.n(repo + "/snapshots"))[0]
        plain = "%s/snapshots/%s/reused-plain.bin" % (repo, rev)
        with open(FIX.n(plain), "wb") as f:
            f.write(wfstest.det_bytes("reused-plain", 70000))
        made = [plain]
        try:
            wfstest.ctl_check(self, ["promote", "--wait", FIX.m(plain)])
            self.assertEqual(wfstest.state_of(FIX.m(plain)), "local")
            # opened: its node takes its blob
            self.assertEqual(wfstest.read_file(FIX.m(plain)), wfstest.det_bytes("reused-plain", 70000))
            ino = os.stat(FIX.n(plain)).st_ino
            os.unlink(FIX.n(plain))
            made.remove(plain)
            new = data = None
            for i in range(2000):
                data = wfstest.det_bytes("reused-blob-%d" % i, 5000)
                rel = repo + "/blobs/" + sha256(data)
                with open(FIX.n(rel), "wb") as f:
                    f.write(data)
                made.append(rel)
                if os.stat(FIX.n(rel)).st_ino == ino:
                    new = rel
                    break
            self.assertIsNotNone(new, "no new file took inode %d in 2000 tries" % ino)
            wfstest.ctl_check(self, ["promote", "--wait", FIX.m(new)])
            self.assertEqual(sha256(wfstest.read_file(FIX.m(new))), sha256(data))
            self.assertEqual(wfstest.state_of(FIX.m(new)), "local",
                             "a blob promoted on a deleted plain file's inode number, read")
        finally:
            for rel in made:
                os.unlink(FIX.n(rel))


class Modes(Base):
    def test_no_write_bits(self):
        bad = []
        st = os.lstat(FIX.mnt)
        if st.st_mode & 0o222:
            bad.append("mount root: mode %o" % stat.S_IMODE(st.st_mode))
        for e in FIX.entries:
            if e["type"] == "link":
                continue  # symlink permission bits are not used by Linux
            st = os.lstat(FIX.m(e["path"]))
            if st.st_mode & 0o222:
                bad.append("%s: mode %o has write bits" % (e["path"], stat.S_IMODE(st.st_mode)))
        self.assertNone(bad, "write bits")

    def test_mode_is_nas_mode_without_write_bits(self):
        bad = []
        for e in FIX.entries:
            # unambiguous cases: directories, and files that are themselves the NAS file
            if not (e["type"] == "dir" or (e["type"] == "file" and e["nas_real"] == e["path"])):
                continue
            want = stat.S_IMODE(os.lstat(FIX.n(e["path"])).st_mode) & ~0o222
            got = stat.S_IMODE(os.lstat(FIX.m(e["path"])).st_mode)
            if got != want:
                bad.append("%s: mode %o, NAS mode minus write bits is %o" % (e["path"], got, want))
        self.assertNone(bad, "modes")


class Doctor(Base):
    """`wfsctl doctor` lists exactly the links the mount shows as they are."""

    def test_doctor_lists_broken_links(self):
        want = {e["path"]: {"ENOENT": "dangling", "ELOOP": "loop", "escape": "escapes"}[e["follow"]]
                for e in FIX.manifest["entries"]
                if e["type"] == "link" and e.get("follow") in ("ENOENT", "ELOOP", "escape")}
        self.assertTrue(want, "the fixture has broken links")
        rc, out, err = wfstest.run_wfsctl(["--json", "doctor", FIX.mnt])
        self.assertEqual(rc, 1, "doctor must exit 1 when it lists problems: %s %s" % (out, err))
        rep = json.loads(out)
        got = {l["path"]: l["problem"] for l in rep["links"]}
        self.assertEqual(got, want)
        self.assertEqual(rep["link_problems"], len(want))
        self.assertEqual(rep["entries"], len(FIX.manifest["entries"]) + 1)  # + the root
        # a part of the tree without problems: exit 0
        clean = next(e["path"] for e in FIX.manifest["entries"]
                     if e["path"].count("/") == 0 and e["path"].startswith("models--")
                     and "broken" not in e["path"])
        rc, out, err = wfstest.run_wfsctl(["doctor", os.path.join(FIX.mnt, clean)])
        self.assertEqual(rc, 0, "doctor of %s: %s %s" % (clean, out, err))

    def test_doctor_of_a_path_not_there(self):
        """A PATH not in the hub (a typo) is an error naming it, as for the
        other commands: not "checked 0 entries" and exit 0."""
        missing = "models--acme--no-such-repo"
        rc, out, err = wfstest.run_wfsctl(["doctor", os.path.join(FIX.mnt, missing)])
        self.assertEqual(rc, 1, "doctor of %s: %s %s" % (missing, out, err))
        self.assertIn("wfsctl: doctor: %s: No such file or directory [ENOENT]" % missing, err)
        rep = wfstest.ctl_request(wfstest.socket_of(FIX.mnt), {"op": "doctor", "path": missing})
        self.assertEqual((rep.get("ok"), rep.get("errno")), (False, "ENOENT"), rep)


class Xattrs(Base):
    def test_state_is_nas(self):
        bad = []
        for e in FIX.readable():
            try:
                v = os.getxattr(FIX.m(e["path"]), "user.wfs.state")
            except OSError as ex:
                bad.append("%s: getxattr user.wfs.state -> %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            if v != b"nas":
                bad.append("%s: user.wfs.state = %r" % (e["path"], v))
        self.assertNone(bad, "user.wfs.state")

    def test_id_is_blob_id(self):
        bad, n = [], 0
        for e in FIX.readable():
            if "blob_id" not in e:
                continue
            n += 1
            try:
                v = os.getxattr(FIX.m(e["path"]), "user.wfs.id")  # follows links to the blob
            except OSError as ex:
                bad.append("%s: getxattr user.wfs.id -> %s" % (e["path"], wfstest.errname(ex.errno)))
                continue
            if v != e["blob_id"].encode():
                bad.append("%s: user.wfs.id = %r, want %r" % (e["path"], v, e["blob_id"]))
        self.assertGreater(n, 0)
        self.assertNone(bad, "user.wfs.id")

    def test_xattr_questions_make_no_blob(self):
        """ls -l asks every entry for security.selinux and its ACLs: each
        such question made a blob in the store's table (kept for the
        mount's life), so a listing of a large hub grew the daemon.  No
        xattr question makes one; user.wfs.state still answers."""
        def blobs():
            rc, out, err = wfstest.run_wfsctl(["--json", "stats", FIX.mnt])
            self.assertEqual(rc, 0, err)
            return sum(json.loads(out)["metrics"]["blobs"].values())
        # files no other test has opened (which makes their blobs)
        d = "models--acme--xattrq/blobs"
        os.makedirs(FIX.n(d))
        self.addCleanup(shutil.rmtree, FIX.n("models--acme--xattrq"))
        files = []
        for k in range(20):
            files.append("%s/%064x" % (d, k))
            with open(FIX.n(files[-1]), "wb") as f:
                f.write(b"x" * (k + 1))
        before = blobs()
        for p in files:
            for name in ("security.selinux", "system.posix_acl_access", "user.other"):
                self.assertIn(wfstest.errno_of(os.getxattr, FIX.m(p), name),
                              (errno.ENODATA, errno.EOPNOTSUPP), p)
            self.assertEqual(os.getxattr(FIX.m(p), "user.wfs.state"), b"nas")
        self.assertEqual(blobs(), before, "blobs made by %d files' xattr questions" % len(files))

    def test_listxattr_names_them(self):
        e = next(e for e in FIX.of("file") if "blob_id" in e)
        names = os.listxattr(FIX.m(e["path"]))
        self.assertIn("user.wfs.state", names, "listxattr %s" % e["path"])
        self.assertIn("user.wfs.id", names, "listxattr %s" % e["path"])


if __name__ == "__main__":
    wfstest.main()
