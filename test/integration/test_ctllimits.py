#!/usr/bin/env python3
"""The control socket's limits: other local users cannot make the daemon
grow -- many connections held open leave its thread count alone and past
the caps get an error reply; idle, half-line and not-reading clients are
closed; the owner is served meanwhile -- and the daemon stops promptly
with clients connected (the module's teardown).  The limits are in
core/control.h; README "Control protocol"."""

import json
import os
import select
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
from wfstest import ctl_check, ctl_json, state_of, NOBODY  # noqa: E402

FIX = wfstest.HubFixture(options=("allow_other", "auto_promote=off"), scale_mib=4, many=0, mount=False)
SOCK = None


def setUpModule():
    global SOCK
    SOCK = wfstest.setup_with_ctl(FIX)


def tearDownModule():
    # The daemon must stop promptly with clients connected: idle ones, and
    # one whose request is half sent (teardown checks that it exits).
    held = []
    try:
        if SOCK:
            held = connect_as(NOBODY, 2) + connect_as(0, 2)
            held[1].sendall(b'{"op": "sta')
    finally:
        FIX.teardown()
        for s in held:
            s.close()


HANG_GUARD = 120  # seconds: only so that a daemon that never closes fails the test


def connect_as(uid, n):
    """n connections to the control socket made by `uid` (a forked child
    connects; SO_PEERCRED is taken at connect) and handed back over
    SCM_RIGHTS, so that this process holds them: a list of sockets."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # child
        try:
            here.close()
            socks, problem = [], b""
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                for _ in range(n):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(SOCK)
                    socks.append(s)
            except OSError as e:
                problem = repr(e).encode()
            socket.send_fds(there, [b"." + problem], [s.fileno() for s in socks])
        finally:
            os._exit(0)
    there.close()
    try:
        msg, fds, _, _ = socket.recv_fds(here, 4096, n)
    finally:
        here.close()
        os.waitpid(pid, 0)
    socks = [socket.socket(fileno=fd) for fd in fds]
    if len(socks) != n:
        for s in socks:
            s.close()
        raise AssertionError("uid %d made %d of %d connections: %s" % (uid, len(socks), n, msg[1:]))
    return socks


def control_info(tc):
    """The "control" object of a status reply (asked as root)."""
    rep = wfstest.ctl_request(SOCK, {"op": "status"})
    tc.assertTrue(rep and rep.get("ok") and isinstance(rep.get("control"), dict),
                  "status has no \"control\" object: %s" % rep)
    return rep["control"]


def daemon_threads(tc):
    tc.assertEqual(len(FIX.mount.pids), 1, "daemon pids: %s" % FIX.mount.pids)
    with open("/proc/%d/status" % FIX.mount.pids[0]) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    tc.fail("no Threads: line in /proc/%d/status" % FIX.mount.pids[0])


def proc_kib(pid, field):
    """A "kB" field of /proc/PID/status (VmHWM, VmRSS), in KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def pending_line(s):
    """What the daemon sent on `s` so far, without waiting: None if nothing,
    else the first line parsed (or the raw bytes if it does not parse)."""
    s.setblocking(False)
    try:
        data = s.recv(65536)
    except BlockingIOError:
        return None
    except ConnectionResetError:
        return {"reset": True}
    finally:
        s.setblocking(True)
    if not data:
        return {"eof": True}
    line = data.split(b"\n", 1)[0]
    try:
        return json.loads(line)
    except ValueError:
        return {"raw": data[:200]}


def read_to_eof(s, guard=HANG_GUARD):
    """Every byte until the daemon closes `s` (the guard only stops a hang)."""
    s.settimeout(guard)
    got = b""
    while True:
        try:
            c = s.recv(1 << 20)
        except ConnectionResetError:
            break
        if not c:
            break
        got += c
    return got


def wait_closed_by_daemon(s, guard=HANG_GUARD):
    """Wait, reading nothing, until the daemon has closed its end of `s`
    (POLLHUP: it is reported even with unread data).  True if it did."""
    p = select.poll()
    p.register(s, 0)  # POLLHUP is always reported
    return any(ev & select.POLLHUP for _, ev in p.poll(guard * 1000))

