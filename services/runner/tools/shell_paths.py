"""What a shell command's words point at: the agent's folders (Env), words as paths, the path rules.

Used by classify.py. A word becomes the paths it may name (``values``: $HOME, ~, assigned variables,
brace and pathname expansion within a budget), and ``check_words`` applies the path rules: inside
Starling's data folder or another agent's private folder is refused; another process's /proc entries
are refused; the agents' folder, the runner's own home and recursive reads through a folder holding
those ask. Both the lexical path and its resolution (symlinks followed) are checked.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from common.personas import SCRATCHPAD
from services.runner.tools.base import ToolContext
from services.runner.tools.confine import private_dir
from services.runner.tools.shell_lex import SUB, Word, expand_braces

READ, SCRATCH, ASK, REFUSE = "read", "scratchpad", "ask", "refuse"
RANK = {READ: 0, SCRATCH: 1, ASK: 2, REFUSE: 3}
MAX_GLOB = 256
GLOB_BUDGET = 5000  # directory entries pattern expansion may look at in one check
PROC_PID = re.compile(r"^/proc/(\d+|self|thread-self)/")
SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/1", "/dev/fd/2", "/dev/zero"})
SYSTEM_DIRS = tuple(Path(p) for p in ("/etc", "/boot", "/bin", "/sbin", "/usr", "/lib", "/lib32", "/lib64",
                                      "/libx32", "/sys", "/proc", "/dev", "/var/lib", "/root"))
TOP_DIRS = tuple(Path(p) for p in ("/", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/var",
                                   "/home", "/root", "/opt", "/srv", "/dev", "/proc", "/sys", "/tmp", "/mnt",
                                   "/media", "/run"))


# ---------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    level: str = READ
    reason: str = "read-only"
    only_refusals: bool = False  # looking through a wrapper: only the hard line counts

    def add(self, level: str, reason: str) -> None:
        if self.only_refusals and level != REFUSE:
            return
        if RANK[level] > RANK[self.level]:
            self.level, self.reason = level, reason


@dataclass
class Env:
    """What a check needs to know about the agent's folders, and the simulated working folder."""

    home: Path  # the private workspace: cwd and $HOME of the command
    scratch: Path
    data: Path
    data_text: tuple[str, ...]
    agents: Path
    private_root: Path
    protected: tuple[Path, ...]  # rm -r of any of these, or of an ancestor of one, is refused
    workspace: Path = Path("/")
    user_home: Path | None = None  # the runner's own home folder (~/.ssh, ~/.aws …): reads there ask
    cwds: list[Path] = field(default_factory=list)
    moved: bool = False  # a cd happened: relative rm targets are no longer trusted as scratchpad
    lost: bool = False  # a cd to somewhere unknown: relative paths cannot be checked
    assigned: dict[str, str] = field(default_factory=dict)
    budget: int = GLOB_BUDGET  # directory entries pattern expansion may still look at
    checked: set[tuple[str, bool]] = field(default_factory=set)  # paths already checked (same verdict)


def real(path: Path | str) -> Path:
    return Path(os.path.realpath(path))


def env_for(ctx: ToolContext) -> Env:
    paths = ctx.paths
    home = real(private_dir(ctx))  # created if missing: paths through it resolve as they will when it runs
    data = real(paths.data_dir)
    protected = {real(p) for p in (paths.home, paths.data_dir, paths.agents_dir, paths.workspace_dir,
                                    paths.shared_workspace, paths.private_root, home)}
    protected |= {real(Path.home()), *TOP_DIRS}
    user_home = real(Path.home())
    return Env(home=home, scratch=home / SCRATCHPAD, data=data, workspace=real(paths.workspace_dir),
               user_home=None if user_home == Path("/") else user_home,
               data_text=tuple({str(paths.data_dir.absolute()), str(data)}), agents=real(paths.agents_dir),
               private_root=real(paths.private_root), protected=tuple(protected), cwds=[home])


def inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


# ---------------------------------------------------------------- words as paths


GUESS = "0"  # stands for what a check cannot know (a variable, a substitution's output): looks like a pid


def word_values(word: Word, env: Env, *, guess: bool = False, fill: str = GUESS) -> list[str] | None:
    """The literal strings a word stands for (brace-expanded, $HOME and ~ replaced); None if unknowable.

    With ``guess``, unknowable parts become GUESS instead, so that the rest of the path is still checked
    (``/proc/$$/../1/environ`` is /proc/1/environ whatever $$ is); ``fill`` is what they become."""
    if (word.unknown or SUB in word.text) and not guess:
        return None
    text = word.text.replace(SUB, fill)
    for name in sorted(word.vars, key=len, reverse=True):
        if name == "HOME":
            value = str(env.home)
        elif name == "PWD" and len(env.cwds) == 1:
            value = str(env.cwds[0])
        elif name in env.assigned:
            value = env.assigned[name]
        elif guess:
            value = fill
        else:
            return None
        text = text.replace("${" + name + "}", value).replace("$" + name, value)
    if word.tilde:
        if text == "~" or text.startswith("~/"):
            text = str(env.home) + text[1:]
        else:
            text = os.path.expanduser(text)  # ~user: bash asks the user database too
            if text.startswith("~"):
                return None
    return expand_braces(text) if word.brace else [text]


