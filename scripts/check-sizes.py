#!/usr/bin/env python3
"""The sizes a newcomer checks in include/: files over --max-file lines (500) and functions over
--max-function lines (60), counted from the line that opens the body to the line that closes it.

Function bodies are found by a brace scan over the code with comments and string literals blanked:
a '{' that follows a parameter list ')' (possibly with const, noexcept, requires-clauses, an
initialiser list or a trailing return type between) opens a function; class, namespace, enum and
control-statement braces do not. Lambdas count as part of the function around them. It is a
heuristic, made for this code base's style (clang-format), not a C++ parser.

  scripts/check-sizes.py [paths...]      default: include/
  --top N                                also list the N longest functions
Exits 1 when something is over a limit.
"""
import argparse
import pathlib
import re
import sys

CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try)\s*(\(|\{|$)")
SCOPE = re.compile(r"\b(class|struct|union|namespace|enum)\b[^;()]*$")


def blank(text: str) -> str:
    """Comments and string/char literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path: pathlib.Path):
    code = blank(path.read_text(encoding="utf-8", errors="replace"))
    stack = []  # (kind, start line, name)
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            head = code[max(0, i - 400):i]
            head = head[max(head.rfind(";"), head.rfind("}"), head.rfind("{")) + 1:]
            flat = " ".join(head.split())
            inside_function = any(k == "fn" for k, _, _ in stack)
            kind = "block"
            if not inside_function and ")" in flat and not CONTROL.search(flat) and not SCOPE.search(flat) and "=" not in flat.split("(")[0]:
                kind = "fn"
            name = flat.split("(")[0].split()[-1] if kind == "fn" and flat.split("(")[0].split() else "?"
            stack.append((kind, line, name))
        elif c == "}" and stack:
            kind, start, name = stack.pop()
            if kind == "fn":
                yield name, start, line - start + 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", default=["include"])
    ap.add_argument("--max-file", type=int, default=500)
    ap.add_argument("--max-function", type=int, default=60)
    ap.add_argument("--top", type=int, default=0)
    a = ap.parse_args()
    files = []
    for p in map(pathlib.Path, a.paths):
        files += sorted(q for q in (p.rglob("*") if p.is_dir() else [p]) if q.suffix in (".hpp", ".cuh", ".h", ".cpp", ".cu"))
    over, found = 0, []
    for f in files:
        lines = f.read_text(encoding="utf-8", errors="replace").count("\n")
        if lines > a.max_file:
            print(f"{f}: {lines} lines (file limit {a.max_file})")
            over += 1
        for name, start, length in functions(f):
            found.append((length, f"{f}:{start}", name))
            if length > a.max_function:
                print(f"{f}:{start}: {name} is {length} lines (function limit {a.max_function})")
                over += 1
    for length, where, name in sorted(found, reverse=True)[: a.top]:
        print(f"{length:5d}  {where}  {name}")
    print(f"{len(files)} files, {len(found)} functions, {over} over a limit")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
