"""test_namespace.py's listing tests (readdir, READDIRPLUS passes, listings
made ahead of a walk), in a file of their own; test_namespace runs them as
its class Readdir, on its mount (ns_fix.FIX)."""

import ctypes
import os
import shutil
import stat
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from ns_fix import FIX, Base  # noqa: E402


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
        # counter says every directory was done twice, a stat of each
        # directory needs no daemon at all: it finishes with the daemon
        # stopped (without the refresh the first stat waits).  Cache times
        # of 30 s keep the kernel's own timeouts out of it.  (A listing
        # again is not asked for here: the kernel keeps it in the
        # directory's page cache, which this VM's host reclaims at any
        # time -- 1 run in 10 to 40 found one directory's listing gone.)
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
            with wfstest.daemon_stopped(m.pids):
                rc, out, err = wfstest.run_captured(
                    [sys.executable, "-c", "import os, sys\n"
                     "for d in sys.argv[1:]:\n    os.lstat(d)\n"] + dirs,
                    timeout=10)
            self.assertEqual(rc, 0, "a stat of a listed directory needed the daemon "
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
