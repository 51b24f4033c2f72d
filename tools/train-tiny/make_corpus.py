#!/usr/bin/env python3
"""Gathers a plain-text training corpus from files already on a Debian machine.

Usage: make_corpus.py OUT.txt [MEGABYTES]   (default 6)

Documents, each cut to at most 16 kB, in a fixed shuffled order (seed 0), separated by a blank line:
  - Python's standard library source, /usr/lib/python3*/ (code and docstrings; no test suites)
  - READMEs, NEWS, markdown and text files under /usr/share/doc (gunzipped)
  - the licences under /usr/share/common-licenses
  - man pages under /usr/share/man/man{1,5,7,8}, rendered with `man -P cat` when man is installed
About 40 % code, 35 % docs, 25 % man pages by bytes. Never bench/data/accuracy_text.txt: that
text is held out for the evaluation.
"""
import glob
import gzip
import os
import random
import subprocess
import sys

kMaxDoc = 16 * 1024


def read_text(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read(kMaxDoc * 4)
        else:
            with open(path, "rb") as f:
                data = f.read(kMaxDoc * 4)
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\0" in text:
        return None
    return text[:kMaxDoc]


def python_docs():
    out = []
    for root in sorted(glob.glob("/usr/lib/python3*/")):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames
                                 if d not in ("test", "tests", "idle_test", "__pycache__",
                                              "site-packages", "dist-packages"))
            for name in sorted(filenames):
                if name.endswith(".py"):
                    out.append(os.path.join(dirpath, name))
    return out


def share_docs():
    out = []
    for dirpath, dirnames, filenames in os.walk("/usr/share/doc"):
        dirnames.sort()
        for name in sorted(filenames):
            low = name.lower()
            if low.startswith("copyright") or low.startswith("changelog"):
                continue
            base = low[:-3] if low.endswith(".gz") else low
            if (base.startswith("readme") or base.startswith("news") or base.endswith(".md")
                    or base.endswith(".txt") or base.endswith(".rst")):
                out.append(os.path.join(dirpath, name))
    out += sorted(glob.glob("/usr/share/common-licenses/*"))
    return out


def man_pages(limit):
    pages = []
    for sec in ("1", "5", "7", "8"):
        pages += sorted(glob.glob(f"/usr/share/man/man{sec}/*.gz"))
    random.Random(1).shuffle(pages)
    out = []
    total = 0
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    for p in pages:
        if total >= limit:
            break
        try:
            r = subprocess.run(["man", "-P", "cat", "-l", p], capture_output=True, env=env,
                               timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = r.stdout.decode("utf-8", "replace")
        # Drop backspace overstrikes (bold/underline) if any.
        while "\b" in text:
            i = text.index("\b")
            text = text[: max(i - 1, 0)] + text[i + 1:]
        text = text[:kMaxDoc]
        if len(text) > 500:
            out.append(text)
            total += len(text)
    return out


def main():
    out_path = sys.argv[1]
    target = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 6_000_000
    rng = random.Random(0)
    docs = []
    for paths, share in ((python_docs(), 0.40), (share_docs(), 0.35)):
        rng.shuffle(paths)
        got = 0
        for p in paths:
            if got >= share * target:
                break
            t = read_text(p)
            if t and len(t) > 200:
                docs.append(t)
                got += len(t)
    docs += man_pages(0.25 * target)
    rng.shuffle(docs)
    with open(out_path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(d.strip() + "\n\n")
    print(f"{len(docs)} documents, {sum(len(d) for d in docs)} characters -> {out_path}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
