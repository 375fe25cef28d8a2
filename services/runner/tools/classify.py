"""Approval classes of shell commands: the courtesy layer that asks before destructive work in the workspace.

This is not what confines a command: the kernel sandbox does (services/runner/sandbox/), so that a
command misjudged here still cannot see or change what is not the agent's. This layer decides what
runs without asking, what waits for a person's approval, and what never runs at all.

``classify(command, ctx)`` → (class, reason), class one of:

- ``read``: every command in it is read-only in the form used (shell_options.py lists, per command,
  the options that only read; anything else asks), reads nothing the path rules object to, and
  redirects output nowhere but /dev/null;
- ``scratchpad``: as read, plus ``rm`` whose targets all resolve inside the agent's own
  ``.scratchpad/`` (the one free delete);
- ``ask``: anything else (writes, deletes, network, installs, interpreters, unknown programs,
  control structures): runs once approved;
- ``refuse``: the hard line, never run even when approved: rm (and find -delete) of /, ~, *, a home or
  workspace root, a system folder, Starling's data and own files, the agents' folder or another agent's
  folder, or of a path the check cannot work out;
  mkfs and friends; dd/redirections onto devices; writes into /etc and other system folders;
  shutdown/reboot/halt/poweroff; fork bombs; sudo/su/doas; a download piped or substituted into a
  shell; kill -1; reading another process's /proc entries; any path inside Starling's data folder or
  another agent's private folder; a program whose name is computed when the command runs.

It fails closed. A word the check cannot expand exactly as bash would asks: parameter expansion,
command, process and arithmetic substitution, $'…', brace expansion ({a,b}, {a..z}), tilde forms
other than ~ and ~user (~+, ~-, ~2), and pattern characters in a read-only command wherever bash could
turn them into an option (-e[x]ec, a file named -exec matched by *); so do paths through /proc/self,
/dev/fd and bash's /dev/tcp. The hard line is judged on what bash would run, every brace expansion
and every program a pattern could name, and refuses when unsure.

The command line is split on ; && || | & newlines, ( ), $( ), backticks and <( ) (shell_lex.py);
each part is classed and the strictest wins. Wrappers (xargs, timeout, env, nohup, watch 'cmd', …),
find -exec, ``bash -c``/``eval``, and literal text echoed or here-stringed into a shell are looked
through for the hard line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from services.runner.tools.base import ToolContext
from services.runner.tools.shell_lex import (
    ParseError, Segment, TooMany, Word, expand_braces, glob_index, lex, segments,
)
from services.runner.tools.shell_options import READ_ONLY, git, judge
from services.runner.tools.shell_paths import (
    ASK, HARMLESS_DEVICES, RANK, READ, REFUSE, SCRATCH, Env, Verdict, check_redirects, check_words, env_for, expand,
    find_links, inexact, inside, pattern_regex, resolve, resolve_targets, shown, under_system, word_values,
)

__all__ = ["classify", "READ", "SCRATCH", "ASK", "REFUSE", "RANK"]

MAX_COMMAND = 16 * 1024
MAX_DEPTH = 6
MAX_UNWRAP = 8

RESERVED = frozenset({"{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for",
                      "case", "esac", "select", "function", "time", "coproc", "in", "[[", "]]"})
STRUCTURE = RESERVED - {"time"}
WRAPPERS = frozenset({"nohup", "nice", "ionice", "timeout", "stdbuf", "env", "command", "builtin", "exec",
                      "xargs", "setsid", "watch", "strace", "ltrace", "chrt", "taskset", "unbuffer", "flock",
                      "parallel", "busybox", "chroot", "runuser", "script", "faketime", "proxychains", "torsocks"})
AS_ROOT = frozenset({"sudo", "su", "doas", "pkexec", "run0", "sudoedit", "sg", "newgrp"})
POWER = frozenset({"shutdown", "reboot", "halt", "poweroff"})
DISK = frozenset({"mke2fs", "mkswap", "wipefs", "fdisk", "sfdisk", "parted", "gdisk", "sgdisk", "cfdisk",
                  "blkdiscard", "badblocks"})
MKFS = frozenset({"mkfs", "mkfs.ext2", "mkfs.ext3", "mkfs.ext4", "mkfs.xfs", "mkfs.btrfs", "mkfs.vfat", "mkfs.fat",
                  "mkfs.msdos", "mkfs.minix", "mkfs.cramfs", "mkfs.bfs", "mkfs.exfat", "mkfs.ntfs", "mkfs.f2fs"})
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish", "csh", "tcsh", "ash", "busybox"})
INTERPRETERS = SHELLS | frozenset({"python", "python2", "python3", "node", "nodejs", "ruby", "perl", "php",
                                   "deno", "bun", "lua", "tclsh", "pwsh", "Rscript", "osascript"})
DOWNLOADERS = frozenset({"curl", "wget", "fetch", "aria2c", "http", "https", "lwp-request", "GET"})
_INTERPRETER_VERSION = re.compile(r"^(python|pypy|ruby|perl|php|node|lua)[\d.]*$")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")
# a name starts at a boundary (the lookbehind keeps the search linear on a long word)
_FORK_BOMB = re.compile(r"(?<![^\s;&|(){}])([^\s(){}|&;]+)\s*\(\s*\)\s*\{[^}]*\1\s*\|\s*\1")
_DOWNLOAD_WORD = re.compile(r"\b(" + "|".join(sorted(DOWNLOADERS - {"GET"})) + r")\b")
RM_LITERALS = frozenset({"/", "/*", "~", "~/", "~/*", "*", ".", "./", "..", "../", "./*", "../*", ".*", "$HOME",
                         "${HOME}", "$HOME/", "$HOME/*", "${HOME}/*"})
_DEST_LAST = frozenset({"cp", "mv", "ln", "install", "rsync", "scp"})
_DEST_ALL = frozenset({"tee", "touch", "mkdir", "rmdir", "truncate", "shred", "chmod", "chown", "chgrp", "unlink",
                       "mkfifo", "mknod", "sed", "patch", "split", "sponge"})
_DELETERS = frozenset({"rmdir", "unlink", "shred"})
_CATEGORIES = (
    ("deletes files", {"rm", "rmdir", "unlink", "shred", "truncate", "srm"}),
    ("changes files", {"mv", "cp", "mkdir", "touch", "chmod", "chown", "chgrp", "ln", "install", "tee", "dd",
                       "sed", "patch", "tar", "unzip", "zip", "gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz",
                       "zstd", "split", "csplit", "mkfifo", "mknod", "rename", "mktemp", "sponge", "awk", "gawk"}),
    ("uses the network", {"curl", "wget", "ssh", "scp", "sftp", "rsync", "nc", "ncat", "netcat", "telnet", "ftp",
                          "socat", "ping", "dig", "nslookup", "host", "aria2c", "http", "https", "whois"}),
    ("installs software", {"pip", "pip3", "npm", "npx", "yarn", "pnpm", "apt", "apt-get", "dpkg", "brew", "gem",
                           "cargo", "go", "dnf", "yum", "apk", "pacman", "snap", "uv", "uvx", "pipx", "poetry",
                           "conda", "mamba", "flatpak", "rpm"}),
    ("runs a program or script", INTERPRETERS | {"make", "cmake", "java", "javac", "gcc", "cc", "clang", "docker",
                                                 "podman", "kubectl", "source", ".", "eval"}),
    ("stops processes", {"kill", "pkill", "killall", "systemctl", "service"}),
)
# every program some hard-line rule is about: a pattern or brace form that could name one is judged as it
HARD_NAMES = (AS_ROOT | POWER | DISK | MKFS | INTERPRETERS | DOWNLOADERS | WRAPPERS | _DEST_LAST | _DEST_ALL
              | {"rm", "kill", "dd", "init", "telinit", "systemctl", "eval", "source", ".", "find"})


# ---------------------------------------------------------------- commands


def _split_options(args: list[Word]) -> tuple[list[str], list[Word]]:
    options, operands, done = [], [], False
    for w in args:
        if not done and w.text == "--" and not w.quoted:
            done = True
        elif not done and w.text.startswith("-") and len(w.text) > 1 and not w.unknown:
            options.append(w.text)
        else:
            operands.append(w)
    return options, operands


def _has_short(options: list[str], letters: str) -> bool:
    return any(o.startswith("-") and not o.startswith("--") and any(c in o[1:] for c in letters) for o in options)


def _long_given(options: list[str], name: str) -> bool:
    """--name, or a GNU abbreviation of it (--rec for --recursive)."""
    return any(o.startswith("--") and len(o) > 2 and name.startswith(o[2:].split("=")[0]) for o in options)


def _category(name: str) -> str:
    for reason, names in _CATEGORIES:
        if name in names:
            return f"`{name}` {reason}"
    if _INTERPRETER_VERSION.match(name):
        return f"`{name}` runs a program or script"
    return f"`{name}` is not on the read-only list"


def _could_be_option(word: Word) -> bool:
    """A pattern whose expansion bash could start with '-' (*.txt can match a file named -exec.txt)."""
    i = glob_index(word)
    return i >= 0 and (i == 0 or word.text.startswith("-"))


def _rm(args: list[Word], env: Env, verdict: Verdict, *, via_path: bool, name: str = "rm") -> None:
    options, targets = _split_options(args)
    recursive = name == "rm" and (_has_short(options, "rR") or _long_given(options, "recursive"))
    if _long_given(options, "no-preserve-root"):
        verdict.add(REFUSE, f"{name} --no-preserve-root")
    scratch_ok = name == "rm" and bool(targets) and not env.moved and not via_path
    allowed = {"-f", "-r", "-R", "-d", "-v", "--force", "--recursive", "--dir", "--verbose"}
    if any(o not in allowed and not (o.startswith("-") and not o.startswith("--") and set(o[1:]) <= set("frRdv"))
           for o in options):
        scratch_ok = False
    for target in targets:
        raw = target.text
        if recursive and (raw in RM_LITERALS or (raw.rstrip("/") in ("~", "") and target.tilde)):
            verdict.add(REFUSE, f"rm -r {raw}")
        for value in word_values(target, env, guess=True, fill="") or []:
            if recursive and (value in RM_LITERALS or value.rstrip("/") == "" or Path(value) in env.protected):
                verdict.add(REFUSE, f"rm -r {raw} (if {raw} expands to {value!r})")
        if word_values(target, env) is None or env.lost:
            verdict.add(REFUSE, f"{name} of {raw}, a path worked out only when it runs: the check cannot prove it"
                                " stays out of Starling's data, the homes and other agents' folders")
            scratch_ok = False
            continue
        if _could_be_option(target):
            scratch_ok = False
        resolved = resolve_targets(target, env)
        if resolved is None:  # a pattern matching more than can be checked
            scratch_ok = False
            continue
        for path in resolved:
            why = _never_deleted(path, env, recursive)
            if why:
                verdict.add(REFUSE, f"{name} {'-r ' if recursive else ''}of {path}, {why}")
            if ".." in Path(raw).parts or not (env.scratch in path.parents):
                scratch_ok = False
    if scratch_ok:
        verdict.add(SCRATCH, "deletes files in the scratchpad")
    else:
        verdict.add(ASK, f"`{name}` deletes files")


def _never_deleted(path: Path, env: Env, recursive: bool) -> str | None:
    """Why deleting ``path`` (and, when recursive, all below it) crosses the hard line; None if it does not."""
    if recursive and any(inside(p, path) for p in env.protected):
        return "a home, workspace or system folder"
    if under_system(path):
        return "in a system folder"
    if inside(path, env.agents):
        return "in the agents' persona folder"
    if inside(path, env.starling) and not inside(path, env.workspace):
        return "one of Starling's own files"
    return None


def _destinations(name: str, args: list[Word], env: Env, verdict: Verdict) -> None:
    """Refuse writers whose destination is a system folder; chmod/chown -R of a protected tree."""
    options, operands = _split_options(args)
    dests: list[Word] = []
    if name in _DEST_LAST and operands:
        dests.append(operands[-1])
        for i, w in enumerate(args):
            if w.text in ("-t", "--target-directory") and i + 1 < len(args):
                dests.append(args[i + 1])
            elif w.text.startswith("--target-directory="):
                dests.append(w.tail(len("--target-directory=")))
    elif name in _DEST_ALL:
        dests = operands
    elif name == "dd":
        dests = [w.tail(3) for w in args if w.text.startswith("of=")]
    for word in dests:
        for path in resolve_targets(word, env, follow_last=True) or []:
            if name == "dd" and str(path).startswith("/dev/") and str(path) not in HARMLESS_DEVICES:
                verdict.add(REFUSE, f"dd onto a device ({path})")
            elif under_system(path):
                verdict.add(REFUSE, f"writes into a system folder ({path})")
    if name in ("chmod", "chown", "chgrp"):
        recursive = _has_short(options, "R") or _long_given(options, "recursive")
        for word in operands:
            for path in resolve_targets(word, env, follow_last=True) or []:
                if path == Path("/") or (recursive and any(path == p or path in p.parents for p in env.protected)):
                    verdict.add(REFUSE, f"{name} of {path}, a home, workspace or system folder")


def _read_only(name: str, args: list[Word], env: Env, verdict: Verdict, depth: int) -> None:
    """A command on the read-only list: its options (shell_options.judge), patterns, recursion, find -exec."""
    j = git(args) if name == "git" else judge(name, args)
    for problem in j.problems:
        verdict.add(ASK, f"`{name}`: {problem}")
    for inner in j.inner:
        _refusals(inner, env, depth + 1, verdict)
    if name not in ("echo", "true", "false"):
        for i, w in enumerate(args):
            if (not j.getopt or j.options_end < 0 or i < j.options_end) and _could_be_option(w):
                verdict.add(ASK, f"the pattern {w.text!r} could expand to an option-like file name (-exec);"
                                 " quote it, or start it with ./")
            elif w.glob and name in ("uniq", "xxd", "date", "hostname"):
                verdict.add(ASK, f"the pattern {w.text!r} could add operands: `{name}` writes or sets extra ones")
    check_words(j.paths, env, False, verdict)
    if not (j.recursive or j.deletes):
        return
    starts = j.starts or [Word.plain(".")]
    check_words(starts, env, True, verdict)
    for start in starts:
        targets = resolve_targets(start, env, follow_last=True)
        if targets is None and j.deletes:
            verdict.add(REFUSE, f"find -delete from {start.text}, worked out only when it runs: the check cannot"
                                " prove it stays out of Starling's data, the homes and other agents' folders")
        for path in targets or []:
            why = _never_deleted(path, env, True) if j.deletes and path != env.home else None
            if why:
                verdict.add(REFUSE, f"find deletes under {path}, {why}")
            if j.follows:
                find_links(path, env, verdict)


def _refusals(words: list[Word], env: Env, depth: int, verdict: Verdict) -> None:
    """Look through a wrapper (xargs, timeout, find -exec …) at the command it runs: only its refusals count."""
    probe = Verdict(only_refusals=True)
    _command(words, env, probe, depth)
    verdict.add(probe.level, probe.reason)


def _shell_inner(name: str, args: list[Word], env: Env, verdict: Verdict, depth: int) -> None:
    """bash -c '…' and eval …: class the inner command too (the strictest wins)."""
    inner: str | None = None
    if name == "eval":
        if all(not w.unknown for w in args):
            inner = " ".join(w.text for w in args)
    else:
        for i, w in enumerate(args):
            if w.text.startswith("-") and not w.text.startswith("--") and "c" in w.text[1:]:
                if i + 1 < len(args) and not args[i + 1].unknown:
                    inner = args[i + 1].text
                break
    if inner is not None:
        level, reason = _classify(inner, env, depth + 1)
        verdict.add(level, reason)


def program_names(word: Word, env: Env) -> set[str] | None:
    """The program names a command word may run (a pattern: every hard-line name it could match, and what
    it matches on disk now); None when the name is computed when it runs."""
    if word.computed:
        values = word_values(word, env)
        if values is None or len(values) != 1:
            return None
        return {values[0].rsplit("/", 1)[-1]}
    if not word.glob:
        return {word.text.rsplit("/", 1)[-1]}
    regex = pattern_regex(word.text.rsplit("/", 1)[-1])
    names = {n for n in HARD_NAMES if regex.fullmatch(n)}
    for cwd in env.cwds:
        try:
            names |= {p.name for p in expand(word.text, cwd, True, env)[1:]}
        except TooMany:
            pass
    return names


def _command(words: list[Word], env: Env, verdict: Verdict, depth: int, subs: list[str] | None = None) -> None:
    """Class one simple command (assignments and reserved words already removed, braces expanded)."""
    if not words:
        return
    first = words[0]
    names = program_names(first, env)
    if names is None:
        verdict.add(REFUSE, f"the program to run ({shown(first)}) is worked out only when the"
                            " command runs, so it cannot be checked against the hard line; name it")
        return
    if first.glob:
        verdict.add(ASK, f"the program to run is a pattern ({first.text})")
        for name in sorted(names):
            probe = Verdict(only_refusals=True)
            _command([Word.plain(name), *words[1:]], env, probe, depth + 1)
            if probe.level == REFUSE:
                verdict.add(REFUSE, f"the pattern {first.text} could run `{name}`: {probe.reason}")
        return
    path_name = first.text
    if first.computed:
        path_name = (word_values(first, env) or [path_name])[0]
        verdict.add(ASK, f"the program to run comes from a variable ({first.text})")
    name = path_name.rsplit("/", 1)[-1]
    via_path = "/" in path_name
    args = words[1:]
    if via_path:
        verdict.add(ASK, f"runs a program by its path ({path_name})")
    if name in AS_ROOT:
        verdict.add(REFUSE, f"`{name}` runs commands as another user")
        return
    if name in POWER or (name in ("init", "telinit") and any(a.text in ("0", "6") for a in args)) or (
            name == "systemctl" and any(a.text in ("poweroff", "reboot", "halt", "kexec", "emergency", "rescue")
                                        for a in args)):
        verdict.add(REFUSE, f"`{name}` shuts the machine down or restarts it")
        return
    if name.startswith("mkfs") or name in DISK:
        verdict.add(REFUSE, f"`{name}` formats or partitions disks")
        return
    if name == "kill":
        texts = [a.text for a in args]
        if "-1" in texts[1:] or ("--" in texts and "-1" in texts[texts.index("--") + 1:]):
            verdict.add(REFUSE, "kill -1 signals every process")
            return
    if name == "rm" or name in _DELETERS:
        _rm(args, env, verdict, via_path=via_path, name=name)
        if name == "rm":
            return
    _destinations(name, args, env, verdict)
    if name in WRAPPERS:
        if name in ("env",) and not args:
            verdict.add(READ, "read-only")
            return
        verdict.add(ASK, f"`{name}` runs another command")
        for k in range(1, min(len(words), MAX_UNWRAP + 1)):
            if not (words[k].text.startswith("-") or _assignment(words[k])):  # an option, or env's NAME=value
                _refusals(words[k:], env, depth, verdict)
        for w in args:  # watch 'cmd', env -S 'cmd', script -c 'cmd', flock f -c 'cmd': a command line in a word
            if " " in w.text.strip() and not w.computed:
                level, reason = _classify(w.text, env, depth + 1)
                if level == REFUSE:
                    verdict.add(level, reason)
        return
    if _runs_code(name) and _downloads(args, subs):
        verdict.add(REFUSE, "runs a downloaded script in a shell or interpreter")
    if name in SHELLS or name == "eval":
        verdict.add(ASK, _category(name))
        _shell_inner(name, args, env, verdict, depth)
        return
    if name == "cd":
        _cd(args, env, verdict)
        return
    if (name in READ_ONLY or name == "git") and not via_path:
        _read_only(name, args, env, verdict, depth)
        return
    verdict.add(ASK, _category(name))


def _runs_code(name: str) -> bool:
    return name in INTERPRETERS or name in ("source", ".", "eval") or bool(_INTERPRETER_VERSION.match(name))


def _downloads(words: list[Word], subs: list[str] | None) -> bool:
    """Some word holds a substitution that downloads ($(curl …), <(wget …))."""
    return subs is not None and any(_DOWNLOAD_WORD.search(subs[i]) for w in words for i in w.subs)


def _cd(args: list[Word], env: Env, verdict: Verdict) -> None:
    _, operands = _split_options(args)
    env.moved = True
    if not operands:
        env.cwds = [env.home]
        return
    values = word_values(operands[0], env)
    if values is None or len(values) != 1 or values[0] == "-":
        env.lost = True
        return
    value = values[0]
    new = []
    for cwd in env.cwds:  # cd -P follows links as the kernel does; cd (-L) first drops "x/.." from the path
        target = Path(value) if value.startswith("/") else cwd / value
        new += [resolve(target, cwd)[0], resolve(Path(os.path.normpath(target)), cwd)[0]]
    env.cwds = list(dict.fromkeys(env.cwds + new))[:8]  # a cd in a subshell may not last: keep both
    env.seen = list(dict.fromkeys(env.seen + new))[:16]


# ---------------------------------------------------------------- simple commands and redirections


def _expanded(words: list[Word], verdict: Verdict) -> list[Word]:
    """The words after bash's brace expansion (the first step of its word expansion)."""
    out: list[Word] = []
    for w in words:
        try:
            alternatives = expand_braces(w)
        except TooMany:
            verdict.add(REFUSE, f"a brace expansion ({w.text}) makes more words than can be checked")
            alternatives = [w]
        if alternatives != [w]:
            verdict.add(ASK, f"uses brace expansion ({w.text}), which bash turns into other words")
        out += alternatives
    return out


