#!/usr/bin/env python3
"""Symbol hygiene of the libraries an OpenSHMEM program links (issue 34).

usage: exported_symbols.py LIBRARY...   (static archives or shared objects)

Lists every exported symbol (`nm -g --defined-only`) and fails on any the
library has no business defining in a user's program:

strong symbols (T D B R G S C i: a duplicate is a link error, or silently
wins over the user's own definition) must be
  - the OpenSHMEM C API: shmem_*, shmemx_*, pshmem_*;
  - a legacy OpenSHMEM name: start_pes, _my_pe, _num_pes, shmalloc, shfree,
    shrealloc, shmemalign, globalexit;
  - a C++ name of coremesh: demangled, its top-level qualifiers (the
    namespaces its qualified names start with, template arguments and
    parameter types included) lie in {coremesh, std, __gnu_cxx, fmt,
    nlohmann} and include coremesh (coremesh::f(std::string), the vtable or
    typeinfo of a coremesh class, a guard variable of a coremesh static).

weak symbols: the OpenSHMEM C API's shmem_* (the profiling interface,
OpenSHMEM 1.5 section 10.1: weak shmem_X over the strong pshmem_X, so a tool
defines shmem_X and calls pshmem_X; scripts/gen_pshmem.py), and (W V u:
template instantiations and inline functions that
every translation unit using the same header emits; the linker merges
them and never reports a duplicate) must be C++ names whose top-level
qualifiers all lie in {coremesh, std, __gnu_cxx, fmt, nlohmann,
sentencepiece}: coremesh's and those of the libraries whose headers
coremesh's code instantiates (libstdc++, fmt, nlohmann json, SentencePiece:
the typeinfo of the SentenceIterator the tokenizer trainer derives from). Plus the compiler's hidden
exception-handling references DW.ref.__gxx_personality_v0 and DW.ref.<a
weak name allowed here>, and the standard library's inline placement
operator new / delete (<new>; an unoptimized build emits them as weak
symbols). A weak C name, or one of any other namespace, fails.
"""
import re
import subprocess
import sys

STRONG_TYPES = set("TDBRGSCi")
WEAK_TYPES = set("WVu")

C_API = re.compile(r"^(shmem_|shmemx_|pshmem_)")
LEGACY = {"start_pes", "_my_pe", "_num_pes", "shmalloc", "shfree", "shrealloc", "shmemalign",
          "globalexit"}
NAMESPACES = {"coremesh", "std", "__gnu_cxx", "fmt", "nlohmann", "sentencepiece"}
# <new>'s inline placement forms: operator new(size_t, void*), delete(void*, void*), and the array ones
PLACEMENT_NEW = {"_ZnwmPv", "_ZnamPv", "_ZdlPvS_", "_ZdaPvS_"}
# An identifier that starts a qualified name: not preceded by a word
# character or "::".
TOP_QUALIFIER = re.compile(r"(?<![\w:])([A-Za-z_]\w*)::")


def qualifiers(plain):
    # "... operator()(long) const::{lambda()#1}": a local entity of a const
    # member function, not a namespace
    return set(TOP_QUALIFIER.findall(plain)) - {"const", "volatile"}


def cxx_ok(mangled, plain, need_coremesh):
    if not mangled.startswith("_Z") or plain == mangled:
        return False
    q = qualifiers(plain)
    return bool(q) and q <= NAMESPACES and (not need_coremesh or "coremesh" in q)


def allowed(kind, name, plain):
    if kind in STRONG_TYPES:
        return bool(C_API.match(name)) or name in LEGACY or cxx_ok(name, plain, True)
    if kind in WEAK_TYPES:
        if name.startswith("DW.ref."):
            rest = name[len("DW.ref."):]
            return rest == "__gxx_personality_v0" or cxx_ok(rest, plain, False)
        return name.startswith("shmem_") or name in PLACEMENT_NEW or cxx_ok(name, plain, False)
    return False  # an unknown kind: look at it


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def main(libraries):
    bad = []
    count = 0
    for lib in libraries:
        out = subprocess.run(["nm", "-g", "--defined-only", lib], check=True,
                             capture_output=True, text=True).stdout
        symbols = []
        for line in out.splitlines():
            fields = line.split()
            if len(fields) >= 3:  # skip "member.o:" headers and blank lines
                symbols.append((fields[-2], fields[-1]))
        plain = demangle([n[len("DW.ref."):] if n.startswith("DW.ref.") else n
                          for _, n in symbols])
        count += len(symbols)
        for (kind, name), p in zip(symbols, plain):
            if not allowed(kind, name, p):
                bad.append(f"{lib}: {kind} {name}" + (f"   ({p})" if p != name else ""))
    if bad:
        print(f"{len(bad)} exported symbol(s) outside the allowed names "
              "(see tests/shmem/exported_symbols.py):")
        for line in bad:
            print(f"  {line}")
        return 1
    print(f"{count} exported symbols in {len(libraries)} libraries, all allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
