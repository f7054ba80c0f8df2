#!/usr/bin/env python3
"""The tree the mount presents, entry by entry, against the manifest and the
NAS: types, bytes, link texts, where links lead, inodes, readdir, modes,
xattrs."""

import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off"))


def setUpModule():
    FIX.setup()


def tearDownModule():
    FIX.teardown()


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def snapshot_parts(path):
    """(repo, depth) for <repo>/snapshots/<rev>/<d1>/.../<name>, else None;
    depth = number of directories between <rev> and the name."""
    parts = path.split("/")
    if "snapshots" not in parts[1:]:
        return None
    i = parts.index("snapshots", 1)
    if len(parts) < i + 3:
        return None
    return "/".join(parts[:i]), len(parts) - i - 3


class Base(unittest.TestCase):
    maxDiff = 4000

    def assertNone(self, bad, what):
        """bad: list of strings describing each offending entry."""
        if bad:
            shown = "\n  ".join(bad[:25])
            more = "" if len(bad) <= 25 else "\n  ... and %d more" % (len(bad) - 25)
            self.fail("%s: %d entries wrong:\n  %s%s" % (what, len(bad), shown, more))


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
            self.skipTest("the fixture (test/mkhub) has no link resolving to a directory")
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


class Readdir(Base):
    def test_listdir_equals_manifest_and_is_stable(self):
        bad = []
        for d, want in FIX.children().items():
            try:
                a = os.listdir(FIX.m(d))
                b = os.listdir(FIX.m(d))
            except OSError as ex:
                bad.append("%r: listdir -> %s" % (d, wfstest.errname(ex.errno)))
                continue
            if len(a) != len(set(a)):
                bad.append("%r: duplicate names %s" % (d, sorted({x for x in a if a.count(x) > 1})))
            if sorted(a) != want:
                bad.append("%r: missing %s, extra %s" % (d, sorted(set(want) - set(a)),
                                                          sorted(set(a) - set(want))))
            if a != b:
                bad.append("%r: two listings differ" % d)
        self.assertNone(bad, "readdir")

    def test_scandir_names_and_types(self):
        bad = []
        for d, want in FIX.children().items():
            with os.scandir(FIX.m(d)) as it:
                ents = list(it)
            names = [x.name for x in ents]
            if sorted(names) != want or len(names) != len(set(names)):
                bad.append("%r: scandir names differ from manifest" % d)
            for x in ents:
                e = FIX.by_path.get(os.path.join(d, x.name) if d else x.name)
                if e is None:
                    continue
                got = ("link" if x.is_symlink() else "dir" if x.is_dir(follow_symlinks=False)
                       else "file" if x.is_file(follow_symlinks=False) else "other")
                if got != e["type"]:
                    bad.append("%s: scandir type %s, want %s" % (e["path"], got, e["type"]))
                ino = os.lstat(x.path).st_ino
                if x.inode() != ino:  # d_ino from readdir, what `ls -i` and `find` use
                    bad.append("%s: readdir d_ino %d, lstat st_ino %d" % (e["path"], x.inode(), ino))
        self.assertNone(bad, "scandir")

    def many_dir(self):
        kids = FIX.children()
        d = max(kids, key=lambda k: len(kids[k]))
        self.assertGreaterEqual(len(kids[d]), FIX.many,
                                "no directory with --many (%d) children in the manifest" % FIX.many)
        return d, kids[d]

    def test_many_entries(self):
        d, want = self.many_dir()
        a = os.listdir(FIX.m(d))
        with os.scandir(FIX.m(d)) as it:
            s = [x.name for x in it]
        for label, got in (("listdir", a), ("scandir", s)):
            dups = sorted({x for x in got if got.count(x) > 1})
            self.assertEqual(dups, [], "%s of %s: duplicates" % (label, d))
            self.assertEqual(sorted(got), want, "%s of %s (%d entries, want %d): missing %s extra %s"
                             % (label, d, len(got), len(want), sorted(set(want) - set(got))[:5],
                                sorted(set(got) - set(want))[:5]))

    def test_many_entries_concurrent_listings(self):
        d, want = self.many_dir()
        results, errs = [None] * 6, []

        def lst(i):
            try:
                results[i] = os.listdir(FIX.m(d))
            except OSError as ex:
                errs.append(ex)
        ts = [threading.Thread(target=lst, args=(i,)) for i in range(len(results))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errs, [])
        for r in results:
            self.assertEqual(sorted(r), want)
            self.assertEqual(len(r), len(want))

    def test_many_entries_closed_early(self):
        # A reader that stops after its first batch closes the directory
        # while the daemon classifies the next batch ahead (fs/dir.c): the
        # handle outlives that work, and the next full listing is whole.
        d, want = self.many_dir()
        for _ in range(20):
            wfstest.drop_caches()  # so the listing is read from the daemon again
            with os.scandir(FIX.m(d)) as it:
                first = next(it).name
            self.assertIn(first, want)
        wfstest.drop_caches()
        got = os.listdir(FIX.m(d))
        self.assertEqual(len(got), len(set(got)), "duplicates in %s" % d)
        self.assertEqual(sorted(got), want)

    def test_many_entries_interleaved_passes(self):
        # Two passes over one directory, one paused part way while the other
        # runs whole: with no directory handles, each pass finds its own
        # listing by the offsets it was given (fs/dir.c).
        d, want = self.many_dir()
        wfstest.drop_caches()
        with os.scandir(FIX.m(d)) as a, os.scandir(FIX.m(d)) as b:
            first = [next(a).name]
            whole = [x.name for x in b]
            rest = [x.name for x in a]
        for label, got in (("the pass run whole", whole), ("the paused pass", first + rest)):
            self.assertEqual(len(got), len(set(got)), "%s of %s: duplicates" % (label, d))
            self.assertEqual(sorted(got), want, "%s of %s" % (label, d))

    def test_pass_keeps_its_listing_while_the_nas_changes(self):
        # Names added on the NAS part way through a pass: the pass goes on
        # in the listing it began with (taken whole at its start), so no
        # name it has not shown yet is skipped and none is shown twice --
        # what a listing re-read at each request would get wrong, as the
        # new names shift the old ones' positions.
        d, want = self.many_dir()
        added = ["zz-added-%02d" % i for i in range(50)]
        wfstest.drop_caches()
        try:
            with os.scandir(FIX.m(d)) as it:
                got = [next(it).name]
                for name in added:
                    with open(os.path.join(FIX.n(d), name), "wb") as f:
                        f.write(b"x")
                got += [x.name for x in it]
        finally:
            for name in added:
                try:
                    os.unlink(os.path.join(FIX.n(d), name))
                except FileNotFoundError:
                    pass
        self.assertEqual(len(got), len(set(got)), "%s: duplicates in a pass" % d)
        self.assertEqual(sorted(set(got) - set(added)), want, "%s: old names of the pass" % d)

    def test_paused_pass_gets_fresh_attributes(self):
        # The daemon classifies a pass's next batch while the reader works
        # on this one (fs/dir.c).  A reader that pauses longer than that
        # batch may stay young must get its entries' attributes as the NAS
        # has them when it goes on, not as they were before the pause: the
        # kernel keeps what a READDIRPLUS says for attr_timeout.  (The pause
        # is the scenario, a slow reader; nothing is waited for.)
        d = os.path.join(os.path.dirname(self.many_dir()[0]), "zz-ahead")
        names = ["f%03d" % i for i in range(300)]  # two READDIRPLUS batches
        os.mkdir(FIX.n(d))
        try:
            for name in names:
                with open(os.path.join(FIX.n(d), name), "wb") as f:
                    f.write(b"x")
            order = os.listdir(FIX.n(d))  # the daemon lists in the NAS's order
            late = order[-50:]            # in the second batch (~150 a batch)
            wfstest.drop_caches()
            with os.scandir(FIX.m(d)) as it:
                first = next(it).name
                time.sleep(0.1)
                for name in late:
                    with open(os.path.join(FIX.n(d), name), "ab") as f:
                        f.write(b"new")
                got = [first] + [x.name for x in it]
            self.assertEqual(sorted(got), sorted(names))
            stale = [n for n in late if os.lstat(os.path.join(FIX.m(d), n)).st_size != 4]
            self.assertEqual(stale, [], "entries listed after the pause with the sizes "
                             "of before it")
        finally:
            shutil.rmtree(FIX.n(d), ignore_errors=True)

    def listings_ahead(self):
        """(listed ahead, taken) from `wfsctl stats --json`."""
        m = wfstest.ctl_json(self, ["stats", FIX.mnt]).get("metrics") or {}
        ls = m.get("listings") or {}
        self.assertIsInstance(ls.get("ahead"), int, "stats has no metrics.listings: %s" % sorted(m))
        return ls["ahead"], ls["ahead_taken"]

    def walk_dir(self, n, files=10):
        """A directory of N subdirectories of FILES files each on the NAS;
        (its path, the subdirectories in the order the daemon lists them)."""
        base = os.path.join(os.path.dirname(self.many_dir()[0]), "zz-walk")
        os.mkdir(FIX.n(base))
        self.addCleanup(shutil.rmtree, FIX.n(base), True)
        for i in range(n):
            os.mkdir(FIX.n(os.path.join(base, "s%02d" % i)))
            for k in range(files):
                with open(FIX.n(os.path.join(base, "s%02d" % i, "f%d" % k)), "wb") as f:
                    f.write(b"x" * k)
        return base, [os.path.join(base, x) for x in os.listdir(FIX.n(base))]

    def test_walk_listed_ahead_is_the_nas(self):
        # While a walk reads one directory the daemon lists the one the walk
        # will read next (fs/dir.c, core/walkplan.h).  Walked in either
        # order, every directory lists the NAS's names with the NAS's sizes,
        # and the listings made ahead are taken (the counters say so).
        base, order = self.walk_dir(30)
        for label, seq in (("in listing order", order), ("in reverse", order[::-1])):
            wfstest.drop_caches()
            ahead0, taken0 = self.listings_ahead()
            os.listdir(FIX.m(base))
            for d in seq:
                with os.scandir(FIX.m(d)) as it:
                    got = {x.name: x.stat(follow_symlinks=False).st_size for x in it}
                want = {x: os.lstat(os.path.join(FIX.n(d), x)).st_size for x in os.listdir(FIX.n(d))}
                self.assertEqual(got, want, "%s, walked %s" % (d, label))
            ahead, taken = self.listings_ahead()
            self.assertGreater(taken - taken0, 0, "walked %s: none of the %d directories listed "
                               "ahead was taken" % (label, ahead - ahead0))
            self.assertLessEqual(taken - taken0, ahead - ahead0)

    def test_listed_dirs_stat_without_the_daemon(self):
        # A listing read from the daemon leaves the directory's atime stale
        # in the kernel (fuse_invalidate_atime), so its next stat would wait
        # for a GETATTR; the daemon stats each listed directory through the
        # mount itself, off the reader's path (fs/dirattr.h).  Once its
        # counter says every directory was done twice, a stat and a listing
        # of each directory need no daemon at all: they finish with the
        # daemon stopped (without the refresh the first stat waits).
        # Cache times of 30 s keep the kernel's own timeouts out of it.
        local = os.path.join(FIX.gen, "local-dirattr")
        mnt = os.path.join(FIX.gen, "mnt-dirattr")
        os.mkdir(mnt)
        m = wfstest.Mount(FIX.hub, local, mnt, ("auto_promote=off", "attr_timeout=30",
                                                "entry_timeout=30")).start()
        try:
            def refreshed():
                got = wfstest.ctl_json(self, ["stats", mnt]).get("metrics") or {}
                n = (got.get("listings") or {}).get("attrs_refreshed")
                self.assertIsInstance(n, int, "stats has no listings.attrs_refreshed: %s" % got)
                return n

            before = refreshed()
            dirs, todo = [], [mnt]
            while todo:
                d = todo.pop()
                dirs.append(d)
                with os.scandir(d) as it:
                    for e in it:
                        if stat.S_ISDIR(os.lstat(e.path).st_mode):
                            todo.append(e.path)
            self.assertGreater(len(dirs), 10)
            self.assertTrue(wfstest.wait_until(lambda: refreshed() >= before + 2 * len(dirs),
                                               20, 0.02),
                            "%d of %d directories stat'ed twice by the daemon"
                            % (refreshed() - before, 2 * len(dirs)))
            for pid in m.pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                rc, out, err = wfstest.run_captured(
                    [sys.executable, "-c", "import os, sys\n"
                     "for d in sys.argv[1:]:\n    os.lstat(d)\n    os.listdir(d)\n"] + dirs,
                    timeout=10)
            finally:
                for pid in m.pids:
                    os.kill(pid, signal.SIGCONT)
            self.assertEqual(rc, 0, "a stat or listing of a listed directory needed the daemon "
                             "(rc %s): %s" % (rc, err[-2000:]))
        finally:
            problems = m.stop()
            shutil.rmtree(local, ignore_errors=True)
            os.rmdir(mnt)
            self.assertEqual(problems, [])

    def test_walk_listed_ahead_not_taken_stale(self):
        # A listing made ahead is taken only within a tick of being made: a
        # walker that pauses before the next directory gets it as the NAS
        # has it then, with names added and sizes changed during the pause.
        # (The pause is the scenario, a slow walker; what is waited for is
        # the daemon's counter of listings made ahead.)
        base, order = self.walk_dir(3)
        wfstest.drop_caches()
        ahead0, _ = self.listings_ahead()
        os.listdir(FIX.m(base))
        os.listdir(FIX.m(order[0]))  # the first one: the walk goes in listing order
        self.assertTrue(wfstest.wait_until(lambda: self.listings_ahead()[0] > ahead0, 10, 0.01),
                        "the daemon listed nothing ahead of a walk of %s" % base)
        nxt = order[1]
        with open(FIX.n(os.path.join(nxt, "new")), "wb") as f:
            f.write(b"new")
        with open(FIX.n(os.path.join(nxt, "f1")), "ab") as f:
            f.write(b"grown")
        time.sleep(0.1)
        with os.scandir(FIX.m(nxt)) as it:
            got = {x.name: x.stat(follow_symlinks=False).st_size for x in it}
        self.assertIn("new", got, "%s listed as it was before the pause" % nxt)
        self.assertEqual(got.get("f1"), 6, "%s/f1 with its size of before the pause" % nxt)

    def test_more_passes_than_listings_kept(self):
        # More passes paused at once than the daemon keeps listings for
        # (LISTINGS_KEPT, 64): a pass whose listing was let go is listed
        # again and goes on from where it was, neither repeating nor
        # skipping a name.
        d, want = self.many_dir()
        wfstest.drop_caches()
        its = [os.scandir(FIX.m(d)) for _ in range(80)]
        try:
            firsts = [next(it).name for it in its]
            for i, it in enumerate(its):
                got = [firsts[i]] + [x.name for x in it]
                self.assertEqual(len(got), len(set(got)), "pass %d of %s: duplicates" % (i, d))
                self.assertEqual(sorted(got), want, "pass %d of %s" % (i, d))
        finally:
            for it in its:
                it.close()

    def test_many_entries_telldir_seekdir(self):
        # resuming a listing at an offset (what a second getdents call, and
        # seekdir, do) must neither repeat nor skip names
        d, want = self.many_dir()
        names = readdir_c(FIX.m(d), split=len(want) // 2)
        first, rest, again = names
        self.assertEqual(rest, again, "seekdir(telldir()) did not resume at the same place")
        got = first + rest
        self.assertEqual(len(got), len(set(got)), "duplicates across the resumed listing")
        self.assertEqual(sorted(got), want)


class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


def readdir_c(path, split):
    """opendir; read `split` names; pos = telldir; read the rest; seekdir(pos);
    read the rest again.  Returns (first, rest, rest_again) without . and .."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.opendir.argtypes = [ctypes.c_char_p]
    libc.readdir64.restype = ctypes.POINTER(_Dirent)
    libc.readdir64.argtypes = [ctypes.c_void_p]
    libc.telldir.restype = ctypes.c_long
    libc.telldir.argtypes = [ctypes.c_void_p]
    libc.seekdir.restype = None
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    libc.closedir.argtypes = [ctypes.c_void_p]
    dp = libc.opendir(os.fsencode(path))
    if not dp:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)

    def take(n=None):
        out = []
        while n is None or len(out) < n:
            ctypes.set_errno(0)
            ent = libc.readdir64(dp)
            if not ent:
                e = ctypes.get_errno()
                if e:
                    raise OSError(e, os.strerror(e), path)
                break
            name = os.fsdecode(ent.contents.d_name)
            if name not in (".", ".."):
                out.append(name)
        return out
    try:
        first = take(split)
        pos = libc.telldir(dp)
        rest = take()
        libc.seekdir(dp, pos)
        again = take()
    finally:
        libc.closedir(dp)
    return first, rest, again


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

    def test_listxattr_names_them(self):
        e = next(e for e in FIX.of("file") if "blob_id" in e)
        names = os.listxattr(FIX.m(e["path"]))
        self.assertIn("user.wfs.state", names, "listxattr %s" % e["path"])
        self.assertIn("user.wfs.id", names, "listxattr %s" % e["path"])


if __name__ == "__main__":
    wfstest.main()
