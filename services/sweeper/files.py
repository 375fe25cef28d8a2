"""Removing old files without ever leaving the folder meant: no symlink is followed, folders are walked by fd.

Agents control what is inside their ``.scratchpad/`` (a symlink to /home, a folder swapped for a link
halfway through a walk): every folder is opened with O_NOFOLLOW relative to its parent's descriptor and
every entry is removed by name relative to it, so a link is removed as a link and never walked into.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MAX_DEPTH = 32
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Freed:
    """What a removal gave back."""

    files: int = 0
    bytes: int = 0
    folders: int = 0

    def add(self, other: Freed) -> None:
        self.files += other.files
        self.bytes += other.bytes
        self.folders += other.folders


def open_dir(root: Path, *names: str) -> int | None:
    """An fd on ``root/names...``, each step below ``root`` refusing symlinks; None when absent or not a folder."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return None
    for name in names:
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return fd


def prune_tree(root: Path, cutoff: float, stop: threading.Event | None = None, *names: str,
               keep: Callable[[str], bool] | None = None) -> Freed:
    """Remove files (and links) under ``root/names...`` last modified before ``cutoff``, and the folders
    below it that were already untouched since before ``cutoff`` and are empty afterwards. The folder
    itself stays. ``keep(path)`` spares a file by its path."""
    freed = Freed()
    fd = open_dir(root, *names)
    if fd is None:
        return freed
    try:
        _prune(fd, str(root.joinpath(*names)), cutoff, stop, keep, freed, 0)
    finally:
        os.close(fd)
    return freed


def _prune(fd: int, where: str, cutoff: float, stop, keep, freed: Freed, depth: int) -> None:
    try:
        entries = list(os.scandir(fd))
    except OSError:
        return
    for entry in entries:
        if stop is not None and stop.is_set():
            return
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if depth >= MAX_DEPTH:
                continue
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # swapped for a link, or gone: leave it
                continue
            try:
                _prune(child, os.path.join(where, entry.name), cutoff, stop, keep, freed, depth + 1)
                empty = not os.listdir(child)
            except OSError:
                empty = False
            finally:
                os.close(child)
            # judged by its time before this walk: a folder someone just made (to write into) stays
            if empty and st.st_mtime < cutoff:
                try:
                    os.rmdir(entry.name, dir_fd=fd)
                    freed.folders += 1
                except OSError:
                    pass  # someone wrote into it meanwhile
        elif st.st_mtime < cutoff and not (keep is not None and keep(os.path.join(where, entry.name))):
            try:
                os.unlink(entry.name, dir_fd=fd)
            except OSError:
                continue
            freed.files += 1
            freed.bytes += st.st_size


def remove_files(paths: list[str], inside: Path, stop: threading.Event | None = None) -> Freed:
    """Remove each of ``paths`` that is a file (or link) inside the folder ``inside``; others are left alone.
    A folder that held some of them and is empty afterwards goes too."""
    freed = Freed()
    root = os.path.realpath(inside)
    parents: set[str] = set()
    for raw in paths:
        if stop is not None and stop.is_set():
            break
        path = os.path.abspath(raw)
        parent = os.path.realpath(os.path.dirname(path))
        if not parent.startswith(root + os.sep):
            continue  # outside the folder (or the folder itself): not ours to remove
        target = os.path.join(parent, os.path.basename(path))
        try:
            st = os.lstat(target)
            if stat.S_ISDIR(st.st_mode):
                continue
            os.unlink(target)
        except OSError:
            continue
        freed.files += 1
        freed.bytes += st.st_size
        parents.add(parent)
    for parent in parents:  # only the folder that held them (a day's attachments), never further up
        try:
            os.rmdir(parent)
            freed.folders += 1
        except OSError:
            pass  # not empty (or gone)
    return freed


def remove_tree(root: Path, *names: str) -> Freed:
    """Remove the folder ``root/names...`` and everything in it, symlinks removed as links."""
    freed = prune_tree(root, float("inf"), None, *names)
    if not names:
        return freed
    parent = open_dir(root, *names[:-1])
    if parent is None:
        return freed
    try:
        os.rmdir(names[-1], dir_fd=parent)
        freed.folders += 1
    except OSError:
        pass
    finally:
        os.close(parent)
    return freed
