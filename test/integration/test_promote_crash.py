#!/usr/bin/env python3
"""kill -9 of the daemon in the middle of a promotion, then a remount of the
same NAS and LOCAL_STORE: the half-made copy is never served (the blob is on
the NAS, bytes equal), LOCAL_STORE/tmp is emptied at start-up, and copies
verified before the crash are local again at once, without being copied
again (same inode and mtime in LOCAL_STORE/data)."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of, wait_state  # noqa: E402

MiB = 1 << 20
# a 43 MiB shard copied at a third of 20 MB/s (promote_mbps is shared by
# the copy_workers + 1 copies that may run at once, 2 + 1 on two cores):
# ~6 s during which to kill the daemon, killed ~1 s in (8 MiB done)
FIX = wfstest.HubFixture(options=("promote_mbps=20", "auto_promote=off"), scale_mib=96, many=0, mount=False)


def setUpModule():
    wfstest.setup_with_ctl(FIX)


def tearDownModule():
    FIX.teardown()


snap = FIX.snapshot_entry  # at refs/main


class KillDuringCopy(unittest.TestCase):
    def test_kill9_mid_copy_then_remount(self):
        big = snap("models--acme--standard", "model-00001-of-00002.safetensors")
        smalls = [snap("models--acme--packs", "model.safetensors"),   # SHA-256 named
                  snap("models--acme--standard", "config.json")]      # git SHA-1 named
        self.assertGreaterEqual(big["size"], 32 * MiB)
        bigp = FIX.m(big["path"])

        # 1. small blobs promoted and verified before the crash
        ctl_check(self, ["promote", "--wait"] + [FIX.m(e["path"]) for e in smalls])
        for e in smalls:
            self.assertEqual(state_of(FIX.m(e["path"])), "local", e["path"])
        data_before = wfstest.store_files(FIX.local)
        self.assertEqual(len(data_before), len(smalls), "data/ after promoting %d blobs: %s"
                         % (len(smalls), sorted(data_before)))
        ids_before = {rel: (st.st_ino, st.st_mtime_ns, st.st_size) for rel, st in data_before.items()}

        # 2. start the big copy, kill -9 while it is `copying`
        ctl_check(self, ["promote", bigp])
        st = wait_state(bigp, ("copying",), 30, step=0.01)
        self.assertEqual(st, "copying", "the big blob never showed `copying` (last: %s)" % st)
        wfstest.wait_until(lambda: wfstest.tmp_entries(FIX.local), 30)
        tmp_during = wfstest.tmp_entries(FIX.local)
        sock = wfstest.socket_of(FIX.mnt)

        def big_copies():
            rep = wfstest.ctl_request(sock, {"op": "status"})
            return [c for c in (rep or {}).get("copies", []) if c.get("id") == big.get("blob_id")]
        # some MiB into the copy
        wfstest.wait_until(lambda: sum(c.get("bytes_done", 0) for c in big_copies()) >= 8 * MiB, 60)
        copies = big_copies()
        state_at_kill = state_of(bigp)
        pids = FIX.mount.pids
        wfstest.kill_daemon(self, pids)
        print("\n  killed daemon %s with the big blob %s, copies %s, tmp/ %s"
              % (pids, state_at_kill, copies, tmp_during), file=sys.stderr)
        self.assertEqual(state_at_kill, "copying", "the copy finished before the kill; slow it down")
        self.assertTrue(tmp_during, "no file in LOCAL_STORE/tmp while copying")

        # the index on disk is whole (written atomically), whatever the moment of the kill
        idx = os.path.join(FIX.local, "index.json")
        try:
            with open(idx) as f:
                json.load(f)
        except (OSError, ValueError) as ex:
            self.fail("LOCAL_STORE/index.json after kill -9: %r" % ex)

        # 3. take the dead mount off, mount again
        wfstest.drop_dead_mount(self, FIX.mnt)
        FIX.mount = None
        FIX.mount = wfstest.Mount(FIX.hub, FIX.local, FIX.mnt, FIX.options).start()
        sock = wfstest.wait_ctl(FIX.mnt)

        self.assertEqual(wfstest.tmp_entries(FIX.local), [], "LOCAL_STORE/tmp not empty after start-up")
        # verified copies: local at once, the same files (not copied again)
        rep = wfstest.ctl_request(sock, {"op": "status"})
        self.assertTrue(rep and rep.get("ok"), rep)
        for e in smalls:
            self.assertEqual(state_of(FIX.m(e["path"])), "local",
                             "%s was verified before the kill, but is not local after the remount"
                             % e["path"])
        # no copy in flight for them, and no new file in data/
        st = ctl_json(self, ["status", FIX.mnt])
        self.assertEqual(st.get("copies"), [], "copies in flight right after start-up: %s" % st.get("copies"))
        data_after = wfstest.store_files(FIX.local)
        ids_after = {rel: (s.st_ino, s.st_mtime_ns, s.st_size) for rel, s in data_after.items()}
        self.assertEqual(ids_after, ids_before,
                         "LOCAL_STORE/data changed across kill + remount (inode, mtime, size)")
        for e in smalls:
            self.assertEqual(wfstest.sha256_file(FIX.m(e["path"])), (e["sha256"], e["size"]))
        # the blob cut off mid-copy is served from the NAS, complete
        self.assertEqual(state_of(bigp), "nas", "the blob killed mid-copy")
        self.assertEqual(wfstest.sha256_file(bigp), (big["sha256"], big["size"]),
                         "the blob killed mid-copy reads wrong bytes")
        repo = next(r for r in st["repos"] if r["repo"] == "models--acme--standard")
        self.assertEqual(repo.get("local_files"), 1, "standard: only config.json is local: %s"
                         % {k: repo.get(k) for k in ("files", "local_files", "states")})
        # the local blobs were opened above (an open checks an unchecked
        # source first), and nothing is queued or copying: nothing is left
        # that could change data/
        st = ctl_json(self, ["status", FIX.mnt])
        self.assertEqual((st["copies"], st["store"]["queued"], st["store"]["copying"]), ([], 0, 0),
                         "copies after the remount without a request")
        self.assertEqual(ids_after, {rel: (s.st_ino, s.st_mtime_ns, s.st_size)
                                     for rel, s in wfstest.store_files(FIX.local).items()},
                         "LOCAL_STORE/data changed after the remount without a request")


if __name__ == "__main__":
    wfstest.main()