KEY = re.compile(r"^-{0,2}[A-Za-z_][\w.-]*\+?$")


def path_forms(value: str) -> list[str]:
    """The path a word may name: all of it, or what follows KEY= in --file=PATH, if=PATH, VAR=PATH."""
    key, sep, rest = value.partition("=")
    if sep and KEY.match(key):
        return [rest] if rest else []
    return [value]


def expand_glob(pattern: Path, env: Env) -> list[Path]:
    """What bash's pathname expansion gives for an absolute pattern, looking at no more than GLOB_BUDGET
    directory entries in one check (it must stay fast: `/*/*/*/x` would walk the whole disk)."""
    found = [Path(pattern.anchor)]
    for part in pattern.parts[1:]:
        if not glob.has_magic(part):
            found = [f / part for f in found]
            continue
        matched = []
        for folder in found:
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        env.budget -= 1
                        if env.budget < 0:
                            raise TooMany()
                        if (not entry.name.startswith(".") or part.startswith(".")) and fnmatch.fnmatchcase(
                                entry.name, part):
                            matched.append(folder / entry.name)
            except OSError:
                continue
        found = matched
    return [f for f in found if os.path.lexists(f)][:MAX_GLOB]


class TooMany(Exception):
    """A pattern matched more than a check may look at."""


def expand(value: str, cwd: Path, globbed: bool, env: Env) -> list[Path]:
    absolute = Path(value) if value.startswith("/") else cwd / value
    paths = [absolute]
    if globbed and glob.has_magic(value):
        paths += expand_glob(absolute, env)
    return paths


def check_path(path: Path, env: Env, recursive: bool, verdict: Verdict) -> None:
    key = (str(path), recursive)
    if key in env.checked:
        return
    env.checked.add(key)
    lexical = Path(os.path.normpath(path))
    for form in (lexical, real(path)):
        text = str(form)
        if inside(form, env.data):
            verdict.add(REFUSE, f"touches Starling's data folder ({text})")
        elif env.private_root in form.parents and not inside(form, env.home):
            verdict.add(REFUSE, f"touches another agent's private folder ({text})")
        elif PROC_PID.match(text + "/") and not text.startswith(("/proc/self", "/proc/thread-self")):
            verdict.add(REFUSE, f"reads another process's details ({text}), which may hold secrets")
        elif inside(form, env.agents):
            verdict.add(ASK, f"reads the agents' persona folder ({text})")
        elif env.user_home is not None and inside(form, env.user_home) and not inside(form, env.workspace):
            verdict.add(ASK, f"reads the runner's home folder ({text}), which may hold keys and tokens")
        elif recursive and (form == Path("/") or inside(form, Path("/proc")) or Path("/proc").is_relative_to(form)):
            verdict.add(REFUSE, f"reads recursively through /proc ({text}), where other processes' secrets live")
        elif recursive and any(form in p.parents or form == p for p in (env.data, env.private_root, env.agents)):
            verdict.add(ASK, f"reads recursively through {text}, which holds Starling's data or other agents' files")


def check_words(words: list[Word], env: Env, recursive: bool, verdict: Verdict) -> None:
    for word in words:
        values = word_values(word, env, guess=True)
        if values is None:
            continue
        for value in values:
            if env.lost and not value.startswith("/"):
                verdict.add(ASK, "uses relative paths after changing to a folder that cannot be known in advance")
            for form in path_forms(value):
                for cwd in env.cwds:
                    try:
                        expanded = expand(form, cwd, word.glob, env)
                    except TooMany:
                        verdict.add(ASK, f"the pattern {form!r} matches too many files to check")
                        expanded = [cwd / form]
                    for path in expanded:
                        check_path(path, env, recursive, verdict)


def resolve_targets(word: Word, env: Env, *, follow_last: bool = False) -> list[Path] | None:
    """Where a target word points (glob-expanded) from every candidate cwd; None if unknowable.

    Without ``follow_last`` the last component is not resolved (rm, ln and mv act on a link itself)."""
    values = word_values(word, env)
    if values is None or env.lost:
        return None
    out = []
    for value in values:
        follow = follow_last or value.endswith(("/", "/.", "/..")) or value in (".", "..")  # a slash follows a link
        for cwd in env.cwds:
            try:
                expanded = expand(value, cwd, word.glob, env)
            except TooMany:
                return None
            for path in expanded:
                if follow or path.name in ("", ".", ".."):
                    out.append(real(path))
                else:
                    out.append(real(path.parent) / path.name)
    return out


def under_system(path: Path) -> bool:
    return str(path) not in SINKS and any(inside(path, d) for d in SYSTEM_DIRS)
