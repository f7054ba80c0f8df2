#!/usr/bin/env python3
"""Every write operation through the mount fails with EROFS, and the NAS tree
is left exactly as it was."""

import errno
import hashlib
import os
import stat
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402

FIX = wfstest.HubFixture(options=("auto_promote=off",))
NAS_BEFORE = None


def nas_snapshot():
    """path -> (type, size, mtime_ns, mode, link text) for the whole NAS tree,
    plus the outside directory (the escaping links point there)."""
    snap = {}
    for top in (FIX.hub, FIX.outside):
        for root, dirs, files in os.walk(top, followlinks=False):
            for name in [""] + dirs + files:
                p = os.path.join(root, name) if name else root
                st = os.lstat(p)
                link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
                snap[p] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns,
                           stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, link)
    return snap


def setUpModule():
    global NAS_BEFORE
    FIX.setup()
    NAS_BEFORE = nas_snapshot()


def tearDownModule():
    FIX.teardown()


def pick():
    """A blob file, a snapshot link to it, a directory, an empty-ish directory."""
    blob = next(e for e in FIX.of("file") if "blob_id" in e)
    link = next(e for e in FIX.of("link", "file"))
    kids = FIX.children()
    dirs = [e["path"] for e in FIX.of("dir")]
    empty = [d for d in dirs if not kids.get(d)]
    leaf = empty[0] if empty else min(dirs, key=lambda d: (len(kids[d]), d))
    return blob["path"], link["path"], os.path.dirname(link["path"]), leaf


class ReadOnly(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.file, cls.link, cls.dir, cls.leaf = (FIX.m(p) for p in pick())
        cls.new = os.path.join(cls.dir, "wfs-test-new-name")

    def assertErofs(self, fn, *args, what=None):
        got = wfstest.errno_of(fn, *args)
        self.assertEqual(got, errno.EROFS, "%s -> %s, want EROFS"
                         % (what or fn.__name__, wfstest.errname(got)))

    def open_close(self, path, flags):
        os.close(os.open(path, flags, 0o644))

    def test_open_wronly(self):
        self.assertErofs(self.open_close, self.file, os.O_WRONLY, what="open(O_WRONLY)")

    def test_open_rdwr(self):
        self.assertErofs(self.open_close, self.file, os.O_RDWR, what="open(O_RDWR)")

    def test_open_wronly_through_link(self):
        self.assertErofs(self.open_close, self.link, os.O_WRONLY, what="open(snapshot link, O_WRONLY)")

    def test_open_creat_new(self):
        self.assertErofs(self.open_close, self.new, os.O_WRONLY | os.O_CREAT, what="open(new, O_CREAT)")
        self.assertErofs(self.open_close, self.new, os.O_RDONLY | os.O_CREAT | os.O_EXCL,
                         what="open(new, O_RDONLY|O_CREAT|O_EXCL)")
        self.assertFalse(os.path.lexists(self.new), "the failed create left a name behind")

    def test_open_trunc(self):
        size = os.stat(self.file).st_size
        self.assertErofs(self.open_close, self.file, os.O_WRONLY | os.O_TRUNC, what="open(O_WRONLY|O_TRUNC)")
        self.assertErofs(self.open_close, self.file, os.O_RDONLY | os.O_TRUNC, what="open(O_RDONLY|O_TRUNC)")
        self.assertEqual(os.stat(self.file).st_size, size, "file was truncated")

    def test_mkdir(self):
        self.assertErofs(os.mkdir, self.new)

    def test_unlink_file(self):
        self.assertErofs(os.unlink, self.file)

    def test_unlink_link(self):
        self.assertErofs(os.unlink, self.link)

    def test_rmdir(self):
        self.assertErofs(os.rmdir, self.leaf)

    def test_rename(self):
        self.assertErofs(os.rename, self.link, self.new)

    def test_rename_dir(self):
        self.assertErofs(os.rename, self.leaf, self.leaf + "-renamed")

    def test_link(self):
        self.assertErofs(os.link, self.file, self.new)

    def test_symlink(self):
        self.assertErofs(os.symlink, "x", self.new)

    def test_mknod_fifo(self):
        self.assertErofs(os.mkfifo, self.new)

    def test_truncate(self):
        self.assertErofs(os.truncate, self.file, 0)
        self.assertErofs(os.truncate, self.file, 1 << 30, what="truncate(grow)")

    def test_chmod(self):
        self.assertErofs(os.chmod, self.file, 0o644)
        self.assertErofs(os.chmod, self.leaf, 0o777, what="chmod(dir)")

    def test_chown(self):
        self.assertErofs(os.chown, self.file, wfstest.NOBODY, wfstest.NOBODY)
        self.assertErofs(lambda: os.chown(self.link, wfstest.NOBODY, -1, follow_symlinks=False),
                         what="lchown(link)")

    def test_utime(self):
        self.assertErofs(os.utime, self.file, (1, 1))
        self.assertErofs(os.utime, self.file, None, what="utime(now)")

    def test_setxattr(self):
        self.assertErofs(os.setxattr, self.file, "user.test", b"x")
        self.assertErofs(os.setxattr, self.file, "user.wfs.state", b"local", what="setxattr(user.wfs.state)")

    def test_removexattr(self):
        self.assertErofs(os.removexattr, self.file, "user.wfs.state")

    def test_zz_nas_unchanged(self):
        # named zz_ so it runs after the others in this class
        after = nas_snapshot()
        changed = sorted(p for p in set(NAS_BEFORE) | set(after) if NAS_BEFORE.get(p) != after.get(p))
        self.assertEqual(changed, [], "NAS tree changed: %s" % [
            (p, NAS_BEFORE.get(p), after.get(p)) for p in changed[:10]])
        # and the mount still reads correctly
        e = FIX.by_path[os.path.relpath(self.file, FIX.mnt)]
        self.assertEqual(hashlib.sha256(wfstest.read_file(self.file)).hexdigest(), e["sha256"])


if __name__ == "__main__":
    wfstest.main()
