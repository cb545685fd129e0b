#!/usr/bin/env python3
"""Self-test of scripts/update_perf_section.py, on temporary copies only.

    python3 scripts/test_update_perf_section.py
"""
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "update_perf_section.py")
DOC = os.path.join(ROOT, "docs", "performance.md")
BLOCK = re.compile(r"<!-- bench:(.+?) begin -->\n.*?<!-- bench:\1 end -->", re.S)

SAMPLE = """# Performance

Intro written by hand.

## SHMEM

Text above the block.

<!-- bench:SHMEM begin -->
Command: `old command` — 2020-01-01, 2 cores (X), Linux.

| a | b |
|---|---|
| 1 | 2 |

<!-- bench:SHMEM end -->

Analysis below the block, kept.

<!-- bench:SHMEM network begin -->
Command: `net` — 2020-01-01.

| n |
|---|
| 9 |

<!-- bench:SHMEM network end -->

## Kernels

Kernels text.
"""


def today():
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


class UpdatePerfSection(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="perf_test.")
        self.doc = os.path.join(self.dir, "performance.md")
        with open(self.doc, "w") as f:
            f.write(SAMPLE)

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_script(self, *args, stdin=None, doc=None):
        return subprocess.run([sys.executable, SCRIPT, "--doc", doc or self.doc, *args], input=stdin,
                              capture_output=True, text=True)

    def read(self, doc=None):
        with open(doc or self.doc) as f:
            return f.read()

    def test_replaces_only_between_markers(self):
        r = self.run_script("SHMEM", "bash new.sh build", "| x | y |\n|---|---|\n| 3 | 4 |\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        text = self.read()
        old = BLOCK.search(SAMPLE).group(0)
        new = BLOCK.search(text).group(0)
        self.assertEqual(text.replace(new, old), SAMPLE)  # nothing else moved
        self.assertIn("| 3 | 4 |", new)
        self.assertNotIn("| 1 | 2 |", new)
        self.assertIn(f"Command: `bash new.sh build` — {today()}, ", new)
        self.assertNotIn("old command", text)
        self.assertIn("Analysis below the block, kept.", text)
        self.assertIn("| 9 |", text)  # the other block of the section

    def test_second_update_keeps_one_block(self):
        for body in ("| a |\n|---|\n| 1 |", "| a |\n|---|\n| 2 |"):
            self.assertEqual(self.run_script("SHMEM", "cmd", body).returncode, 0)
        text = self.read()
        self.assertEqual(text.count("<!-- bench:SHMEM begin -->"), 1)
        self.assertEqual(text.count("<!-- bench:SHMEM end -->"), 1)
        self.assertIn("| 2 |", text)
        self.assertNotIn("| 1 |\n", BLOCK.search(text).group(0))

    def test_block_name_with_a_space(self):
        self.assertEqual(self.run_script("SHMEM network", "bash net.sh", "| n |\n|---|\n| 7 |").returncode, 0)
        text = self.read()
        self.assertIn("| 7 |", text)
        self.assertNotIn("| 9 |", text)
        self.assertIn("| 1 | 2 |", text)  # the SHMEM block is untouched

    def test_body_from_stdin(self):
        r = self.run_script("SHMEM", "cmd", "-", stdin="| s |\n|---|\n| 5 |\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| 5 |", self.read())

    def test_heading_without_markers_gets_a_block(self):
        self.assertEqual(self.run_script("Kernels", "bash k.sh", "| k |\n|---|\n| 1 |").returncode, 0)
        text = self.read()
        section = text[text.index("## Kernels"):]
        self.assertTrue(section.startswith("## Kernels\n\n<!-- bench:Kernels begin -->\nCommand: `bash k.sh`"))
        self.assertIn("<!-- bench:Kernels end -->\n\nKernels text.\n", section)

    def test_unknown_name_appends_a_section(self):
        self.assertEqual(self.run_script("Runtime", "bash r.sh", "| r |\n|---|\n| 1 |").returncode, 0)
        text = self.read()
        self.assertTrue(text.startswith(SAMPLE.rstrip("\n")))
        self.assertIn("\n\n## Runtime\n\n<!-- bench:Runtime begin -->\n", text)
        self.assertTrue(text.endswith("<!-- bench:Runtime end -->\n"))

    def test_broken_markers_leave_the_file(self):
        broken = SAMPLE.replace("<!-- bench:SHMEM end -->", "<!-- bench:SHMEM begin -->", 1)
        with open(self.doc, "w") as f:
            f.write(broken)
        r = self.run_script("SHMEM", "cmd", "| z |")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("markers", r.stderr)
        self.assertEqual(self.read(), broken)

    def test_empty_body_leaves_the_file(self):
        r = self.run_script("SHMEM", "cmd", "  \n")
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(self.read(), SAMPLE)

    def test_file_mode_is_kept(self):
        os.chmod(self.doc, 0o644)
        self.run_script("SHMEM", "cmd", "| m |")
        self.assertEqual(os.stat(self.doc).st_mode & 0o777, 0o644)

    def test_real_doc_every_block(self):
        """A copy of docs/performance.md: every block replaced, the hand-written text unchanged."""
        copy = os.path.join(self.dir, "real.md")
        shutil.copy(DOC, copy)
        original = self.read(copy)
        names = BLOCK.findall(original)
        self.assertGreater(len(names), 0)
        self.assertEqual(len(names), len(set(names)), "a block name is used twice")
        for name in names:
            r = self.run_script(name, f"bash {name}.sh", f"| {name} |\n|---|\n| fresh |", doc=copy)
            self.assertEqual(r.returncode, 0, r.stderr)
        text = self.read(copy)
        self.assertEqual(BLOCK.sub("BLOCK", text), BLOCK.sub("BLOCK", original))
        self.assertEqual(text.count("| fresh |"), len(names))

    def test_makefile_blocks_exist_in_the_doc(self):
        """Every block `make bench` writes has its markers in docs/performance.md, and the reverse."""
        with open(os.path.join(ROOT, "Makefile")) as f:
            made = set(re.findall(r"^\t@\$\(call perf_section,([^,]+),", f.read(), re.M))
        self.assertGreater(len(made), 0)
        self.assertEqual(made, set(BLOCK.findall(self.read(DOC))))


if __name__ == "__main__":
    unittest.main(verbosity=2)
