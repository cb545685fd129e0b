#!/usr/bin/env python3
"""Puts a benchmark's fresh table into docs/performance.md without touching the rest.

Each generated block of the file sits between two markers:

    <!-- bench:NAME begin -->
    Command: `COMMAND` — DATE, CORES cores (CPU), OS, load average L.

    BODY (the table the benchmark printed)

    <!-- bench:NAME end -->

Only the text between the markers of NAME is replaced (the command and date
line included); what a person wrote around them in the section stays as it
is. Without the markers, the block goes right under the heading `## NAME`;
without that heading either, a new section `## NAME` is appended.

usage: update_perf_section.py [--doc PATH] NAME COMMAND BODY
       (BODY "-": read it from stdin)
"""
import datetime
import os
import platform
import re
import sys
import tempfile

DEFAULT_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "performance.md")


def begin_marker(name):
    return f"<!-- bench:{name} begin -->"


def end_marker(name):
    return f"<!-- bench:{name} end -->"


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    text = f"{os.cpu_count()} cores ({cpu}), {platform.system()}"
    try:
        text += f", load average {os.getloadavg()[0]:.2f} at the end"
    except OSError:
        pass
    return text


def block(name, command, body, today=None):
    today = today or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return (f"{begin_marker(name)}\nCommand: `{command}` — {today}, {machine()}.\n\n"
            f"{body.strip()}\n\n{end_marker(name)}")


def update(text, name, new_block):
    """text with NAME's block replaced by new_block; raises ValueError on broken markers."""
    begin, end = begin_marker(name), end_marker(name)
    nb, ne = text.count(begin), text.count(end)
    if nb or ne:
        if nb != 1 or ne != 1:
            raise ValueError(f"'{name}': {nb} begin and {ne} end markers (want one of each)")
        i, j = text.index(begin), text.index(end)
        if j < i:
            raise ValueError(f"'{name}': the end marker comes before the begin marker")
        return text[:i] + new_block + text[j + len(end):]
    heading = re.compile(rf"^## {re.escape(name)}[ \t]*\n", re.M)
    m = heading.search(text)
    if m:  # the block right under the heading, before what the section already says
        rest = text[m.end():].lstrip("\n")
        return text[:m.end()] + "\n" + new_block + ("\n\n" + rest if rest else "\n")
    return text.rstrip("\n") + f"\n\n## {name}\n\n{new_block}\n"


def main(argv):
    doc = DEFAULT_DOC
    if len(argv) >= 2 and argv[0] == "--doc":
        doc, argv = argv[1], argv[2:]
    if len(argv) != 3:
        sys.exit(__doc__)
    name, command, body = argv
    if body == "-":
        body = sys.stdin.read()
    if not body.strip():
        sys.exit(f"update_perf_section.py: '{name}': the benchmark printed nothing; {doc} left as it is")
    text = open(doc).read() if os.path.exists(doc) else "# Performance\n"
    try:
        text = update(text, name, block(name, command, body))
    except ValueError as e:
        sys.exit(f"update_perf_section.py: {doc}: {e}; file left as it is")
    mode = os.stat(doc).st_mode & 0o777 if os.path.exists(doc) else 0o644
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(doc)), prefix=".perf.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, doc)


if __name__ == "__main__":
    main(sys.argv[1:])
