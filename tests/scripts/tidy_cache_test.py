#!/usr/bin/env python3
"""scripts/tidy_cache.py: a file found clean is skipped until anything it is made of changes
(its source, a header it includes, its compile command), and nothing is skipped without a
recorded clean check. Run by ctest (tidy_cache); needs clang++ (as clang-tidy does)."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "tidy_cache.py")


def main():
    failures, cases = [], []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, KVOFFLOAD_TIDY_CACHE=os.path.join(d, "cache"))
        src, hdr = os.path.join(d, "a.cpp"), os.path.join(d, "inc", "a.hpp")
        os.makedirs(os.path.dirname(hdr))
        with open(hdr, "w") as f:
            f.write("inline int f() { return 1; }\n")
        with open(src, "w") as f:
            f.write('#include "a.hpp"\n#include <vector>\nint g() { return f(); }\n')

        def db(flags):
            with open(os.path.join(d, "compile_commands.json"), "w") as f:
                json.dump([{"directory": d, "file": src, "command":
                            f"/usr/bin/c++ -I{d}/inc {flags} -o a.o -c {src}"}], f)

        def selected():
            keys = os.path.join(d, "keys")
            out = subprocess.run([sys.executable, SCRIPT, "select", d, keys, src], env=env,
                                 check=True, capture_output=True, text=True).stdout.split()
            return out, keys

        def expect(what, want):
            cases.append(what)
            got, keys = selected()
            if (src in got) != want:
                failures.append(f"{what}: {'checked' if src in got else 'skipped'}, want "
                                f"{'checked' if want else 'skipped'}")
            return keys

        db("-std=c++20 -Werror")
        keys = expect("never checked", True)
        expect("checked but not marked clean", True)
        subprocess.run([sys.executable, SCRIPT, "mark", keys], env=env, check=True)
        expect("marked clean, nothing changed", False)
        with open(hdr, "a") as f:
            f.write("inline int h() { return 2; }\n")
        keys = expect("an included header changed", True)
        subprocess.run([sys.executable, SCRIPT, "mark", keys], env=env, check=True)
        expect("marked clean again", False)
        with open(src, "a") as f:
            f.write("// a comment\n")
        keys = expect("the source changed", True)
        subprocess.run([sys.executable, SCRIPT, "mark", keys], env=env, check=True)
        db("-std=c++20 -Werror -DEXTRA=1")
        expect("the compile command changed", True)
        env["KVOFFLOAD_TIDY_CACHE"] = "off"
        db("-std=c++20 -Werror")
        expect("the cache off", True)
    for f in failures:
        print("tidy_cache_test: FAILED:", f)
    print(f"tidy_cache_test: {len(cases) - len(failures)} of {len(cases)} cases right")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