def _assignment(word: Word) -> bool:
    m = _ASSIGN.match(word.text)
    return bool(m) and set(word.mask[: m.end()]) == {"u"}


def _segment(seg: Segment, env: Env, verdict: Verdict, depth: int, subs: list[str]) -> None:
    words = seg.words
    while words and not words[0].quoted and words[0].text in RESERVED:
        if words[0].text in STRUCTURE:
            verdict.add(ASK, "uses shell control structures (loops, conditions, groups, functions)")
        words = words[1:]
    assignments = []
    while words and _assignment(words[0]):
        assignments.append(words[0])
        words = words[1:]
    for w in assignments:
        name = w.text.partition("=")[0]
        values = word_values(w.tail(len(name) + 1), env)
        if values and len(values) == 1:
            env.assigned[name.rstrip("+")] = values[0]
        verdict.add(ASK, "sets shell variables")
    words = _expanded(words, verdict)
    for w in assignments + words:
        why = inexact(w)
        if why:
            verdict.add(ASK, why)
    named = words[1:] if words and "/" not in words[0].text else words  # a program name is looked up in PATH
    check_words(assignments + named, env, False, verdict)
    check_redirects(seg.redirects, env, verdict)
    fed = [t for _, t in seg.redirects if t is not None]
    if words and any(_runs_code(n) for n in program_names(words[0], env) or ()):
        if _downloads(fed, subs):
            verdict.add(REFUSE, "feeds a download to a shell or interpreter (<<< \"$(curl …)\", < <(wget …))")
        for op, target in seg.redirects:
            if op.endswith("<<<") and target is not None and not target.computed:
                level, reason = _classify(target.text, env, depth + 1)
                if level == REFUSE:
                    verdict.add(REFUSE, f"feeds a command line to a shell: {reason}")
    _command(words, env, verdict, depth, subs)


