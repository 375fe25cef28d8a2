"""What a shell command's words point at: the agent's folders (Env), words as paths, the path rules.

Used by classify.py. A word becomes the strings it may stand for (``word_values``: brace expansion,
``~`` and ``~user``, ``~+``/``~-``, $HOME/$PWD, assigned variables; exactly, or as guesses for the hard
line), a string becomes the paths it names (pattern expansion within a budget, symbolic links followed
the way the kernel would from the command's working folder, ``/proc/self/cwd`` read as that folder),
and ``check_words`` applies the path rules: inside Starling's data folder or another agent's private
folder is refused; another process's /proc entries are refused; /proc/self, /dev/fd, /dev/std*, bash's
/dev/tcp and /dev/udp, devices, the agents' folder, Starling's own files, the runner's own home, and
recursive reads through a folder holding data/, agents/ or other agents' folders ask.
"""

from __future__ import annotations

import itertools
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from common.personas import SCRATCHPAD
from services.runner.tools.base import ToolContext
from services.runner.tools.confine import private_dir
from services.runner.tools.shell_lex import SUB, TooMany, Word, expand_braces

READ, SCRATCH, ASK, REFUSE = "read", "scratchpad", "ask", "refuse"
RANK = {READ: 0, SCRATCH: 1, ASK: 2, REFUSE: 3}
MAX_GLOB = 256
MAX_VALUES = 64  # strings one word may stand for before the rest are dropped (guesses) or unknown (exact)
GLOB_BUDGET = 5000  # directory entries pattern expansion and link walks may look at in one check
MAX_HOPS = 40  # symbolic links followed in one path, as the kernel does
PROC_PID = re.compile(r"^/proc/(\d+)(/|$)")
FREE_SINK = "/dev/null"  # the one place a redirection may write without asking
HARMLESS_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/1", "/dev/fd/2",
                              "/dev/zero"})  # written to, they ask; other devices are refused
READABLE_DEVICES = frozenset({"/dev", "/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full",
                              "/dev/tty"})  # reading any other device (a disk, /dev/shm) asks
NETWORK_DEVICES = ("/dev/tcp", "/dev/udp")
DESCRIPTOR_PATHS = ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
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
    starling: Path = Path("/nonexistent")  # Starling's home folder (config, data/, agents/, workspace/)
    user_home: Path | None = None  # the runner's own home folder (~/.ssh, ~/.aws …): reads there ask
    cwds: list[Path] = field(default_factory=list)  # where the command may be now (real paths)
    seen: list[Path] = field(default_factory=list)  # every folder it may have been in ($OLDPWD, ~-)
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
               starling=real(paths.home),
               user_home=None if user_home == Path("/") else user_home,
               data_text=tuple({str(paths.data_dir.absolute()), str(data)}), agents=real(paths.agents_dir),
               private_root=real(paths.private_root), protected=tuple(protected), cwds=[home], seen=[home])


def inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


# ---------------------------------------------------------------- words as strings


