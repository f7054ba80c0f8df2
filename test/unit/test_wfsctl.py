#!/usr/bin/env python3
"""test_wfsctl.py WFSCTL - wfsctl against in-process stand-ins for the
daemon's control socket (fake_ctl_server.py), no mount: help and usage,
every command's human and --json output, progress on a terminal, refusals
by SO_PEERCRED, the NAS up, down and up again. Prints "ok"/"FAIL" per case
and exits 1 if any failed.

Standard library only (and test/integration/wfstest.py, for running wfsctl
as another uid).
"""
import fcntl
import json
import os
import pty
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import wfstest  # noqa: E402
from fake_ctl_server import MiB, REV1, REV2, Hub, Server, blob_id, hexid, make_tree  # noqa: E402

class Case:
    def __init__(self, wfsctl):
        self.wfsctl, self.failed, self.count = wfsctl, 0, 0

    def run(self, *args, cwd=None, tty=False, cols=0, timeout=60):
        """(rc, stdout, stderr) of wfsctl; stderr on a pty if tty (@cols
        columns wide, if given)."""
        argv = [self.wfsctl] + list(args)
        if not tty:
            p = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=timeout)
            return p.returncode, p.stdout.decode("ascii"), p.stderr.decode("ascii")
        master, slave = pty.openpty()
        if cols:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
        out = p.stdout.read()
        p.wait(timeout)
        os.close(master)
        return p.returncode, out.decode("ascii"), err.decode("ascii")

    def expect(self, name, cond, detail=""):
        self.count += 1
        if cond:
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}\n{detail}")


def screen(text):
    """The lines a terminal shows for @text: a carriage return goes back
    to the start of the line, and what is written then overwrites it."""
    lines, col = [[]], 0
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append([])
            col = 0
        else:
            line = lines[-1]
            line[col:col + 1] = [ch]
            col += 1
    return ["".join(l) for l in lines]


