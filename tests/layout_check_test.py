#!/usr/bin/env python3
"""Checks tests/layout_check.py itself on small made-up trees (outside git, so its walk of the folders is
used): a tree that keeps its table passes, and each rule the build relies on refuses its breach with one
line naming the file.

Usage: tests/layout_check_test.py   (exit 0 when every case holds, 1 with one line per failed case)
"""
import os
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout_check.py")

LAYOUT = """# Layout
| folder | owns | may include |
|---|---|---|
| `base/` | the bottom | (nothing of tern's) |
| `engine/` | the middle | `base/` |
| `app/` | the top | `base/` `engine/` |
| `tests/` | the tests | anything |
"""

GOOD = {
    "docs/LAYOUT.md": LAYOUT,
    "base/error.h": "#pragma once\n",
    "base/CMakeLists.txt": "tern_library(tern_base DEPS Threads::Threads)\n",
    "engine/model.h": '#pragma once\n#include "base/error.h"\n',
    "engine/CMakeLists.txt": "tern_library(tern_engine_core FOLDER engine\n             DEPS tern_base)\n",
    "app/main.cpp": '#include "engine/model.h"\n',
    "tests/helper.h": "#pragma once\n",
    "tests/test_model.cpp": '#include "engine/model.h"\n#include "tests/helper.h"\n',
    # A build tree inside the source tree is not the project's code, whatever it holds.
    "build/CMakeCache.txt": "",
    "build/generated/unit.cpp": '#include "tests/helper.h"\n',
}


def check(files):
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        r = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    cases = [
        ("a tree that keeps its table", {}, 0, "every include direction as documented"),
        ("an include upward", {"base/error.h": '#pragma once\n#include "engine/model.h"\n'}, 1,
         "base/error.h: includes engine/model.h, but docs/LAYOUT.md does not let base/ include engine/"),
        ("a product file that includes the test tree", {"app/main.cpp": '#include "tests/helper.h"\n'}, 1,
         "app/main.cpp: includes tests/helper.h: a product file never includes the test tree"),
        ("a library that links a folder its row may not include",
         {"base/CMakeLists.txt": "tern_library(tern_base DEPS Threads::Threads tern_engine_core)\n"}, 1,
         "base/CMakeLists.txt: library tern_base (base/) links tern_engine_core (engine/), but docs/LAYOUT.md "
         "does not let base/ include engine/"),
        ("a folder with code and no row", {"engine/text/tokenizer.cpp": '#include "base/error.h"\n'}, 1,
         "docs/LAYOUT.md: folder engine/text/ holds code but has no row in the layout tables"),
    ]
    failures = []
    for name, change, want_code, want_line in cases:
        code, out = check({**GOOD, **change})
        if code != want_code or want_line not in out:
            failures.append(f"{name}: exit {code}, expected {want_code} with the line {want_line!r}; got:\n{out}")
    for line in failures:
        print(line)
    print(f"layout_check_test: {len(cases) - len(failures)} of {len(cases)} cases hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
