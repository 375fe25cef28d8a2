"""file_search's worker: walks a folder without following links and matches file contents, bounded.

Runs as a child process (``python -I -S search.py``, a JSON request on stdin, a JSON answer on stdout)
so that a pathological regular expression is killed with its process instead of freezing the
runner's event loop (Python's ``re`` holds the GIL and cannot be interrupted). Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys

MAX_FILE_BYTES = 4 * 1024 * 1024  # larger files are skipped
MAX_FILES = 5000
MAX_LINE_SHOWN = 300
MAX_LINE_MATCHED = 4000  # longer lines are matched on their first part only
SNIFF = 8192
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _matcher(pattern: str, regex: bool, ignore_case: bool):
    if regex:
        compiled = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        return lambda line: compiled.search(line) is not None
    if ignore_case:
        needle = pattern.casefold()
        return lambda line: needle in line.casefold()
    return lambda line: pattern in line


def _scan_file(name: str, dir_fd: int, shown: str, match, out: list[str], limit: int) -> bool:
    """Append matches of one file to ``out``; True when the file was read."""
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or st.st_size > MAX_FILE_BYTES:
            return False
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if b"\x00" in data[:SNIFF]:
        return False
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if match(line[:MAX_LINE_MATCHED]):
            text = line.strip()
            if len(text) > MAX_LINE_SHOWN:
                text = text[:MAX_LINE_SHOWN] + "…"
            out.append(f"{shown}:{number}: {text}")
            if len(out) >= limit:
                break
    return True


def search(req: dict) -> dict:
    """req: root, parts (components below it), shown (display prefix), pattern, regex, ignore_case,
    max_results, exclude (relative paths of folders to skip)."""
    match = _matcher(req["pattern"], bool(req.get("regex")), bool(req.get("ignore_case")))
    limit = int(req.get("max_results", 100))
    exclude = {tuple(p) for p in req.get("exclude", [])}
    parts = list(req["parts"])
    out: list[str] = []
    scanned = 0
    fd = os.open(req["root"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1] if parts else []:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        if parts:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                scanned += _scan_file(parts[-1], fd, req["shown"], match, out, limit)
                return {"matches": out, "scanned": scanned, "truncated": len(out) >= limit}
            nfd = os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            rel = tuple(p for p in dirpath.split("/") if p not in ("", "."))
            dirnames[:] = sorted(d for d in dirnames if tuple(parts) + rel + (d,) not in exclude)
            for name in sorted(filenames):
                shown = "/".join((req["shown"].rstrip("/"), *rel, name))
                scanned += _scan_file(name, dirfd, shown, match, out, limit)
                if len(out) >= limit or scanned >= MAX_FILES:
                    return {"matches": out, "scanned": scanned, "truncated": True}
    finally:
        os.close(fd)
    return {"matches": out, "scanned": scanned, "truncated": False}


def main() -> int:
    req = json.loads(sys.stdin.read())
    try:
        answer = search(req)
    except re.error as e:
        answer = {"error": f"invalid regular expression: {e}"}
    except OSError as e:
        answer = {"error": f"{e.strerror or e}"}
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