def selftest(wfsctl):
    t = Case(os.path.abspath(wfsctl))
    work = tempfile.mkdtemp(prefix="wfsctl-test-", dir="/var/tmp")
    try:
        body(t, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wfsctl selftest: {t.count - t.failed} passed, {t.failed} failed")
    return 1 if t.failed else 0


def body(t, work):
    os.environ["TZ"] = "UTC"  # the times wfsctl prints, for the checks below
    store, root = f"{work}/store", f"{work}/mnt"
    os.makedirs(store)
    os.makedirs(root)
    sock = f"{store}/wfs.sock"
    hub = Hub(speed_mib=40)
    srv = Server(sock, hub)
    make_tree(root, sock)
    good = f"{root}/models--org--good"
    run, ok = t.run, t.expect

    def last_req():
        return hub.requests[-1] if hub.requests else None

    def show(r):
        return f"rc={r[0]}\n--stdout--\n{r[1]}--stderr--\n{r[2]}"

    # --- help and usage
    r = run("--help")
    ok("--help", r[0] == 0 and "promote" in r[1] and "--socket" in r[1], show(r))
    for c in ("status", "promote", "evict", "pin", "unpin", "verify", "doctor", "stats"):
        r = run(c, "--help")
        ok(f"{c} --help: usage, then its options under their heading, --help among them",
           r[0] == 0 and r[1].startswith(f"usage: wfsctl {c}")
           and re.search(r"\n\noptions:\n(  -.*\n|   +.*\n)*  -h, --help", r[1]), show(r))
    r = run("verify", "--help")
    ok("verify --help: --full waits without a limit", "the --timeout default is then no limit"
       in r[1], show(r))
    r = run("--version")
    ok("--version", r[0] == 0 and r[1].startswith("wfsctl (wfs) "), show(r))
    # wfsctl(1): the options "may come before the command or among its arguments"
    r = run("status", "--version")
    ok("COMMAND --version", r[0] == 0 and r[1].startswith("wfsctl (wfs) "), show(r))
    r = run("help", "--help")
    ok("help --help", r[0] == 0 and r[1].startswith("usage: wfsctl [--socket PATH]"), show(r))
    for args in ([], ["frob"], ["status", "--nope"], ["promote"], ["status", "a", "b"],
                 ["promote", "--wait", "--dry-run", "x"], ["--socket"], ["verify", "--force"],
                 ["promote", "--part", "1/-1", "x"], ["promote", "--part", "+1/2", "x"],
                 ["pin", "--ref"], ["pin", "--ref=", "x"]):
        r = run(*args)
        ok(f"usage error {args}", r[0] == 2 and r[2], show(r))
    # an empty PATH (an unset "$DIR"): refused before any request -- it
    # named the current directory, or with --socket the whole mount
    n = len(hub.requests)
    for args in (["evict", ""], ["promote", "x", ""], ["pin", "--", ""],
                 ["--socket", sock, "evict", ""]):
        r = run(*args, cwd=good)
        ok(f"empty PATH {args}: usage error, nothing asked", r[0] == 2
           and "empty PATH" in r[2] and len(hub.requests) == n, show(r))
    # a ref name that is not UTF-8: said so, nothing asked (it said "out of memory")
    n = len(hub.requests)
    r = run("pin", "--ref", os.fsdecode(b"ma\xffin"), "models--org--good", cwd=root)
    ok("pin --ref not UTF-8: said, nothing asked", r[0] == 1 and "not UTF-8" in r[2]
       and "out of memory" not in r[2] and len(hub.requests) == n, show(r))
    # revisions are read from the NAS's refs files: no escape reaches the terminal
    hub.ref_commit = "abc\x1b]0;owned\x07def"
    hub.ref_pins = [{"repo": "models--org--good", "ref": "main", "commit": hub.ref_commit,
                     "pending": "ff\x1b[2Jee", "files": 3, "local_files": 1,
                     "pending_files": 3, "pending_local_files": 0, "reason": ""}]
    r = run("pin", "--ref", "main", "models--org--good", cwd=root)
    ok("pin --ref: the revision's control characters shown as '?'", r[0] == 0
       and "(revision abc?]0;owned?def, 2 blobs)" in r[1] and "\x1b" not in r[1], show(r))
    r = run("status", cwd=root)
    ok("status: a ref pin's revisions' control characters shown as '?'", r[0] == 0
       and "-> abc?]0;owned?def (1/3 local); moving to ff?[2Jee" in r[1]
       and "\x1b" not in r[1] and "\x07" not in r[1], show(r))
    hub.ref_commit, hub.ref_pins = REV1, []
    # the ref's name forgotten: the next option is not taken for it
    r = run("pin", "--ref", "--json", "models--org--good")
    ok("pin --ref --json REPO: usage error naming what was taken for the ref", r[0] == 2
       and "--ref needs a ref name (main, refs/pr/1, ...), not --json" in r[2], show(r))
    # past what JSON's signed 64-bit numbers hold: sent, it read as negative
    for rng in ("9223372036854775808:1", "9223372036854775807:1", "8388608T:1"):
        r = run("promote", "--dry-run", "--range", rng, "x")
        ok(f"--range {rng}: usage error", r[0] == 2 and "beyond any file" in r[2], show(r))

    # --- discovery from the cwd and from a PATH
    n = len(hub.requests)
    r = run("status", cwd=f"{good}/snapshots/{REV1}")
    ok("status from a cwd deep in the mount", r[0] == 0 and last_req() == {"op": "status"}
       and len(hub.requests) == n + 1, show(r) + repr(last_req()))
    ok("status table", "REPO" in r[1] and "LOCAL-BYTES" in r[1] and "models--org--kept" in r[1]
       and "local=3" in r[1] and "store: 3 blobs" in r[1], show(r))
    ok("status: no revision lines for the whole mount", "rev " not in r[1], show(r))
    r = run("status", good, cwd="/")
    ok("status PATH sends the mount-relative path",
       r[0] == 0 and last_req() == {"op": "status", "path": "models--org--good"}, show(r) + repr(last_req()))
    ok("status PATH shows revisions", f"rev {REV1}" in r[1] and f"rev {REV2}" in r[1], show(r))
    r = run("status", root, cwd="/")
    ok("status of the mount root sends \"\"", r[0] == 0 and last_req() == {"op": "status", "path": ""},
       repr(last_req()))
    r = run("status", "--json", cwd=good)
    ok("status --json after the command is the reply as sent",
       r[0] == 0 and json.loads(r[1])["ok"] is True and r[1].count("\n") == 1, show(r))
    r = run("--json", "status", "models--org--good", cwd=root)
    ok("--json before the command", r[0] == 0 and json.loads(r[1])["repos"][0]["repo"] == "models--org--good",
       show(r))
    # output lost on a full disk is a failure: wfsctl(1)'s cron example
    # moves the file into place when wfsctl exits 0
    for args in (["--json", "status"], ["stats", "--prometheus"], ["status"]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([t.wfsctl] + args, cwd=root, stdout=full, stderr=subprocess.PIPE,
                               timeout=60)
        ok(f"{' '.join(args)} > /dev/full: exit 1, said", p.returncode == 1
           and b"wfsctl: cannot write the output" in p.stderr, repr((p.returncode, p.stderr)))

    # --- the NAS's state and the local record
    nas_tests(t, hub, root)

    # --- paths
    r = run("promote", "--dry-run", "/tmp", cwd=root)
    ok("path outside the mount: error naming it", r[0] == 1 and "/tmp: not inside a wfs mount" in r[2], show(r))
    r = run("status", cwd=work)
    ok("cwd outside the mount", r[0] == 1 and "current directory" in r[2], show(r))
    r = run("pin", f"{good}/snapshots/*/*.safetensors", cwd="/")
    want = sorted([f"models--org--good/snapshots/{REV1}/model-00001-of-00002.safetensors",
                   f"models--org--good/snapshots/{REV1}/model-00002-of-00002.safetensors"])
    ok("glob expanded, relative to the mount", r[0] == 0 and last_req() == {"op": "pin", "paths": want}
       and "pinned 2 blobs" in r[1], show(r) + repr(last_req()))
    r = run("pin", "models--org--*/snapshots/*/c*.bin", cwd=root)
    ok("relative glob", r[0] == 0 and last_req()["paths"] == [f"models--org--kept/snapshots/{REV1}/c.bin"],
       show(r) + repr(last_req()))
    for cmd in ("status", "doctor"):
        r = run(cmd, f"{good}/snapshots/*/*.safetensors", cwd="/")
        ok(f"{cmd}: a glob of two is refused, not its first alone",
           r[0] == 1 and "one PATH at a time" in r[2] and "matched 2" in r[2], show(r))
    r = run("unpin", f"{good}/snapshots/*/*.nomatch")
    ok("glob without a match", r[0] == 1 and "*.nomatch: no such file, and no match" in r[2], show(r))
    # --socket with no mount in sight: a name with '[' goes to the daemon as given
    lit = f"models--org--good/snapshots/{REV1}/x[1].bin"
    r = run("--socket", sock, "promote", "--dry-run", lit, cwd="/")
    ok("--socket, no mount: a name with [ sent as given", last_req()["paths"] == [lit]
       and r[0] == 1 and "no such file or directory in the mount" in r[2], show(r))
    os.mkdir(f"{work}/lit[1]")
    r = run("status", f"{work}/lit[1]")
    ok("an existing name with [ is not a glob", r[0] == 1 and "lit[1]: not inside a wfs mount" in r[2], show(r))
    # a link to the mount (or into it) from outside names its target
    os.symlink(root, f"{work}/to-mnt")
    os.symlink("to-mnt/models--org--good", f"{work}/to-good")
    for name, want in (("to-mnt", ""), ("to-good", "models--org--good")):
        r = run("promote", "--dry-run", f"{work}/{name}", cwd="/")
        ok(f"a link outside the mount to {want or 'its root'} is followed",
           r[0] == 0 and last_req()["paths"] == [want], show(r) + repr(last_req()))
    os.symlink(f"{work}/lit[1]", f"{work}/to-lit")
    r = run("status", f"{work}/to-lit")
    ok("a link outside the mount to a directory outside it",
       r[0] == 1 and "to-lit: not inside a wfs mount" in r[2], show(r))
    link = f"models--org--good/snapshots/{REV1}/config.json"
    r = run("promote", "--dry-run", link, cwd=root)
    ok("a snapshot link is sent as itself, not its target",
       r[0] == 0 and last_req()["paths"] == [link], show(r) + repr(last_req()))
    r = run("promote", "--dry-run", f"./models--org--good/snapshots/{REV2}/../{REV1}/.//config.json/", cwd=root)
    ok("dot segments", r[0] == 0 and last_req()["paths"] == [link], show(r) + repr(last_req()))
    r = run("promote", "--dry-run", "..", cwd=good)
    ok("dot-dot up to the root", r[0] == 0 and last_req()["paths"] == [""], repr(last_req()))
    r = run("promote", "--dry-run", "../../mnt/models--org--bad/../models--org--good", cwd=good)
    ok("dot-dot through the mount", r[0] == 0 and last_req()["paths"] == ["models--org--good"],
       repr(last_req()))
    r = run("--socket", sock, "promote", "--dry-run", "models--org--good/./snapshots", cwd="/")
    ok("--socket with a path relative to the mount root",
       r[0] == 0 and last_req()["paths"] == ["models--org--good/snapshots"], show(r) + repr(last_req()))
    r = run("--socket", sock, "pin", "../etc", cwd="/")
    ok("--socket: a path climbing out is refused", r[0] == 1 and "must be relative" in r[2], show(r))
    r = run("--socket", sock, "status", good, cwd="/")
    ok("--socket with a path in the mount still relativised",
       r[0] == 0 and last_req() == {"op": "status", "path": "models--org--good"}, repr(last_req()))
    other = f"{work}/mnt2"
    os.mkdir(other)
    os.setxattr(other, "user.wfs.socket", b"/nonexistent/wfs.sock")
    r = run("pin", good, other)
    ok("paths in two mounts", r[0] == 1 and "one mount at a time" in r[2], show(r))
    r = run("status", other)
    ok("daemon unreachable", r[0] == 1 and
       "cannot reach the wfs daemon at /nonexistent/wfs.sock: No such file or directory" in r[2], show(r))
    r = run("--json", "status", other)
    ok("--json, daemon unreachable: nothing on stdout, the reason on stderr",
       r[0] == 1 and r[1] == "" and "cannot reach the wfs daemon" in r[2], show(r))
    # --socket LOCAL_STORE (the directory), a file, a socket nobody listens
    # on: each said only "Connection refused"
    stale = f"{work}/stale.sock"
    s0 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s0.bind(stale)
    s0.close()
    with open(f"{work}/afile", "w"):
        pass
    for what, path, why in (("a directory", work, "a directory: the socket is LOCAL_STORE/wfs.sock"),
                            ("a file", f"{work}/afile", "not a socket"),
                            ("a stale socket", stale, "no daemon listens on it")):
        r = run("--socket", path, "status", cwd="/")
        ok(f"--socket naming {what}: says so", r[0] == 1 and why in r[2], show(r))
    r = run("pin", *[f"{good}/blobs/{'x' * 200}{i}" for i in range(400)])
    ok("request over 64 KiB refused locally", r[0] == 1 and "64 KiB" in r[2], show(r))

    # --- dry run
    before = [b.state for b in hub.blobs]
    r = run("promote", "--dry-run", "models--org--good", "models--org--huge", cwd=root)
    ok("dry run request", last_req() == {"op": "promote", "paths": ["models--org--good", "models--org--huge"],
                                         "pin": False, "dry_run": True, "force": False},
       repr(last_req()))
    ok("dry run output", r[0] == 0 and "BLOB" in r[1] and hexid("s1", 64) in r[1] and "48.0 MiB" in r[1]
       and f"models--org--huge/snapshots/{REV1}/pack.bin (id {blob_id('pack')})" in r[1]
       and "would copy 4 of 4 blobs" in r[1] and "NOT ENOUGH SPACE" in r[1], show(r))
    ok("dry run changes nothing", before == [b.state for b in hub.blobs])

    # --- EPERM
    sock2 = f"{store}/deny.sock"
    srv2 = Server(sock2, Hub(40), allow_uids={4242})
    r = run("--socket", sock2, "promote", "models--org--good", cwd="/")
    ok("EPERM reply", r[0] == 1 and "[EPERM]" in r[2] and "uid 0" in r[2] and r[1] == ""
       and "promote: promote:" not in r[2], show(r))
    r = run("--socket", sock2, "--json", "evict", "models--org--good", cwd="/")
    ok("EPERM with --json: reply on stdout too",
       r[0] == 1 and json.loads(r[1])["errno"] == "EPERM" and "[EPERM]" in r[2], show(r))
    r = run("--socket", sock2, "pin", "no-such-repo", cwd="/")
    ok("status is allowed, pin is not", r[0] == 1 and "EPERM" in r[2], show(r))
    r = run("--socket", sock2, "status", cwd="/")
    ok("status without privilege", r[0] == 0, show(r))
    # an EPERM of the NAS's is about the file: no word of privilege
    srv2.hub.nas_errors["models--org--good"] = (
        "EPERM", "promote: models--org--good/blobs/x: the NAS refused the open: "
        "Operation not permitted")
    srv2.allow_uids.add(os.getuid())
    r = run("--socket", sock2, "promote", "models--org--good", cwd="/")
    ok("EPERM of the NAS: its message alone", r[0] == 1 and "the NAS refused the open" in r[2]
       and "[EPERM]" in r[2] and "root" not in r[2] and "mounted" not in r[2], show(r))
    srv2.allow_uids.discard(os.getuid())
    srv2.hub.nas_errors.clear()
    r = run("--socket", sock2, "promote", "--dry-run", "models--org--good", cwd="/")
    ok("dry run without privilege", r[0] == 0, show(r))
    # a PATH in a mount whose daemon is another than --socket's: refused,
    # nothing asked of either (it acted on --socket's mount)
    n = len(hub.requests)
    r = run("--socket", sock2, "evict", f"{good}/snapshots", cwd="/")
    ok("--socket of another daemon than the PATH's mount: refused, both named", r[0] == 1
       and f"listens on {sock}, not on --socket {sock2}" in r[2] and len(hub.requests) == n,
       show(r))
    srv2.close()
    r = run("promote", "models--org--nothere", cwd=root)
    ok("daemon error names the path", r[0] == 1 and "models--org--nothere: no such file" in r[2]
       and "[ENOENT]" in r[2], show(r))

    # --- promote --wait --range: the bar as for whole files
    shard = f"models--org--good/snapshots/{REV1}/model-00001-of-00002.safetensors"
    r = run("promote", "--wait", "--range", "0:40M", shard, cwd=root, tty=True)
    frames = [l.rstrip() for l in screen(r[2]) if l.startswith("[")]
    ok("promote --wait --range: exit 0, every range local", r[0] == 0
       and f"promote: {shard}: every range local (partial)" in r[1], show(r))
    ok("promote --wait --range: the bar ends with the range local, no text left from an "
       "earlier, longer line", len(frames) == 1 and re.fullmatch(
           r"\[#{24}\] 100%  40\.0 MiB / 40\.0 MiB  [0-9.]+ MiB/s  ETA 0:00  1/1 local",
           frames[0]), show(r) + repr(frames))
    ok("promote --wait --range: a rate and an ETA while it copies",
       re.search(r"\r\[#*-+\] +\d+%  [^\r]* [1-9][0-9.]* MiB/s  ETA \d+:\d\d  0/1 local",
                 r[2]), show(r))
    r = run("promote", "--wait", "--json", "--range", "0:40M", shard, cwd=root)
    rep = json.loads(r[1]) if r[1].strip() else {}
    ok("promote --wait --range --json: the wait's outcome, 1 local, 0 failed",
       r[0] == 0 and (rep.get("local"), rep.get("failed")) == (1, 0), show(r))
    # ranges that cover the file make its whole copy: the reply has no
    # "part" then, and the last line said "0 B / 0 B"
    shard2 = f"models--org--good/snapshots/{REV1}/model-00002-of-00002.safetensors"
    r = run("promote", "--wait", "--range", "0:32M", shard2, cwd=root, tty=True)
    frames = [l.rstrip() for l in screen(r[2]) if l.startswith("[")]
    ok("promote --wait --range of the whole file: the bar ends with its bytes, local",
       r[0] == 0 and f"promote: {shard2}: every range local (local)" in r[1] and
       len(frames) == 1 and re.match(r"\[#{24}\] 100%  32\.0 MiB / 32\.0 MiB ", frames[0]),
       show(r) + repr(frames))
    r = run("evict", "--force", shard2, cwd=root)  # (pinned by a test above)
    ok("evict of that file", r[0] == 0, show(r))

    # --- promote --wait, success, with the bar on a terminal
    r = run("promote", "--wait", "models--org--good", cwd=root, tty=True)
    ok("promote --wait: exit 0", r[0] == 0, show(r))
    ok("promote --wait: the record refreshed once the copies settled",
       hub.requests[-1] == {"op": "sync"} and hub.requests[-2]["op"] == "progress"
       and "warning" not in r[2], show(r) + repr(hub.requests[-2:]))
    ok("promote --wait: summary", "promote: 3 blobs, 80.0 MiB to copy (0 already local)" in r[1]
       and "promote: 3 blobs local" in r[1], show(r))
    hist = {b.key: b.history for b in hub.blobs if b.repo == "models--org--good"}
    ok("states went queued -> copying -> local",
       all(h[-3:] == ["queued", "copying", "local"] for h in hist.values()), repr(hist))
    ok("progress polled", sum(q["op"] == "progress" for q in hub.requests) >= 5)
    ok("tty bar redrawn in place, ascii", "\r[" in r[2] and "100%" in r[2] and "MiB/s" in r[2]
       and "ETA" in r[2] and r[2].endswith("\n"), show(r))
    # an 80-column terminal: a line as wide as it wraps, and each redraw
    # (\r: back to the start of the last row only) leaves a row behind
    for cols in (80, 40):
        r = run("evict", "--force", "models--org--good", cwd=root)
        r = run("promote", "--wait", "models--org--good", cwd=root, tty=True, cols=cols)
        frames = [f for f in re.split(r"[\r\n]", r[2]) if f.strip()]
        ok(f"promote --wait on a {cols}-column terminal: every bar line fits",
           r[0] == 0 and len(frames) > 1 and all(len(f) < cols for f in frames)
           and (cols < 80 or frames[-1].rstrip().endswith("3/3 local")), show(r) + repr(frames))
    r = run("promote", "--wait", "--json", "models--org--good", cwd=root)
    rep = json.loads(r[1]) if r[0] == 0 else {}
    ok("promote --wait --json prints the final progress reply",
       r[0] == 0 and rep.get("ok") and [b["state"] for b in rep["blobs"]] == ["local"] * 3, show(r))
    ok("... with the wait's outcome: 3 local, 0 failed",
       (rep.get("local"), rep.get("failed")) == (3, 0), show(r))
    ok("nothing copied: no sync", hub.requests[-1]["op"] == "progress", repr(hub.requests[-1]))

    # --- failures
    r = run("promote", "--wait", "--pin", "models--org--bad", cwd=root)
    ok("failed and mismatch listed, exit 1", r[0] == 1
       and f"models--org--bad/blobs/{hexid('w', 64)}: mismatch: sha256 of the NAS" in r[2]
       and ": failed: NAS read error at offset 1048576" in r[2]
       and "2 of 3 blobs did not become local" in r[2], show(r))
    ok("the last progress line counts only what became local (the failed copy's and the "
       "mismatch's bytes read are not)", re.findall(r"\] +(\d+)%  ([^ ]+ [KMG]?i?B) /", r[2])[-1:]
       == [("0", "300 B")], show(r))
    ok("--pin sent", [q for q in hub.requests if q["op"] == "promote"][-1]["pin"] is True)
    ok("a failed copy names the file and the NAS's error",
       f"models--org--bad/blobs/{hexid('tok', 64)}: failed: NAS read error at offset 1048576: "
       "Input/output error" in r[2], show(r))
    ok("the record refreshed after a wait with failures too", hub.requests[-1] == {"op": "sync"},
       repr(hub.requests[-1]))
    rd = run("promote", "--dry-run", "models--org--bad", cwd=root)
    ok("dry run: a mismatch is not among the blobs it would copy", rd[0] == 0
       and "would copy 1 of 3 blobs, 2.0 MiB" in rd[1]
       and "1 mismatch not copied: the NAS content does not hash to its name" in rd[1], show(rd))
    r2 = run("promote", "--wait", "models--org--bad", cwd=root)
    totals = re.findall(r"\] +\d+%  [^ ]+ [KMG]?i?B / ([^ ]+ [KMG]?i?B)", r2[2])
    ok("a blob flagged mismatch before the wait is not in its byte total (the daemon never "
       "copies it): the failed blob's 2.0 MiB only", r2[0] == 1 and totals
       and set(totals) == {"2.0 MiB"}, show(r2))
    ok("non-tty progress is whole lines", "\r" not in r[2] and "[" in r[2], show(r))
    # "ok" is the reply's; what a script tests is the wait's outcome (it
    # once read "ok":true alone, with exit 1 and two copies failed)
    r = run("promote", "--wait", "--json", "models--org--bad", cwd=root)
    rep = json.loads(r[1]) if r[1].strip() else {}
    ok("promote --wait --json with failures: exit 1, \"failed\": 2, \"local\": 1",
       r[0] == 1 and (rep.get("failed"), rep.get("local")) == (2, 1), show(r))
    r = run("status", cwd=root)
    ok("status shows flagged blobs loudly", "MISMATCH" in r[1] and "FAILED" in r[1]
       and "2 flagged blobs" in r[1], show(r))
    with hub.lock:
        k3 = [b for b in hub.blobs if b.tag == "k3"][0]
        k3.local_error, was = True, (k3.state, k3.reason)
        k3.set("nas", "local copy unreadable: Input/output error (demoted; NAS bytes from now on)")
    r = run("status", cwd=root)
    ok("status flags a local copy that failed a read", "3 flagged blobs" in r[1] and re.search(
        r"\nLOCAL-ERR +models--org--kept/blobs/%s: local copy unreadable: Input/output error"
        % hexid("k3", 64), r[1]), show(r))
    with hub.lock:
        k3.local_error = False
        k3.set(*was)
    r = run("promote", "--wait", "models--org--flaky", cwd=root)
    ok("blob dropped mid-copy stops the wait", r[0] == 1
       and "dropped, still served from the NAS: evicted to make room" in r[2], show(r))
    r = run("promote", "--wait", "models--org--huge", cwd=root)
    ok("blob that does not fit", r[0] == 1 and "does not fit" in r[2] and "2.0 TiB to copy" in r[1], show(r))
    r = run("promote", "models--org--huge", cwd=root)
    ok("without --wait a refused blob is mentioned", r[0] == 0 and "not queued (nas)" in r[2],
       show(r))
    # non-tty periodic lines, and copies in flight in status
    for b in hub.blobs:
        if b.repo == "models--org--good":
            b.set("nas")
            b.done = 0
    hub.speed = 20 * MiB
    n0 = len(hub.requests)
    p = subprocess.Popen([t.wfsctl, "promote", "--wait", good], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)

    def copying():
        with hub.lock:
            return any(b.repo == "models--org--good" and b.state == "copying" and b.done > 0
                       for b in hub.blobs)
    ok("a copy under way", wfstest.wait_until(copying, 30, 0.01))
    r = run("status", good)
    ok("status shows copies in flight", "copies in flight" in r[1] and "%" in r[1], show(r))
    out, err = p.communicate(timeout=60)
    lines = err.decode().splitlines()
    polls = sum(q["op"] == "progress" for q in hub.requests[n0:])
    # 80 MiB at 20 MiB/s: at least 4 s of copying, a line every 2 s of it
    # (never one a poll: wfsctl polls at least 4 times a second)
    ok("non-tty: a heartbeat line, not one per poll",
       p.returncode == 0 and 2 <= len(lines) <= polls // 3 + 2,
       "%d progress polls\n%s" % (polls, err.decode()))

    # the NAS goes down and comes back while copies are under way: a line
    # each, the wait goes on
    def through_outage(args, under_way, what):
        """Run wfsctl ARGS; once under_way(), the NAS down for two polls,
        then up; returns (exit status, stderr)."""
        nas_was = dict(hub.nas)
        p = subprocess.Popen([t.wfsctl] + args, cwd=root, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        ok(f"{what}: a copy under way before the outage", wfstest.wait_until(under_way, 30, 0.01))
        m = len(hub.requests)
        with hub.lock:
            hub.nas.update(state="down", since=int(time.time()) - 5, outages=1,
                           reason="a call took longer than 1000 ms")
        ok(f"{what}: polled while the NAS is down", wfstest.wait_until(
            lambda: sum(q["op"] == "progress" for q in hub.requests[m:]) >= 2, 30, 0.01))
        with hub.lock:
            hub.nas.update(state="up")
        _, err = p.communicate(timeout=60)
        hub.nas = nas_was
        return p.returncode, err.decode()

    run("evict", "--force", good)
    rc, err = through_outage(["promote", "--wait", good], copying, "promote --wait")
    ok("promote --wait says once that the NAS is down, and why, and once that it is back",
       rc == 0 and err.count("the NAS is DOWN since") == 1
       and re.search(r"wfsctl: promote: the NAS is DOWN since [-0-9]+ [0-9:]+ \(\d+ s\): a call "
                     r"took longer than 1000 ms.*: the copies wait for it \(those not "
                     r"started yet start once it answers\)", err)
       and err.count("wfsctl: promote: the NAS answers again") == 1
       and err.index("DOWN since") < err.index("answers again"), err)

    # the same for promote --wait --range (a part: "have" replaced, in this stand-in)
    def range_copying():
        with hub.lock:
            return any(b.part and b.part["copying"] and b.part["done"] > 0 and b.part["want"] ==
                       16 * MiB for b in hub.blobs)
    hub.speed = 4 * MiB
    rc, err = through_outage(["promote", "--wait", "--range", "0:16M", shard], range_copying,
                             "promote --wait --range")
    ok("promote --wait --range says once that the NAS is down and once that it is back",
       rc == 0 and err.count("wfsctl: promote: the NAS is DOWN since") == 1
       and err.count("wfsctl: promote: the NAS answers again") == 1, err)
    hub.speed = 40 * MiB

    # --- the record cannot be refreshed: a warning, the exit status stays
    for err, old in ((("EHOSTDOWN", "sync: the NAS is down (since 2026-11-30 22:41:07: a stat "
                       "of x\x1b[2J took longer than 1000 ms): the local record could not be "
                       "refreshed; it keeps what it held"), False), (None, True)):
        run("evict", "--force", good)
        hub.sync_error, hub.old_daemon = err, old
        r = run("promote", "--wait", good)
        if old:
            ok("an older daemon without sync: no warning", r[0] == 0 and "warning" not in r[2]
               and hub.requests[-1] == {"op": "sync"}, show(r))
        else:
            ok("sync refused: a warning, exit 0", r[0] == 0 and "promote: 3 blobs local" in r[1]
               and "wfsctl: promote: warning: sync: the NAS is down (since" in r[2]
               and "[EHOSTDOWN]" in r[2] and "NAS outage would hide them" in r[2]
               and "of x?[2J took" in r[2] and "\x1b" not in r[2], show(r))
    hub.sync_error, hub.old_daemon = None, False

    # --- a blob the daemon forgets during --wait
    r = run("evict", "--force", good)
    ok("evict a repo", r[0] == 0 and "evicted 3 blobs" in r[1], show(r))
    hub.speed = 10 * MiB
    n0 = len(hub.requests)
    p = subprocess.Popen([t.wfsctl, "promote", "--wait", good], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    ok("wfsctl polls progress", wfstest.wait_until(
        lambda: any(q["op"] == "progress" for q in hub.requests[n0:]), 30, 0.01))
    with hub.lock:
        gone = [b for b in hub.blobs if b.tag == "cfg"][0]
        hub.blobs.remove(gone)
    out, err = p.communicate(timeout=60)
    ok("a forgotten blob ends the wait with exit 1", p.returncode == 1 and
       f"{gone.key}: no longer known to the daemon: no such blob".encode() in err, err.decode())
    with hub.lock:
        hub.blobs.insert(0, gone)
    hub.speed = 40 * MiB

    # --- daemon killed during --wait
    sock3 = f"{store}/dies.sock"
    hub3 = Hub(1)
    srv3 = Server(sock3, hub3)
    p = subprocess.Popen([t.wfsctl, "--socket", sock3, "promote", "--wait", "models--org--good"],
                         cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ok("wfsctl polls progress of the dying daemon", wfstest.wait_until(
        lambda: any(q["op"] == "progress" for q in hub3.requests), 30, 0.01))
    srv3.close()
    os.unlink(sock3)
    out, err = p.communicate(timeout=30)
    # the next poll finds no socket, or (polls come sooner near the start)
    # a connection the dying daemon took and closed
    ok("daemon gone during --wait", p.returncode == 1 and
       (b"cannot reach the wfs daemon" in err or
        b"closed the connection without replying" in err), err.decode())

    # --- evict / verify (the glob tests above pinned some)
    r = run("unpin", "models--org--good", f"models--org--kept/snapshots/{REV1}/c.bin", cwd=root)
    ok("unpin", r[0] == 0 and "unpinned 4 blobs" in r[1], show(r))
    r = run("evict", "models--org--kept", cwd=root)
    ok("evict: pinned skipped, exit 1", r[0] == 1 and "evicted 2 blobs" in r[1]
       and f"blobs/{hexid('k2', 64)}: not evicted: pinned" in r[2], show(r))
    ok("evict request", last_req() == {"op": "evict", "paths": ["models--org--kept"], "force": False})
    r = run("pin", "models--org--good", cwd=root)
    r = run("evict", "--force", "models--org--good", cwd=root)
    ok("evict --force drops pinned copies", r[0] == 0 and last_req()["force"] is True
       and "evicted 3 blobs" in r[1], show(r))
    for b in hub.blobs:
        if b.repo == "models--org--kept":
            b.set("local")
            b.done = b.size
    r = run("verify", cwd=root)
    ok("verify with no PATH: the whole mount", last_req() == {"op": "verify", "paths": [""], "full": False},
       repr(last_req()))
    ok("verify reports demoted, exit 1", r[0] == 1 and "checked 4 blobs" in r[1]
       and "demoted, served from the NAS again: NAS source changed" in r[2], show(r))
    r = run("verify", "--full", "models--org--kept", cwd=root)
    ok("verify --full clean", r[0] == 0 and last_req()["full"] is True and "0 demoted" in r[1], show(r))
    r = run("unpin", "--json", "models--org--kept", cwd=root)
    ok("unpin --json", r[0] == 0 and json.loads(r[1]) == {"ok": True, "count": 3}, show(r))

    # --- broken peers
    for mode, want in (("garbage", "not a wfs reply"), ("huge", "over 256 MiB"),
                       ("silent", "closed the connection without replying"),
                       ("cut", "closed the connection in the middle of its reply")):
        s = f"{store}/{mode}.sock"
        bad = Server(s, Hub(1), mode=mode)
        r = run("--socket", s, "status")
        ok(f"peer sends {mode}", r[0] == 1 and want in r[2], show(r))
        bad.close()
    # A daemon at its caps answers EAGAIN without reading and closes: the
    # request sent after that fails (EPIPE; strace holds wfsctl's send back
    # until then), and the refusal waiting to be read is what wfsctl says
    # -- it said "closed the connection without replying", and promote
    # --wait gave up instead of asking again.
    s = f"{store}/away.sock"
    ok("strace is installed (tools/install-deps)", shutil.which("strace") is not None)
    away = Server(s, Hub(1), mode="turn_away")
    p = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=sendto",
                        "-e", "inject=sendto:delay_enter=300000", t.wfsctl, "--socket", s,
                        "status"], capture_output=True, timeout=60)
    err = p.stderr.decode(errors="replace")
    ok("a refusal sent before the request is read", p.returncode == 1 and
       "try again later [EAGAIN]" in err and "without replying" not in err, err)
    away.close()
    # a daemon that never answers (stopped): the timeout, exit 3, the socket named
    s = f"{store}/hang.sock"
    hang = Server(s, Hub(1), mode="hang")
    t0 = time.monotonic()
    r = run("--socket", s, "--timeout", "1", "status", timeout=30)
    ok("no reply: exit 3 after --timeout", r[0] == 3 and time.monotonic() - t0 < 10
       and f"wfsctl: status: the wfs daemon at {s} did not answer within 1 s: " in r[2]
       and "--timeout SECONDS" in r[2], show(r))
    r = run("status", "--timeout=0", "--timeout", "1", "--socket", s, timeout=30)
    ok("--timeout after the command", r[0] == 3 and "within 1 s" in r[2], show(r))
    for bad in ("-1", "1.5", "x", ""):
        r = run("--timeout", bad, "--socket", s, "status", timeout=30)
        ok(f"--timeout '{bad}': usage error", r[0] == 2 and "--timeout" in r[2], show(r))
    hang.close()
    # promote --wait: a poll turned away (EAGAIN) is asked again, not a failure
    s = f"{store}/busy.sock"
    bhub = Hub(40)
    busy = Server(s, bhub)
    busy.busy_polls = 3
    r = run("--socket", s, "promote", "--wait", "models--org--good", timeout=60)
    ok("promote --wait survives EAGAIN polls", r[0] == 0 and busy.busy_polls == 0
       and "3 blobs local" in r[1] and "EAGAIN" not in r[2], show(r))
    busy.close()
    # a socket path longer than sun_path
    deep = f"{work}/" + "/".join(["d" * 50] * 3)
    os.makedirs(deep)
    s = f"{deep}/wfs.sock"
    longsrv = None
    try:
        cwd = os.getcwd()
        os.chdir(deep)
        longsrv = Server("wfs.sock", Hub(1))
    finally:
        os.chdir(cwd)
    r = run("--socket", s, "status")
    ok(f"socket path of {len(s)} bytes", r[0] == 0 and "REPO" in r[1], show(r))
    longsrv.close()
    # as another user: reaching the daemon needs the socket, finding it the xattr
    if os.getuid() == 0:
        os.chmod(work, 0o755)
        os.chmod(store, 0o755)
        os.chmod(sock, 0o777)
        rc, out, err = wfstest.run_as_uid([t.wfsctl, "evict", good], wfstest.NOBODY, 60)
        ok("as nobody: EPERM from SO_PEERCRED", rc == 1 and "[EPERM]" in err
           and "uid 65534" in err, err)
        # a glob through a directory nobody may read names it
        shut = f"{work}/globt/shut"
        os.makedirs(shut)
        os.makedirs(f"{work}/globt/open")
        os.chmod(shut, 0o700)
        rc, out, err = wfstest.run_as_uid([t.wfsctl, "status", f"{work}/globt/*/*.bin"],
                                          wfstest.NOBODY, 60)
        ok("as nobody: a glob through an unreadable directory names it",
           rc not in (0, None) and f"wfsctl: {shut}: cannot read the directory: Permission denied"
           in err, err)
    srv.close()


def nas_tests(t, hub, root):
    """wfsctl status and stats with the NAS up, down, and up again."""
    run, ok = t.run, t.expect

    def show(r):
        return f"rc={r[0]}\n--stdout--\n{r[1]}--stderr--\n{r[2]}"

    r = run("status", cwd=root)
    ok("status: NAS up", r[0] == 0 and "\nNAS: up\n" in r[1] and "DOWN" not in r[1], show(r))
    ok("status: the record line", re.search(r"\nlocal record: 3 files, 9 names, built "
                                            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(1 min \d+ s ago\)\n",
                                            r[1]) and "the NAS is down" not in r[1], show(r))
    r = run("stats", cwd=root)
    ok("stats: NAS up, record", r[0] == 0 and "\nnas             up\n" in r[1]
       and "\nlocal record    3 files, 9 names" in r[1]
       and "1 failed, 0 cancelled, 2 retried by the daemon" in r[1]
       and "local reads     0 failed (the copies demoted)" in r[1], show(r))

    since = int(time.time()) - 12
    with hub.lock:
        hub.nas.update(state="down", since=since, outages=1, timeouts=3, failed_down=2,
                       from_record=41, stuck=1, reason="a call took longer than 1000 ms")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(since))
    down = (r"DOWN since %s \((1[2-9]|[2-9]\d) s\): a call took longer than 1000 ms; 3 calls "
            r"timed out, 41 requests answered from the local record, 2 refused; 1 call still stuck "
            r"in the NAS\n" % re.escape(when))
    r = run("status", cwd=root)
    ok("status: NAS down, since when, why, and the counts", r[0] == 0
       and re.search(r"\nNAS: " + down, r[1]), show(r))
    ok("status: what the figures are while it is down",
       "the figures below are what the local record and the store" in r[1] and "REPO" in r[1], show(r))
    r = run("--json", "status", cwd=root)
    js = json.loads(r[1]) if r[0] == 0 else {}
    ok("status --json: nas, record and from as sent", js.get("nas") == dict(hub.nas, path="/nas/hub")
       and js.get("record") == hub.record and js.get("from") == "record", show(r))
    r = run("stats", cwd=root)
    ok("stats: NAS down", r[0] == 0 and re.search(r"\nnas             " + down, r[1]), show(r))
    r = run("stats", "--json", cwd=root)
    ok("stats --json: nas as sent",
       r[0] == 0 and json.loads(r[1])["metrics"]["nas"]["state"] == "down", show(r))

    with hub.lock:
        hub.nas.update(state="up", since=since + 10, stuck=0, failed_down=0)
    r = run("status", cwd=root)
    ok("status: up again, the last outage", re.search(
        r"\nNAS: up since %s \(\d+ s\); 1 outage so far, the last: a call took longer than 1000 "
        r"ms; 3 calls timed out, 41 requests answered from the local record\n"
        % re.escape(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(since + 10))), r[1])
       and "the NAS is down" not in r[1], show(r))
    with hub.lock:
        hub.record.update(kept=False, files=0, entries=0, built=0)
    with hub.lock:
        hub.nas.update(busy=7)
    r = run("status", cwd=root)
    ok("status: up, calls that found no free NAS thread", re.search(
        r"\nNAS: up since [^\n]*; 3 calls timed out, 41 requests answered from the local record, "
        r"7 calls found no free NAS thread in time\n", r[1]), show(r))
    with hub.lock:
        hub.nas.update(busy=0, reason="start-up: a stat of models--x\x1b[2J/blobs/y took too long")
    r = run("status", cwd=root)
    ok("status: a NAS path in the reason, its control characters as '?'", r[0] == 0
       and "the last: start-up: a stat of models--x?[2J/blobs/y took too long" in r[1]
       and "\x1b" not in r[1], show(r))
    with hub.lock:
        hub.nas.update(reason="a call took longer than 1000 ms")
    r = run("status", cwd=root)
    ok("status: no record kept", "\nlocal record: none kept by this mount" in r[1], show(r))
    with hub.lock:
        hub.record.update(kept=True, files=3, entries=9, built=int(time.time()) - 60)
        hub.nas.update(outages=0, timeouts=0, from_record=0, reason="")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(selftest(sys.argv[1]))