def _printed(seg: Segment) -> str | None:
    """What an echo or printf of literal words prints (escapes like \\n read as printf reads them)."""
    words = seg.words[1:]
    if any(w.computed for w in words):
        return None
    texts = [w.text for w in words]
    while texts and re.fullmatch(r"-[neE]+", texts[0]) and seg.words[0].text == "echo":
        texts = texts[1:]
    return re.sub(r"\\[nt;]", lambda m: {"n": "\n", "t": " ", ";": ";"}[m.group(0)[1]], " ".join(texts))


def _pipeline_names(seg: Segment, env: Env) -> set[str]:
    """The programs a segment may run, looking past reserved words, assignments and wrappers."""
    words = [w for w in seg.words if not (w.text in RESERVED and not w.quoted)]
    while words and _ASSIGN.match(words[0].text):
        words = words[1:]
    try:
        words = [a for w in words for a in expand_braces(w)]
    except TooMany:
        return set()
    while words:
        names = program_names(words[0], env) or set()
        if names & (WRAPPERS | AS_ROOT):
            words = [w for w in words[1:] if not w.text.startswith("-") and not _ASSIGN.match(w.text)
                     and not w.text.replace(".", "").isdigit()]
            continue
        return names
    return set()


# ---------------------------------------------------------------- entry points