class Limits(unittest.TestCase):
    def wait_no_other_conns(self):
        # the daemon reports when it has closed what a test held
        ok = wfstest.wait_until(lambda: control_info(self)["connections_other"] == 0, HANG_GUARD, 0.05)
        self.assertTrue(ok, "connections of other users still open: %s" % control_info(self))

    def test_limits_reported(self):
        info = control_info(self)
        lim = info.get("limits", {})
        for k in ("connections", "connections_other", "connections_per_uid", "workers",
                  "workers_other", "request_bytes", "request_timeout_ms", "reply_timeout_ms"):
            self.assertIsInstance(lim.get(k), int, "limits.%s: %s" % (k, info))
            self.assertGreater(lim[k], 0, "limits.%s: %s" % (k, info))
        self.assertLess(lim["connections_per_uid"], lim["connections_other"])
        self.assertLess(lim["connections_other"], lim["connections"])
        self.assertLess(lim["workers_other"], lim["workers"])
        self.assertEqual(lim["request_bytes"], 64 * 1024)

    def test_flood_from_other_users(self):
        """Users other than the owner hold more connections than the caps
        allow: the daemon starts no thread for them, refuses those past the
        caps with an error line, and still serves the owner."""
        info0 = control_info(self)
        lim = info0["limits"]
        per_uid, other = lim["connections_per_uid"], lim["connections_other"]
        # enough users that together they pass the cap for all other users
        uids = [NOBODY - k for k in range(other // per_uid + 1)]
        each = per_uid + 4
        total = each * len(uids)
        threads0 = daemon_threads(self)
        held = {}
        try:
            for uid in uids:
                held[uid] = connect_as(uid, each)

            def settled():
                i = control_info(self)
                return (i["connections_other"] + i["refused"] - info0["refused"]
                        + i["timed_out"] - info0["timed_out"]) >= total
            self.assertTrue(wfstest.wait_until(settled, HANG_GUARD, 0.05),
                            "the daemon did not account for %d connections: %s" % (total, control_info(self)))
            threads = daemon_threads(self)
            info = control_info(self)
            # a fixed pool: no thread per connection (a little slack for the
            # FUSE loop, which starts and ends workers of its own; nothing
            # here goes through the mount until the owner's promote below)
            self.assertLessEqual(threads, threads0 + 4, "threads %d -> %d with %d connections held"
                                 % (threads0, threads, total))
            self.assertLessEqual(info["connections_other"], other, info)

            counts = {"refused": 0, "open": 0, "timed_out": 0}
            for uid, socks in held.items():
                open_here = 0
                for s in socks:
                    rep = pending_line(s)
                    if rep is None:
                        open_here += 1
                        continue
                    self.assertIs(rep.get("ok"), False, "uid %d got %s" % (uid, rep))
                    self.assertIn(rep.get("errno"), ("EAGAIN", "ETIMEDOUT"), rep)
                    self.assertIn("connections" if rep["errno"] == "EAGAIN" else "request", rep.get("error", ""))
                    counts["refused" if rep["errno"] == "EAGAIN" else "timed_out"] += 1
                self.assertLessEqual(open_here, per_uid, "uid %d holds %d connections" % (uid, open_here))
                counts["open"] += open_here
            self.assertEqual(sum(counts.values()), total, counts)
            self.assertLessEqual(counts["open"], other, counts)
            # every slot a connection got was one the caps allowed (a slot a
            # timed-out connection gave back may have gone to a later one)
            self.assertGreaterEqual(counts["refused"], total - other - counts["timed_out"], counts)

            # the owner (root here) is served meanwhile: status, and a promote
            st = ctl_json(self, ["status", FIX.mnt])
            self.assertIn("models--acme--standard", [r.get("repo") for r in st.get("repos", [])])
            p = FIX.m(FIX.snapshot_entry("models--acme--standard",
                                          "model-00002-of-00002.safetensors")["path"])
            ctl_check(self, ["promote", "--wait", p])
            self.assertEqual(state_of(p), "local")
            ctl_check(self, ["evict", p])
            self.assertEqual(state_of(p), "nas")
        finally:
            for socks in held.values():
                for s in socks:
                    s.close()
        self.wait_no_other_conns()

    def test_one_path_many_times(self):
        """A dry run is open to every user: one 64 KiB request naming the
        mount root 15,000 times walked the hub 15,000 times and kept every
        result (the daemon grew by hundreds of MiB on a 60-file hub, GiBs
        on a real one).  A name is walked once: the reply is the one a
        single "" gets, and the daemon's peak memory barely moves."""
        one = wfstest.ctl_request(SOCK, {"op": "promote", "dry_run": True, "paths": [""]})
        self.assertTrue(one and one.get("ok"), one)
        pid = FIX.mount.pids[0]
        hwm0 = proc_kib(pid, "VmHWM")
        s = connect_as(NOBODY, 1)[0]
        try:
            req = {"op": "promote", "dry_run": True, "paths": [""] * 15000}
            s.sendall((json.dumps(req) + "\n").encode())
            got = read_to_eof(s)
        finally:
            s.close()
        rep = json.loads(got.split(b"\n", 1)[0])
        self.assertTrue(rep.get("ok"), rep)
        self.assertEqual(sorted(b["key"] for b in rep["blobs"]),
                         sorted(b["key"] for b in one["blobs"]))
        grew = proc_kib(pid, "VmHWM") - hwm0
        self.assertLess(grew, 64 * 1024, "the daemon's peak memory grew by %d KiB" % grew)

    def test_idle_half_line_and_unread_reply_closed(self):
        """A client that sends nothing, one that sends half a line and one
        that does not read its reply are closed by the daemon."""
        info0 = control_info(self)
        # a reply larger than the socket can buffer: progress on many keys
        # ("" is no blob: one "unknown" entry each), which only root and
        # the owner may ask: that client is root's
        n = (info0["limits"]["request_bytes"] - 100) // 3
        req = (json.dumps({"op": "progress", "keys": [""] * n}, separators=(",", ":")) + "\n").encode()
        with open("/proc/sys/net/core/wmem_default") as f:
            sndbuf = int(f.read())
        idle, half = connect_as(NOBODY, 2)
        unread = connect_as(0, 1)[0]
        try:
            half.sendall(b'{"op": "sta')
            unread.sendall(req)
            for what, s in (("an idle client", idle), ("a half-line client", half)):
                got = read_to_eof(s)
                rep = json.loads(got.split(b"\n", 1)[0]) if got else None
                self.assertTrue(rep and rep.get("ok") is False and rep.get("errno") == "ETIMEDOUT",
                                "%s was not closed with a timeout reply within %d s: %r"
                                % (what, HANG_GUARD, got[:200]))
            self.assertTrue(wait_closed_by_daemon(unread),
                            "a client not reading its reply was not closed within %d s" % HANG_GUARD)
            got = read_to_eof(unread)
            if n * 50 > 2 * sndbuf:  # else the whole reply may fit in the socket
                self.assertNotIn(b"\n", got, "the whole reply (%d bytes) went out" % len(got))
                self.assertGreater(len(got), 0)
        finally:
            for s in (idle, half, unread):
                s.close()
        info = control_info(self)
        self.assertGreaterEqual(info["timed_out"] - info0["timed_out"], 3, info)
        self.wait_no_other_conns()


if __name__ == "__main__":
    wfstest.main()
