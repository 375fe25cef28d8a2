"""Where file tools may reach: the shared workspace, the agent's private folder, its session's tool output,
and (read-only) the files people sent the agent.

A path as the model writes it (``notes.txt``, ``shared/notes.txt``, ``private/draft.md``,
``tool-output/7-1-shell.txt``, ``attachments/2026-05-01/tg-main-42-7-0-notes.txt``) becomes a ``Target``: a root folder and the components below it,
with every symbolic link already resolved. Refused, with a message for the model: absolute paths,
``..``, NUL bytes, anything whose resolution leaves its root (a symlink to data/, to another agent's
private folder, a symlinked parent of a file not yet created), and anything inside data/, agents/
or another agent's private folder even if a root was configured to contain them.

Opening then walks the resolved components one directory at a time from the root's descriptor with
``O_NOFOLLOW`` (``open_dir``/``open_file``), so a component swapped for a symlink between the check
and the use fails instead of being followed. Residual risks, documented: the root folders themselves
are trusted (operator-owned); a file hard-linked into the workspace from outside is refused on read
and append (``st_nlink > 1``) but a link created later is not watched; the shell tool runs as the
same OS user and is confined by approval classes, not by this module.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from common.home import DIR_MODE, FILE_MODE
from common.personas import SCRATCHPAD
from services.runner.tools.base import Refused, ToolContext

SHARED, PRIVATE, TOOL_OUTPUT, ATTACHMENTS = "shared", "private", "tool-output", "attachments"
PATH_HELP = (
    "Paths are relative: 'notes.txt' or 'shared/notes.txt' is in the shared workspace (every agent's),"
    " 'private/notes.txt' is in your private folder (only yours; your shell runs there),"
    " 'tool-output/<file>' (read-only) holds this conversation's tool results that were too large to show,"
    " 'attachments/<date>/<file>' (read-only) the files people sent you."
)
_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


@dataclass(frozen=True)
class Target:
    root: Path  # the root folder's real path
    parts: tuple[str, ...]  # components below the root, symlinks resolved at check time
    shown: str  # how the model names it (scheme prefix + components)
    writable: bool

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def private_dir(ctx: ToolContext) -> Path:
    """The agent's private workspace, created (with its .scratchpad/) if it is missing."""
    folder = ctx.paths.private_workspace(ctx.agent)
    for sub in (folder, folder / SCRATCHPAD):
        sub.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return folder


def _roots(ctx: ToolContext) -> dict[str, tuple[Path, bool]]:
    return {
        SHARED: (ctx.paths.shared_workspace, True),
        PRIVATE: (private_dir(ctx), True),
        TOOL_OUTPUT: (ctx.paths.tool_output_dir / str(ctx.session_id), False),
        ATTACHMENTS: (ctx.paths.attachments_dir / ctx.agent, False),  # this agent's inbound files only
    }


def forbidden_areas(ctx: ToolContext) -> list[tuple[Path, str]]:
    """Real paths no tool may reach (except a root that lies inside one: tool-output and attachments are in data/)."""
    return [
        (_real(ctx.paths.data_dir), "Starling's data folder"),
        (_real(ctx.paths.agents_dir), "the agents' persona folder (use the memory tools)"),
        (_real(ctx.paths.private_root), "another agent's private folder"),
    ]


def resolve(ctx: ToolContext, raw: str, *, write: bool = False) -> Target:
    """The model's path as a checked Target, or Refused."""
    if not isinstance(raw, str):
        raise Refused("the path must be a string")
    text = raw.strip()
    if "\x00" in text:
        raise Refused("the path contains a NUL character")
    if text.startswith(("/", "~")):
        raise Refused(f"{raw!r}: absolute paths are not allowed. {PATH_HELP}")
    parts = [p for p in PurePosixPath(text).parts if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"{raw!r}: '..' is not allowed in paths. {PATH_HELP}")
    scheme = SHARED
    if parts and parts[0] in (SHARED, PRIVATE, TOOL_OUTPUT, ATTACHMENTS):
        scheme, parts = parts[0], parts[1:]
    root, writable = _roots(ctx)[scheme]
    if write and not writable:
        raise Refused(f"{raw!r}: {scheme}/ is read-only")
    real_root = _real(root)
    real = _real(root.joinpath(*parts))
    if not _inside(real, real_root):
        raise Refused(f"{raw!r} leads outside {scheme}/ (through a symbolic link): not allowed")
    for area, name in forbidden_areas(ctx):
        if _inside(real, area) and not _inside(real_root, area):
            raise Refused(f"{raw!r} is inside {name}: not allowed")
    rel = real.relative_to(real_root).parts
    if write and ".git" in rel:
        raise Refused(f"{raw!r} is inside a .git folder: the file tools do not write there (git config can"
                      " name programs to run); use git through the shell")
    shown = "/".join((scheme, *rel)) if rel else scheme + "/"
    return Target(real_root, tuple(rel), shown, writable)


# ---------------------------------------------------------------- opening without following links


def _refuse_link(target: Target, e: OSError) -> Refused:
    return Refused(f"{target.shown}: a path component became a symbolic link while being opened; not followed")


def open_dir(target: Target, parts: tuple[str, ...] | None = None, *, create: bool = False) -> int:
    """A descriptor of the folder at ``parts`` (default: the whole target) walked with O_NOFOLLOW.

    ``create`` makes missing folders at mode 0700. The caller closes the descriptor.
    """
    parts = target.parts if parts is None else parts
    fd = os.open(target.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    part = ""
    try:
        for part in parts:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as e:
        link = e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_link(part, fd))
        os.close(fd)
        if link:
            raise _refuse_link(target, e) from None
        raise
    return fd


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_file(target: Target, flags: int, mode: int = FILE_MODE) -> int:
    """Open the target's last component with O_NOFOLLOW inside its safely opened parent."""
    if not target.parts:
        raise IsADirectoryError(errno.EISDIR, "is a folder", target.shown)
    dfd = open_dir(target, target.parts[:-1], create=bool(flags & os.O_CREAT))
    try:
        return os.open(target.parts[-1], flags | _FLAGS, mode, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse_link(target, e) from None
        raise
    finally:
        os.close(dfd)


def check_regular(target: Target, fd: int) -> os.stat_result:
    """Refuse anything but a plain file with one link (a hard link could point at a secret)."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", target.shown)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{target.shown} is not a regular file")
    if st.st_nlink > 1:
        raise Refused(f"{target.shown} has {st.st_nlink} hard links; file tools do not touch hard-linked files")
    return st


def open_read(target: Target) -> tuple[int, os.stat_result]:
    fd = open_file(target, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: a FIFO must not hang the runner
    try:
        return fd, check_regular(target, fd)
    except BaseException:
        os.close(fd)
        raise


def write_atomic(target: Target, data: bytes) -> None:
    """Replace the target with ``data`` (a new 0600 file renamed into place; a symlink there is replaced)."""
    if not target.parts:
        raise IsADirectoryError(errno.EISDIR, "is a folder", target.shown)
    dfd = open_dir(target, target.parts[:-1], create=True)
    name = target.parts[-1]
    tmp = f".{name[:40]}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, FILE_MODE, dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)


def append(target: Target, data: bytes) -> int:
    """Append to the target (created at 0600 if missing); returns the file's new size."""
    fd = open_file(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK)
    try:
        check_regular(target, fd)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return os.fstat(fd).st_size
    finally:
        os.close(fd)