GUESS = "0"  # stands for what a check cannot know (a variable, a substitution's output): looks like a pid
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_VAR = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*|[?$!#@*\-0-9])")


def tilde_prefixes(word: Word) -> list[tuple[int, int]]:
    """(start, end) of each tilde prefix bash expands: the word's start, and in NAME=… words the value's
    start and each part after an unquoted ``:``. A prefix runs to the next unquoted / (or :) and is only
    expanded when none of it is quoted or computed."""
    t, m = word.text, word.mask
    starts = [0] if word.tilde else []
    assignment = _ASSIGNMENT.match(t)
    if assignment and "q" not in m[: assignment.end()] and "x" not in m[: assignment.end()]:
        starts += [i for i in range(assignment.end(), len(t))
                   if t[i] == "~" and m[i] == "u" and (i == assignment.end() or (t[i - 1] == ":" and m[i - 1] == "u"))]
    spans = []
    for start in starts:
        end = start + 1
        while end < len(t) and not (m[end] == "u" and (t[end] == "/" or (assignment and t[end] == ":"))):
            end += 1
        if set(m[start:end]) == {"u"}:
            spans.append((start, end))
    return spans


def tilde_values(prefix: str, env: Env, guess: bool) -> list[str] | None:
    """What ``~prefix`` becomes: ~ the home; ~user from the user database; ~+ $PWD; ~- $OLDPWD; ~N the
    directory stack. None when it cannot be known exactly (unless guessing)."""
    if prefix == "":
        return [str(env.home)]
    if prefix in ("+", "+0", "-0", "0"):
        if len(env.cwds) == 1 and not env.lost:
            return [str(env.cwds[0])]
        return [str(c) for c in env.cwds] if guess else None
    if prefix == "-" or re.fullmatch(r"[+-]?\d+", prefix):
        return [str(c) for c in env.seen] + ["~" + prefix] if guess else None  # unset: the word stays as it is
    expanded = os.path.expanduser("~" + prefix)
    return [expanded]  # an unknown user: the word stays as it is, as bash leaves it


def odd_tilde(word: Word) -> str | None:
    """The first tilde prefix that is not ~ or ~user (~+, ~-, ~2 …): bash reads it from the shell's state."""
    for start, end in tilde_prefixes(word):
        prefix = word.text[start + 1 : end]
        if prefix and (prefix[0] in "+-" or prefix.isdigit()):
            return "~" + prefix
    return None


def word_values(word: Word, env: Env, *, guess: bool = False, fill: str = GUESS) -> list[str] | None:
    """The strings a word stands for after brace, tilde and parameter expansion (before pattern expansion);
    None if not exactly knowable. Exactly known: literals, ~ and ~user, $HOME, and $PWD and ~+ while the
    working folder is known. With ``guess``, everything else becomes its possible values (an assigned
    variable's value, every folder the command may be in) and ``fill`` (an unknown variable or a
    substitution's output), so that the rest of the path is still checked: ``/proc/$$/../1/environ``
    is /proc/1/environ whatever $$ is."""
    try:
        alternatives = expand_braces(word)
    except TooMany:
        return None
    out: list[str] = []
    for alt in alternatives:
        values = _values(alt, env, guess, fill)
        if values is None:
            return None
        out += values
    return out[:MAX_VALUES] if guess else (out if len(out) <= MAX_VALUES else None)


def _values(word: Word, env: Env, guess: bool, fill: str) -> list[str] | None:
    if (word.unknown or word.ansi) and not guess:
        return None
    t, m = word.text, word.mask
    spans = dict(tilde_prefixes(word))
    parts: list[list[str]] = []
    i = 0
    while i < len(t):
        if i in spans:
            values = tilde_values(t[i + 1 : spans[i]], env, guess)
            if values is None:
                return None
            parts.append(values)
            i = spans[i]
            continue
        if m[i] not in "xo":
            j = i
            while j < len(t) and m[j] not in "xo" and j not in spans:
                j += 1
            parts.append([t[i:j]])
            i = j
            continue
        var = _VAR.match(t, i) if t[i] == "$" else None
        if var is None or m[i + 1 : i + 2] == "o":  # a substitution, ${…} with operators, $[…]
            if not guess:
                return None
            parts.append([fill])
            i += 2 if m[i + 1 : i + 2] == "o" else 1
            continue
        values = _var_values(var.group(1).strip("{}"), env, guess, fill)
        if values is None:
            return None
        parts.append(values)
        i = var.end()
    out = []
    for combo in itertools.islice(itertools.product(*parts), MAX_VALUES + 1):
        out.append("".join(combo))
    if len(out) > MAX_VALUES and not guess:
        return None
    return out[:MAX_VALUES] or [""]


def _var_values(name: str, env: Env, guess: bool, fill: str) -> list[str] | None:
    if name == "HOME":
        return [str(env.home)]
    if name == "PWD" and len(env.cwds) == 1 and not env.lost:
        return [str(env.cwds[0])]
    if not guess:
        return None  # an assignment earlier on the line may not have run: not exact
    if name == "PWD":
        return [str(c) for c in env.cwds]
    if name == "OLDPWD":
        return [str(c) for c in env.seen] + [fill]
    if name in env.assigned:
        return [env.assigned[name], fill]
    return [fill]


# ---------------------------------------------------------------- strings as paths


KEY = re.compile(r"^-{0,2}[A-Za-z_][\w.-]*\+?$")


def path_forms(value: str) -> list[str]:
    """The paths a word may name: all of it; what follows KEY= in --file=PATH, if=PATH, VAR=PATH; and
    for an option cluster (-f./x), what follows each of its letters."""
    forms = [value]
    key, sep, rest = value.partition("=")
    if sep and KEY.match(key):
        forms = [rest] if rest else []
    if value.startswith("-") and not value.startswith("--"):
        forms += [value[k:] for k in range(2, min(len(value), 64)) if "/" in value[k:] or value[k:] in (".", "..")]
    return forms + [f[1:] for f in forms if f.startswith("@")]  # curl -d @file, strings @file


def pattern_regex(part: str) -> re.Pattern[str]:
    """A bash pattern as a regex that matches at least what bash would ([…] matches any character)."""
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[" and "]" in part[i + 2 :]:
            out.append(".")
            i = part.index("]", i + 2)
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.S)


