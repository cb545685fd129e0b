#!/usr/bin/env python3
"""Replaces one '## <name>' section of docs/performance.md with fresh results.

usage: update_perf_section.py NAME COMMAND BODY
"""
import datetime
import os
import platform
import re
import sys

name, command, body = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(os.path.dirname(__file__), "..", "docs", "performance.md")
text = open(path).read() if os.path.exists(path) else "# Performance\n"
cpu = "unknown CPU"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass
section = (f"## {name}\n\nCommand: `{command}` — {datetime.date.today()}, {os.cpu_count()} cores "
           f"({cpu}), {platform.system()}.\n\n{body.strip()}\n")
pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
if pattern.search(text):
    text = pattern.sub(lambda _: section + "\n", text)
else:
    text = text.rstrip() + "\n\n" + section
open(path, "w").write(text)
