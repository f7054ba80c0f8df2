#!/usr/bin/env python3
"""The manual pages agree with the programs: every option and command that
`wfs --help` and `wfsctl [COMMAND] --help` print is in doc/wfs.1 and
doc/wfsctl.1, and the pages document nothing the programs do not take; the
pages carry the programs' version. No mount."""

import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402


def _unroff(s):
    s = s.replace("\\-", "-").replace("\\(dq", '"').replace("\\&", "")
    return re.sub(r"\\f[BIRP]", "", s)


def _help(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise AssertionError("%s exited %d: %s" % (" ".join(argv), r.returncode, r.stderr))
    return r.stdout


class ManPages(unittest.TestCase):
    """doc/wfs.1 and doc/wfsctl.1 agree with --help: every option and
    command in one is in the other."""

    def test_wfs_1(self):
        man = wfstest.man_page("wfs.1")
        plain = _unroff(man)
        hlp = _help([wfstest.wfs_bin(), "--help"])
        ver = _help([wfstest.wfs_bin(), "--version"]).split()[1]
        self.assertRegex(man, r'\.TH WFS 1 "[^"]*" "wfs %s"' % re.escape(ver))
        opt_lines = wfstest.text_section(hlp, "wfs -o options:", ("FUSE -o options",))
        in_help = set(re.findall(r"^  ([a-z_]+)=", "\n".join(opt_lines), re.M))
        self.assertGreater(len(in_help), 10, opt_lines)
        man_opts = wfstest.text_section(man, ".SS \"wfs \\-o options\"", (".SS \"FUSE",))
        in_man = set(re.findall(r"^\.B[IR]? ([a-z_]+)=", "\n".join(man_opts), re.M))
        self.assertEqual(sorted(in_help - in_man), [], "in wfs --help, not in wfs.1")
        self.assertEqual(sorted(in_man - in_help), [], "in wfs.1, not in wfs --help")
        for flag in re.findall(r"^  (-\w)(?:, (--[a-z-]+))?", hlp, re.M):
            for f in flag:
                if f:
                    self.assertIn(f, plain, "wfs --help has %s; wfs.1 does not" % f)
        fuse = " ".join(wfstest.text_section(hlp, "FUSE -o options", ("A revision",)))
        for word in re.findall(r"\b(allow_other|allow_root|auto_unmount|nosuid|nodev|noatime|"
                               r"defaults|nofail|noauto|users?|_netdev|x-\*)\b", fuse):
            self.assertIn(word, plain, "wfs --help names %s; wfs.1 does not" % word)

    def test_index_version(self):
        """The format version of index.json that wfs.1 and the README give
        is the one the code writes (core/index.h)."""
        with open(os.path.join(wfstest.REPO, "core", "index.h")) as f:
            code = int(re.search(r"^#define INDEX_VERSION (\d+)$", f.read(), re.M).group(1))
        man = " ".join(_unroff(wfstest.man_page("wfs.1")).split())
        self.assertEqual(re.findall(r"index\.json The state index \(mode 0600, format version (\d+)", man),
                         [str(code)], "wfs.1 on LOCAL_STORE/index.json")
        with open(os.path.join(wfstest.REPO, "README.md")) as f:
            readme = f.read()
        self.assertEqual(set(re.findall(r"The index \(version (\d+)\)", readme)), {str(code)},
                         "README.md on the index")

    def test_wfsctl_1(self):
        man = wfstest.man_page("wfsctl.1")
        plain = _unroff(man)
        wfsctl = wfstest.wfsctl_bin()
        hlp = _help([wfsctl, "--help"])
        cmds = re.findall(r"^  ([a-z]+) +(.*)$", "\n".join(wfstest.text_section(hlp, "commands:", ("",))), re.M)
        self.assertGreaterEqual(len(cmds), 7, hlp)
        sections = {}
        cur = None
        # the commands' subsections: those of COMMANDS (JSON OUTPUT has its
        # own, one per reply, named by command too)
        for ln in wfstest.text_section(man, ".SH COMMANDS", (".SH ",))[1:]:
            m = re.match(r'^\.SS "(.*)"$', ln)
            if m:
                cur = _unroff(m.group(1))
                sections[cur] = []
            elif cur:
                sections[cur].append(ln)
        man_cmds = {k.split()[0]: k for k in sections}
        self.assertEqual(sorted(man_cmds), sorted(c for c, _ in cmds),
                         "commands in wfsctl.1 vs wfsctl --help")
        for name, synopsis in cmds:
            self.assertEqual(man_cmds[name], ("%s %s" % (name, synopsis)).strip(),
                             "the synopsis of %s" % name)
            chelp = _help([wfsctl, name, "--help"])
            opts = set(re.findall(r"^  (--[a-z-]+)", "\n".join(wfstest.text_section(chelp, "options:", ("\n",))), re.M))
            common = {"--json", "--socket", "--timeout", "--help"}
            documented = set(re.findall(r"^\.BI? (--[a-z-]+)(?: .*)?$",
                                        _unroff("\n".join(sections[man_cmds[name]])), re.M))
            self.assertEqual(sorted(opts - common - documented), [],
                             "wfsctl %s --help options not in its wfsctl.1 section" % name)
            self.assertEqual(sorted(documented - opts), [],
                             "wfsctl.1 documents options wfsctl %s does not take" % name)
        for opt in re.findall(r"^  (-\w, )?(--[a-z-]+)", "\n".join(wfstest.text_section(hlp, "options:", ("PATH is",))), re.M):
            for o in opt:
                if o:
                    self.assertIn(o.rstrip(", "), plain)

    def test_examples_name_paths_wfsctl_can_find(self):
        """A wfsctl line of an EXAMPLES block with a relative PATH runs from
        inside the mount (a `cd` before it in the block) or with --socket:
        wfsctl resolves a PATH against the current directory, so without
        either it says "not inside a wfs mount" (wfs.1's example did)."""
        takes_value = {"--socket", "--timeout", "--range", "--part", "--ref"}
        for page in ("wfs.1", "wfsctl.1"):
            text = _unroff(wfstest.man_page(page))
            examples = text.split(".SH EXAMPLES", 1)[1].split(".SH ", 1)[0]
            for block in re.findall(r"^\.nf$(.*?)^\.fi$", examples, re.M | re.S):
                cd = False
                for line in block.strip().splitlines():
                    words = line.split()
                    if words and words[0] == "cd":
                        cd = True
                    if not words or words[0] != "wfsctl" or cd or "--socket" in words:
                        continue
                    rel = []  # words[1] is the command
                    for i, w in enumerate(words[2:], 2):
                        if w.startswith("-") or words[i - 1] in takes_value or w in (">", "&&"):
                            continue
                        if not w.startswith("/") and not w.startswith(">"):
                            rel.append(w)
                    self.assertEqual(rel, [], "%s EXAMPLES: %r names a relative PATH with no cd "
                                     "into the mount before it" % (page, line))


if __name__ == "__main__":
    wfstest.main()