def _magic(part: str) -> bool:
    return "*" in part or "?" in part or ("[" in part and "]" in part[part.index("[") + 1 :])


def expand_glob(pattern: Path, env: Env) -> list[Path]:
    """What bash's pathname expansion may give for an absolute pattern (a superset), looking at no more than
    GLOB_BUDGET directory entries in one check (it must stay fast: `/*/*/*/x` would walk the whole disk)."""
    found = [Path(pattern.anchor)]
    for part in pattern.parts[1:]:
        if not _magic(part):
            found = [f / part for f in found]
            continue
        regex = pattern_regex(part)
        matched = []
        for folder in found:
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        env.budget -= 1
                        if env.budget < 0:
                            raise TooMany()
                        if (not entry.name.startswith(".") or part.startswith(".")) and regex.fullmatch(entry.name):
                            matched.append(folder / entry.name)
            except OSError:
                continue
        found = matched
    return [f for f in found if os.path.lexists(f)][:MAX_GLOB]


def expand(value: str, cwd: Path, globbed: bool, env: Env) -> list[Path]:
    absolute = Path(value) if value.startswith("/") else cwd / value
    paths = [absolute]
    if globbed and _magic(value):
        paths += expand_glob(absolute, env)
    return paths


def resolve(path: Path, cwd: Path) -> tuple[Path, bool]:
    """Where the kernel would land for ``path`` (absolute), following symbolic links and .. as it goes;
    and whether it went through /proc/self (or /proc/thread-self, /dev/fd …), read as the *command's*
    process: its cwd is ``cwd``, its root is /, anything else there is not known (the path stops)."""
    todo = list(path.parts[1:])
    out, through_self, hops = Path("/"), False, MAX_HOPS
    if path.parts[: len(cwd.parts)] == cwd.parts:  # the working folder is resolved already
        out, todo = cwd, list(path.parts[len(cwd.parts):])
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            out = out.parent
            continue
        if out == Path("/proc") and part in ("self", "thread-self"):  # /proc/<pid> is another process: the runner's
            through_self = True
            while todo[:1] == ["task"] and len(todo) > 1:
                todo = todo[2:]  # /proc/self/task/<tid>/cwd is the same folder
            if todo[:1] == ["cwd"]:
                out, todo = cwd, todo[1:]
                continue
            if todo[:1] == ["root"]:
                out, todo = Path("/"), todo[1:]
                continue
            return out.joinpath(part, *todo), True
        nxt = out / part
        if out == Path("/proc") and part.isdigit():
            return nxt.joinpath(*todo), through_self  # another process: refused as it is, not followed
        try:
            st = os.lstat(nxt)
        except OSError:
            out = nxt
            continue
        if stat.S_ISLNK(st.st_mode) and hops > 0:
            hops -= 1
            try:
                target = Path(os.readlink(nxt))
            except OSError:
                out = nxt
                continue
            if target.is_absolute():
                out = Path("/")
                todo = list(target.parts[1:]) + todo
            else:
                todo = list(target.parts) + todo
            continue
        out = nxt
    return out, through_self


