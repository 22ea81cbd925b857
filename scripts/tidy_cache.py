#!/usr/bin/env python3
"""scripts/check-tidy's memory of clean files: a file clang-tidy found clean is not checked
again while nothing it is made of has changed.

A file's key is a SHA-256 over everything its findings can depend on: clang-tidy's version,
.clang-tidy, the file's compile command (the checkout's own path written as "<root>", so a
clone elsewhere hits too) and the path and bytes of every file its translation unit reads,
system headers included, as clang's preprocessor lists them (`clang++ -M` with the same
flags). Only clean results are kept (an empty file named by the key); a file with findings,
or one whose dependencies cannot be listed, is always checked.

    tidy_cache.py select BUILD KEYS FILE...   prints the files to check; writes "key file"
                                              lines for them to KEYS
    tidy_cache.py mark KEYS                   records those keys as clean (after a clean run)

The cache lives in $KVOFFLOAD_TIDY_CACHE (default ~/.cache/kvoffload/tidy);
KVOFFLOAD_TIDY_CACHE=off checks every file."""

import hashlib
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir():
    d = os.environ.get("KVOFFLOAD_TIDY_CACHE", os.path.expanduser("~/.cache/kvoffload/tidy"))
    return None if d == "off" else d


_digests = {}  # path -> SHA-256 of its bytes (the same headers come in every unit)


def file_digest(path):
    if path not in _digests:
        with open(path, "rb") as f:
            _digests[path] = hashlib.sha256(f.read()).hexdigest()
    return _digests[path]


def dependencies(args, directory):
    """The files the translation unit reads, as clang's preprocessor sees them; None when
    they cannot be listed."""
    cmd = ["clang++"]
    skip = False
    for a in args[1:]:  # the compiler itself is replaced; -o and -c go
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a in ("-c", "-Werror"):
            continue
        cmd.append(a)
    cmd += ["-M", "-MF", "/dev/stdout", "-Wno-unknown-warning-option", "-w"]
    try:
        r = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    words = r.stdout.replace("\\\n", " ").split()
    if not words or not words[0].endswith(":"):
        return None
    return sorted({os.path.normpath(os.path.join(directory, w)) for w in words[1:]})


def key_of(entry, fixed):
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    deps = dependencies(args, entry["directory"])
    if deps is None:
        return None
    h = hashlib.sha256(fixed)
    h.update(json.dumps([a.replace(ROOT, "<root>") for a in args]).encode())
    for d in deps:
        h.update(d.replace(ROOT, "<root>").encode() + b"\0" + file_digest(d).encode() + b"\n")
    return h.hexdigest()


def select(build, keys_path, files):
    cache = cache_dir()
    todo, keys = list(files), []
    if cache:
        with open(os.path.join(build, "compile_commands.json")) as f:
            entries = {os.path.normpath(e["file"]): e for e in json.load(f)}
        version = subprocess.run(["clang-tidy", "--version"], capture_output=True).stdout
        with open(os.path.join(ROOT, ".clang-tidy"), "rb") as f:
            fixed = version + b"\0" + f.read()

        def one(name):
            entry = entries.get(os.path.normpath(os.path.join(ROOT, name)))
            return name, (key_of(entry, fixed) if entry else None)

        todo = []
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for name, key in pool.map(one, files):
                if key and os.path.exists(os.path.join(cache, key)):
                    continue
                todo.append(name)
                if key:
                    keys.append(f"{key} {name}")
    with open(keys_path, "w") as f:
        f.write("".join(k + "\n" for k in keys))
    print("\n".join(todo))


def mark(keys_path):
    cache = cache_dir()
    if not cache:
        return
    os.makedirs(cache, exist_ok=True)
    with open(keys_path) as f:
        for line in f:
            if line.strip():
                open(os.path.join(cache, line.split()[0]), "w").close()


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "select":
        select(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif len(sys.argv) == 3 and sys.argv[1] == "mark":
        mark(sys.argv[2])
    else:
        sys.exit(__doc__)