def _classify(command: str, env: Env, depth: int) -> tuple[str, str]:
    verdict = Verdict()
    if "\x00" in command:
        return REFUSE, "the command contains a NUL character"
    try:
        command.encode("utf-8")
    except UnicodeEncodeError:
        return REFUSE, "the command is not valid text"
    if len(command) > MAX_COMMAND:
        return REFUSE, f"the command is longer than {MAX_COMMAND // 1024} KB; put it in a script file"
    if depth > MAX_DEPTH:
        return ASK, "nested too deeply to check"
    if _FORK_BOMB.search(command):
        verdict.add(REFUSE, "a fork bomb")
    for text in env.data_text:
        if re.search(re.escape(text) + r"(?![^/\s'\"])", command):
            verdict.add(REFUSE, f"touches Starling's data folder ({text})")
    try:
        tokens, subs = lex(command)
    except ParseError as e:
        verdict.add(ASK, f"cannot be checked: {e}")
        # bash runs the lines before a syntax error: class each line on its own too
        lines = command.split("\n")
        if len(lines) > 1:
            for line in lines:
                level, reason = _classify(line, env, depth + 1)
                verdict.add(level, reason)
        return verdict.level, verdict.reason
    for inner in subs:
        level, reason = _classify(inner, env, depth + 1)
        verdict.add(level, reason)
    parts, structured = segments(tokens)
    if structured:
        verdict.add(ASK, "uses shell control structures (subshells, case)")
    pipelines: dict[int, list[Segment]] = {}
    for seg in parts:
        pipelines.setdefault(seg.pipeline, []).append(seg)
    runs = INTERPRETERS | {"source", ".", "eval"}
    for group in pipelines.values():
        names = [_pipeline_names(seg, env) for seg in group]
        for i, found in enumerate(names):
            downloads = found & DOWNLOADERS
            if downloads and any(later & runs for later in names[i + 1:]):
                verdict.add(REFUSE, f"pipes a download ({sorted(downloads)[0]}) into a shell or interpreter")
            script = _printed(group[i]) if found & {"echo", "printf"} else None
            if script is not None and any(later & SHELLS for later in names[i + 1:]):
                level, reason = _classify(script, env, depth + 1)
                if level == REFUSE:
                    verdict.add(REFUSE, f"pipes a command line into a shell: {reason}")
    for seg in parts:
        _segment(seg, env, verdict, depth, subs)
    return verdict.level, verdict.reason


def classify(command: str, ctx: ToolContext) -> tuple[str, str]:
    """(class, reason) of a shell command line run in the agent's private workspace; see the module doc."""
    return _classify(command, env_for(ctx), 0)