def _squash(text: str) -> str:
    """The path with empty and . components dropped (``//proc/./self`` is /proc/self); .. kept."""
    parts = [p for p in text.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def check_path(path: Path, env: Env, recursive: bool, verdict: Verdict, cwd: Path | None = None) -> None:
    """Apply the path rules (see the module doc) to one path; each path once per command."""
    key = (str(path), recursive)
    if key not in env.checked:
        env.checked.add(key)
        _judge(path, env, recursive, verdict, cwd)


def _judge(path: Path, env: Env, recursive: bool, verdict: Verdict, cwd: Path | None) -> None:
    raw = _squash(str(path))
    if raw.startswith(NETWORK_DEVICES):
        verdict.add(ASK, f"opens a network connection ({raw}, bash's network redirection)")
    resolved, through_self = resolve(path, cwd or env.home)
    lexical = Path(os.path.normpath(path))
    for form in (lexical, resolved):
        text = str(form)
        if text.startswith(("/proc/self", "/proc/thread-self")) or text.startswith(DESCRIPTOR_PATHS):
            through_self = True
    if through_self or raw.startswith(DESCRIPTOR_PATHS):
        verdict.add(ASK, f"names the running process's own details ({raw}), which the check cannot follow")
    for form in (lexical, resolved):
        text = str(form)
        if inside(form, env.data):
            verdict.add(REFUSE, f"touches Starling's data folder ({text})")
        elif env.private_root in form.parents and not inside(form, env.home) and _agent_folder(form, env):
            verdict.add(REFUSE, f"touches another agent's private folder ({text})")
        elif PROC_PID.match(text):
            verdict.add(REFUSE, f"reads another process's details ({text}), which may hold secrets")
        elif inside(form, env.agents):
            verdict.add(ASK, f"reads the agents' persona folder ({text})")
        elif env.user_home is not None and inside(form, env.user_home) and not inside(form, env.workspace):
            verdict.add(ASK, f"reads the runner's home folder ({text}), which may hold keys and tokens")
        elif inside(form, env.starling) and not inside(form, env.workspace):
            verdict.add(ASK, f"reads Starling's own files ({text})")
        elif inside(form, Path("/dev")) and text not in READABLE_DEVICES:
            verdict.add(ASK, f"reads a device or shared memory ({text})")
        elif recursive and (form == Path("/") or inside(form, Path("/proc"))):
            verdict.add(REFUSE, f"reads recursively through /proc ({text}), where other processes' secrets live")
        elif recursive and any(inside(p, form) for p in (env.data, env.private_root, env.agents)):
            verdict.add(ASK, f"reads recursively through {text}, which holds Starling's data or other agents' files")


def _agent_folder(path: Path, env: Env) -> bool:
    """Whether a path under private/ is in an agent's folder that exists (a word is not a path just because
    the working folder is private/)."""
    return os.path.lexists(env.private_root / path.relative_to(env.private_root).parts[0])


def check_words(words: list[Word], env: Env, recursive: bool, verdict: Verdict) -> None:
    for word in words:
        values = word_values(word, env, guess=True)
        if values is None:
            verdict.add(ASK, f"the expansion of {word.text!r} makes too many words to check")
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
                        check_path(path, env, recursive, verdict, cwd)


def find_links(start: Path, env: Env, verdict: Verdict) -> None:
    """For readers that follow symbolic links as they recurse (grep -R, diff -r, find -L …): ask when a
    link under ``start`` leads out to where the path rules object, or when there are too many entries."""
    stack = [start]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    env.budget -= 1
                    if env.budget < 0:
                        verdict.add(ASK, f"follows symbolic links through more files under {start} than it can check")
                        return
                    if entry.is_symlink():
                        target, _ = resolve(Path(entry.path), env.home)
                        probe = Verdict()
                        _judge(target, env, True, probe, None)
                        if probe.level != READ:
                            verdict.add(ASK, f"follows a symbolic link to {target} ({entry.path})")
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
        except OSError:
            continue


# ---------------------------------------------------------------- words the check cannot expand, redirections


def inexact(word: Word) -> str | None:
    """Why bash's expansion of a word cannot be known here (None: it can)."""
    if word.ansi:
        return f"uses $'…' quoting ({word.text})"
    if word.unknown or SUB in word.text:
        return "uses values computed when it runs (substitutions, ${…}, $((…)))"
    if word.vars:
        return f"uses variables (${sorted(word.vars)[0]})"
    tilde = odd_tilde(word)
    if tilde:
        return f"uses {tilde}, which bash reads from the shell's state ($PWD, $OLDPWD, the directory stack)"
    return None


def shown(word: Word) -> str:
    """A word as the model wrote it, near enough for a reason text."""
    return word.text.replace(SUB, "$(…)")


def check_redirects(redirects: list[tuple[str, Word | None]], env: Env, verdict: Verdict) -> None:
    """Redirections: reads follow the path rules; writes ask unless to /dev/null, onto devices and system
    folders they are refused; targets bash works out when it runs ask; here-documents ask."""
    for op, target in redirects:
        base = op.lstrip("0123456789")
        if target is None:
            verdict.add(ASK, f"a redirection ({op}) without a target")
            continue
        if base in ("<<", "<<-"):
            # bash expands $(...) and backticks in a here-document's body whatever quotes or # it holds
            verdict.add(ASK, "a here-document (its text is expanded when the command runs)")
            continue
        if base in (">&", "<&") and re.fullmatch(r"\d*-?", target.text) and not target.computed:
            continue  # 2>&1, >&-: a descriptor, not a file
        why = inexact(target) or ("a pattern" if target.glob else None)
        try:
            if why is None and expand_braces(target) != [target]:
                why = "a brace expansion"
        except TooMany:
            why = "a brace expansion"
        if why:
            verdict.add(ASK, f"redirects to a place worked out when it runs ({op} {shown(target)}: {why})")
        check_words([target], env, False, verdict)
        if base in ("<", "<<<"):
            continue
        free = True
        for value in word_values(target, env, guess=True) or [""]:
            for cwd in env.cwds:
                lexical = value if value.startswith("/") else str(cwd / value)
                resolved = resolve(Path(lexical), cwd)[0]
                if lexical == FREE_SINK and str(resolved) == FREE_SINK:
                    continue
                free = False
                if lexical in HARMLESS_DEVICES or lexical.startswith(DESCRIPTOR_PATHS):
                    continue
                if lexical.startswith("/dev/") or str(resolved).startswith("/dev/"):
                    verdict.add(REFUSE, f"writes onto a device ({lexical})")
                elif under_system(resolved):
                    verdict.add(REFUSE, f"writes into a system folder ({resolved})")
        if not free or why:
            verdict.add(ASK, f"writes to a file ({op} {shown(target)})")


# ---------------------------------------------------------------- where writes and deletes land


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
                    out.append(resolve(path, cwd)[0])
                else:
                    out.append(resolve(path.parent, cwd)[0] / path.name)
    return out


def under_system(path: Path) -> bool:
    return str(path) not in HARMLESS_DEVICES and any(inside(path, d) for d in SYSTEM_DIRS)
