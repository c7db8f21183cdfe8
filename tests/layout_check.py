#!/usr/bin/env python3
"""Checks that docs/LAYOUT.md is true of the code.

- every folder holding code is a row of the layout tables, and every row's folder exists;
- every #include "..." of a repository file goes to the same folder or to one that its folder's row
  (or the exceptions table, for one file) names under "may include"; no file outside tests/ includes
  one under tests/;
- every folder's library (tern_library in a CMakeLists.txt) links only the libraries of folders its row
  may include;
- the rules the engine's two-backend design rests on: no backend chosen by comparing device-name
  strings, no KV cache size arithmetic in app/ (the backend plans its own memory).

Usage: tests/layout_check.py [REPO_ROOT]   (exit 0 when the layout holds, 1 with one line per breach)
"""
import os
import re
import subprocess
import sys

CODE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".inl", ".py", ".sh", ".cmake")
ANYTHING = "*"


def read_tables(layout_text):
    """Folder -> set of allowed folders (or {ANYTHING}); file -> extra allowed folders."""
    folders, exceptions = {}, {}
    for line in layout_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        if name.endswith("/"):   # folder | owns | may include
            allowed = set(re.findall(r"`([^`]+/)`", cells[2]))
            folders[name] = {ANYTHING} if cells[2].startswith("anything") else allowed
        else:                    # file | may also include | why
            exceptions[name] = set(re.findall(r"`([^`]+/)`", cells[1]))
    return folders, exceptions


BACKENDS = ("engine/cpu/", "engine/cuda/")


def allows(allowed, target_folder):
    """Whether a row's "may include" covers target_folder; "engine/*/" is every engine subfolder
    that is not a backend's."""
    if target_folder in allowed:
        return True
    for pattern in allowed:
        if pattern.endswith("*/"):
            parent = pattern[:-2]
            rest = target_folder[len(parent):]
            if (target_folder.startswith(parent) and rest.count("/") == 1 and rest != "/"
                    and target_folder not in BACKENDS):
                return True
    return False




def tracked_files(root):
    """The repository's files: git's tracked ones and the new ones it does not ignore (so a file is checked
    before its first commit); outside a git checkout (a source archive), every file but hidden folders and
    build trees (folders holding a CMakeCache.txt)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        return sorted({p for p in out.split("\n") if p and os.path.exists(os.path.join(root, p))})
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")
                         and not os.path.exists(os.path.join(folder, d, "CMakeCache.txt"))]
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
    return sorted(files)


def folder_of(path):
    return os.path.dirname(path) + "/"


def library_link_problems(root, files, folders):
    """Each folder's library (a tern_library(NAME [FOLDER f] ... DEPS ...) call of a CMakeLists.txt) links
    only the libraries of folders its row may include, so the build's graph is the table's."""
    call = re.compile(r"tern_library\(\s*(\w+)([^)]*)\)")
    libraries = {}   # name -> (folder, deps, where)
    for p in files:
        if os.path.basename(p) != "CMakeLists.txt":
            continue
        text = open(os.path.join(root, p), encoding="utf-8", errors="replace").read()
        text = "\n".join(line.split("#")[0] for line in text.split("\n"))
        for m in call.finditer(text):
            words = m.group(2).split()
            folder = folder_of(p) if "/" in p else ""
            if "FOLDER" in words:
                folder = words[words.index("FOLDER") + 1].rstrip("/") + "/"
            deps = words[words.index("DEPS") + 1:] if "DEPS" in words else []
            libraries[m.group(1)] = (folder, deps, p)
    problems = []
    for name, (folder, deps, where) in sorted(libraries.items()):
        allowed = folders.get(folder)
        if allowed is None:
            problems.append(f"{where}: library {name} builds {folder}, which has no row in docs/LAYOUT.md")
            continue
        for dep in deps:
            if dep not in libraries or ANYTHING in allowed:
                continue   # a package (Threads::Threads, PkgConfig::PCRE2, ...)
            dep_folder = libraries[dep][0]
            if dep_folder != folder and not allows(allowed, dep_folder):
                problems.append(f"{where}: library {name} ({folder}) links {dep} ({dep_folder}), but docs/LAYOUT.md "
                                f"does not let {folder} include {dep_folder}")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    layout_path = os.path.join(root, "docs", "LAYOUT.md")
    folders, exceptions = read_tables(open(layout_path, encoding="utf-8").read())
    files = tracked_files(root)
    existing = set(files)
    problems = []

    code_folders = set()
    for p in files:
        top = p.split("/")[0]
        if "/" not in p or top.startswith("."):
            continue   # the root's own files (CMakeLists.txt, presets) and hidden folders (.ci)
        if p.endswith(CODE_SUFFIXES) or os.path.basename(p) == "CMakeLists.txt":
            code_folders.add(folder_of(p))
    for f in sorted(code_folders - set(folders)):
        problems.append(f"docs/LAYOUT.md: folder {f} holds code but has no row in the layout tables")
    for f in sorted(folders):
        if not os.path.isdir(os.path.join(root, f)):
            problems.append(f"docs/LAYOUT.md: row {f} names a folder that does not exist")
    for f in sorted(exceptions):
        if f not in existing:
            problems.append(f"docs/LAYOUT.md: exception {f} names a file that does not exist")

    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    for p in files:
        if not p.endswith((".h", ".hpp", ".cpp", ".cu", ".cuh", ".inl")):
            continue
        source_folder = folder_of(p)
        allowed = folders.get(source_folder)
        if allowed is None or ANYTHING in allowed:
            continue
        allowed = allowed | exceptions.get(p, set())
        text = open(os.path.join(root, p), encoding="utf-8", errors="replace").read()
        for target in include.findall(text):
            if target not in existing:
                continue   # a system or generated header
            target_folder = folder_of(target)
            if target.startswith("tests/") and not p.startswith("tests/"):
                problems.append(f"{p}: includes {target}: a product file never includes the test tree")
            elif target_folder != source_folder and not allows(allowed, target_folder):
                problems.append(f"{p}: includes {target}, but docs/LAYOUT.md does not let {source_folder} "
                                f"include {target_folder}")

    problems += library_link_problems(root, files, folders)

    # The device is a kind, not a string: nothing picks a code path by comparing device names.
    device_string = re.compile(r'device_name\(\)\s*[!=]=|[!=]=\s*[\w.>-]*device_name\(\)')
    # KV sizes are the backend's memory plan's business, not the command line's.
    # (Showing a model's head_dim, as `tern info` does, is fine; computing with it is not.)
    kv_arithmetic = re.compile(r"\b(kv_row_bytes|kv_element_bytes|kv_bytes_per_position|bytes_per_position|kv_cache_bytes)\b"
                               r"|\bhead_dim(_v)?\s*[-+*/]|[-+*/]\s*[\w.>-]*\bhead_dim(_v)?\b")
    for p in files:
        if not p.endswith((".h", ".cpp", ".cu")) or p.startswith("tests/"):
            continue
        text = open(os.path.join(root, p), encoding="utf-8", errors="replace").read()
        for n, line in enumerate(text.split("\n"), 1):
            code = line.split("//")[0]
            if device_string.search(code):
                problems.append(f"{p}:{n}: compares a device name string; use DeviceKind")
            if p.startswith("app/") and kv_arithmetic.search(code):
                problems.append(f"{p}:{n}: KV size arithmetic in app/; ask the backend's memory plan")

    for line in problems:
        print(line)
    if problems:
        print(f"layout_check: {len(problems)} problem(s)")
        return 1
    print(f"layout_check: {len(folders)} folders, {len(exceptions)} exception(s), every include direction as documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
