"""Approval classes of shell commands: read-only runs free, anything else asks, a hard line is never crossed.

``classify(command, ctx)`` → (class, reason), class one of:

- ``read``: every command in it is on the read-only list (ls, cat, grep, git status, …) with no
  writing option and no redirection to a file;
- ``scratchpad``: as read, plus ``rm`` whose targets all resolve inside the agent's own
  ``.scratchpad/`` (the one free delete);
- ``ask``: anything else (writes, deletes, network, installs, interpreters, unknown programs,
  variables and substitutions computed at run time, control structures): runs once approved;
- ``refuse``: the hard line, never run even when approved: rm -r of /, ~, *, a home or workspace root
  or a system folder; mkfs and friends; dd/redirections onto devices; writes into /etc and other
  system folders; shutdown/reboot/halt/poweroff; fork bombs; sudo/su/doas; a download piped or
  substituted into a shell; kill -1; reading another process's /proc entries; any path inside
  Starling's data folder (credentials, secrets) or another agent's private folder.

The command line is split on ; && || | & newlines, ( ), $( ), backticks and <( ) (shell_lex.py);
each part is classed and the strictest wins. Wrappers (xargs, timeout, env, nohup, …) and
``bash -c``/``eval`` are looked through for the hard line.

This is a guard against mistakes and naive prompt injection, not a sandbox: a command that asks can do
anything the runner's OS user can once approved (a script can compute paths this check never sees),
which is why the approval shows the command. Run Starling as its own user (or in a container).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from services.runner.tools.base import ToolContext
from services.runner.tools.shell_lex import SUB, Op, ParseError, Word, expand_braces, lex
from services.runner.tools.shell_paths import (
    ASK, RANK, READ, REFUSE, SCRATCH, SINKS, Env, Verdict, check_words, env_for, real, resolve_targets,
    under_system, word_values,
)

__all__ = ["classify", "READ", "SCRATCH", "ASK", "REFUSE", "RANK"]

MAX_COMMAND = 16 * 1024
MAX_DEPTH = 6
MAX_UNWRAP = 8

READ_ONLY = frozenset("""
    ls cat head tail wc grep egrep fgrep rg find pwd echo printf date whoami id uname df du stat file sort uniq
    cut tr diff cmp comm basename dirname realpath readlink true false test [ seq nl tac rev tree md5sum
    sha1sum sha256sum sha512sum cksum jq which type hostname uptime nproc printenv cd sleep column fold
    expand unexpand paste join fmt od hexdump xxd strings locale getconf groups tty
""".split())
RECURSIVE_READERS = frozenset({"rg", "find", "du", "tree"})
GIT_READ = frozenset({"status", "log", "diff", "show"})
RESERVED = frozenset({"{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for",
                      "case", "esac", "select", "function", "time", "coproc", "in", "[[", "]]"})
STRUCTURE = RESERVED - {"time"}
WRAPPERS = frozenset({"nohup", "nice", "ionice", "timeout", "stdbuf", "env", "command", "builtin", "exec",
                      "xargs", "setsid", "watch", "strace", "ltrace", "chrt", "taskset", "unbuffer", "flock",
                      "parallel", "busybox", "chroot", "runuser", "script", "faketime", "proxychains", "torsocks"})
AS_ROOT = frozenset({"sudo", "su", "doas", "pkexec", "run0", "sudoedit"})
POWER = frozenset({"shutdown", "reboot", "halt", "poweroff"})
DISK = frozenset({"mke2fs", "mkswap", "wipefs", "fdisk", "sfdisk", "parted", "gdisk", "sgdisk", "cfdisk",
                  "blkdiscard", "badblocks"})
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish", "csh", "tcsh", "ash", "busybox"})
INTERPRETERS = SHELLS | frozenset({"python", "python2", "python3", "node", "nodejs", "ruby", "perl", "php",
                                   "deno", "bun", "lua", "tclsh", "pwsh", "Rscript", "osascript"})
DOWNLOADERS = frozenset({"curl", "wget", "fetch", "aria2c", "http", "https", "lwp-request", "GET"})
_INTERPRETER_VERSION = re.compile(r"^(python|pypy|ruby|perl|php|node|lua)[\d.]*$")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=")
_FORK_BOMB = re.compile(r"([^\s(){}|&;]+)\s*\(\s*\)\s*\{[^}]*\1\s*\|\s*\1")
_DOWNLOAD_WORD = re.compile(r"\b(" + "|".join(sorted(DOWNLOADERS - {"GET"})) + r")\b")
SAFE_VARS = frozenset({"PATH", "LANG", "TERM", "HOME", "PWD", "OLDPWD", "SHELL", "RANDOM", "SECONDS", "HOSTNAME",
                       "BASH_VERSION", "LINENO", "?", "#", "@", "*", "$", "-", "0", "1", "2", "3", "4", "5",
                       "6", "7", "8", "9"})
RM_LITERALS = frozenset({"/", "/*", "~", "~/", "~/*", "*", ".", "./", "..", "../", "./*", "../*", ".*", "$HOME",
                         "${HOME}", "$HOME/", "$HOME/*", "${HOME}/*"})
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


def _category(name: str) -> str:
    for reason, names in _CATEGORIES:
        if name in names:
            return f"`{name}` {reason}"
    if _INTERPRETER_VERSION.match(name):
        return f"`{name}` runs a program or script"
    return f"`{name}` is not on the read-only list"


def _rm(args: list[Word], env: Env, verdict: Verdict, *, via_path: bool) -> None:
    options, targets = _split_options(args)
    recursive = _has_short(options, "rR") or "--recursive" in options
    if "--no-preserve-root" in options:
        verdict.add(REFUSE, "rm --no-preserve-root")
    scratch_ok = bool(targets) and not env.moved and not via_path
    allowed = {"-f", "-r", "-R", "-d", "-v", "--force", "--recursive", "--dir", "--verbose"}
    if any(o not in allowed and not (o.startswith("-") and not o.startswith("--") and set(o[1:]) <= set("frRdv"))
           for o in options):
        scratch_ok = False
    for target in targets:
        raw = target.text
        if recursive and (raw in RM_LITERALS or (raw.rstrip("/") in ("~", "") and target.tilde)):
            verdict.add(REFUSE, f"rm -r {raw}")
        if recursive and (target.vars or target.unknown):  # an unset $X in `rm -rf $X/*` is empty: /*
            for value in word_values(target, env, guess=True, fill="") or []:
                if value in RM_LITERALS or value.rstrip("/") == "" or Path(value) in env.protected:
                    verdict.add(REFUSE, f"rm -r {raw} (if {raw} expands to {value!r})")
        resolved = resolve_targets(target, env)
        if resolved is None:
            scratch_ok = False
            continue
        for path in resolved:
            if recursive and any(path == p or path in p.parents for p in env.protected):
                verdict.add(REFUSE, f"rm -r of {path}, a home, workspace or system folder")
            elif under_system(path):
                verdict.add(REFUSE, f"deletes in a system folder ({path})")
            if ".." in Path(raw).parts or not (env.scratch in path.parents):
                scratch_ok = False
    if scratch_ok:
        verdict.add(SCRATCH, "deletes files in the scratchpad")
    else:
        verdict.add(ASK, "`rm` deletes files")


_DEST_LAST = frozenset({"cp", "mv", "ln", "install", "rsync", "scp"})
_DEST_ALL = frozenset({"tee", "touch", "mkdir", "rmdir", "truncate", "shred", "chmod", "chown", "chgrp", "unlink",
                       "mkfifo", "mknod", "sed", "patch", "split", "sponge"})


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
                dests.append(replace(w, text=w.text.split("=", 1)[1]))
    elif name in _DEST_ALL:
        dests = operands
    elif name == "dd":
        dests = [replace(w, text=w.text[3:]) for w in args if w.text.startswith("of=")]
    for word in dests:
        for path in resolve_targets(word, env, follow_last=True) or []:
            if name == "dd" and str(path).startswith("/dev/") and str(path) not in SINKS:
                verdict.add(REFUSE, f"dd onto a device ({path})")
            elif under_system(path):
                verdict.add(REFUSE, f"writes into a system folder ({path})")
    if name in ("chmod", "chown", "chgrp"):
        recursive = _has_short(options, "R") or "--recursive" in options
        for word in operands:
            for path in resolve_targets(word, env, follow_last=True) or []:
                if path == Path("/") or (recursive and any(path == p or path in p.parents for p in env.protected)):
                    verdict.add(REFUSE, f"{name} of {path}, a home, workspace or system folder")


def _read_only_exceptions(name: str, args: list[Word], verdict: Verdict, env: Env, depth: int) -> bool:
    """True when a read-only command is used with an option that writes or runs something."""
    options, operands = _split_options(args)
    texts = [w.text for w in args]
    if name in ("printf", "test", "[", "[[") and "-v" in texts:
        return True  # bash evaluates a $(...) inside a -v array subscript
    if name == "find":
        risky = {"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"}
        for i, t in enumerate(texts):
            if t in ("-exec", "-execdir", "-ok", "-okdir"):
                inner = []
                for w in args[i + 1:]:
                    if w.text in (";", "+"):
                        break
                    inner.append(w)
                _refusals(inner, env, depth + 1, verdict)
        return any(t in risky for t in texts)
    if name == "sort":
        return _has_short(options, "o") or any(o.startswith(("--output", "--compress-program")) for o in options)
    if name == "uniq":
        return len(operands) > 1
    if name == "date":
        return _has_short(options, "s") or any(o.startswith("--set") for o in options)
    if name == "file":
        return _has_short(options, "C") or "--compile" in options
    if name == "rg":
        return any(o.startswith("--pre") for o in options)
    if name == "tree":
        return _has_short(options, "o")
    if name == "hostname":
        return bool(operands)
    if name == "xxd":
        return len(operands) > 1  # xxd in out
    return False


def _recursive_read(name: str, args: list[Word]) -> bool:
    options, _ = _split_options(args)
    if name in RECURSIVE_READERS:
        return True
    if name in ("grep", "egrep", "fgrep"):
        long = ("--recursive", "--dereference-recursive", "--directories=recurse")
        return _has_short(options, "rR") or any(o.startswith(long) for o in options)
    if name == "ls":
        return _has_short(options, "R") or "--recursive" in options
    return name not in READ_ONLY


def _git(args: list[Word], verdict: Verdict) -> None:
    if not args:
        verdict.add(ASK, "`git` without a subcommand")
        return
    if args[0].text.startswith("-"):
        verdict.add(ASK, "git with global options (-c, -C, --git-dir …)")
        return
    sub = args[0].text
    risky = any(w.text.startswith(("--output", "--ext-diff", "--textconv", "-o")) for w in args[1:])
    if sub in GIT_READ and not risky:
        verdict.add(READ, "read-only")
    else:
        verdict.add(ASK, f"`git {sub}` changes the repository or uses the network")


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


def _refusals(words: list[Word], env: Env, depth: int, verdict: Verdict) -> None:
    """Look through a wrapper (xargs, timeout, find -exec …) at the command it runs: only its refusals count."""
    probe = Verdict(only_refusals=True)
    _command(words, env, probe, depth)
    verdict.add(probe.level, probe.reason)


def _command(words: list[Word], env: Env, verdict: Verdict, depth: int, subs: list[str] | None = None) -> None:
    """Class one simple command (assignments and reserved words already removed)."""
    if not words:
        return
    first = words[0]
    if first.unknown or SUB in first.text or first.vars:
        verdict.add(ASK, "the command name is computed when it runs")
        probe = Verdict(only_refusals=True)  # the hard line still applies to what follows: `$x -rf /`
        _rm(words[1:], env, probe, via_path=True)
        verdict.add(probe.level, probe.reason)
        return
    path_name = first.text
    name = path_name.rsplit("/", 1)[-1] if "/" in path_name else path_name
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
    if name == "rm":
        _rm(args, env, verdict, via_path=via_path)
        return
    _destinations(name, args, env, verdict)
    if name in WRAPPERS:
        if name in ("env",) and not args:
            verdict.add(READ, "read-only")
            return
        verdict.add(ASK, f"`{name}` runs another command")
        for k in range(1, min(len(words), MAX_UNWRAP + 1)):
            _refusals(words[k:], env, depth, verdict)
        return
    if name in SHELLS or name == "eval":
        verdict.add(ASK, _category(name))
        if subs is not None and any(SUB in w.text and any(_DOWNLOAD_WORD.search(subs[i]) for i in w.subs)
                                    for w in args):
            verdict.add(REFUSE, "runs a downloaded script in a shell")
        _shell_inner(name, args, env, verdict, depth)
        return
    if name in ("source", "."):
        if subs is not None and any(any(_DOWNLOAD_WORD.search(subs[i]) for i in w.subs) for w in args):
            verdict.add(REFUSE, "runs a downloaded script in a shell")
        verdict.add(ASK, _category(name))
        return
    if name == "cd":
        _cd(args, env)
        return
    if name == "git":
        _git(args, verdict)
        return
    if name in READ_ONLY and not via_path:
        if _read_only_exceptions(name, args, verdict, env, depth):
            verdict.add(ASK, f"`{name}` with an option that writes files or runs commands")
        return
    verdict.add(ASK, _category(name))


def _cd(args: list[Word], env: Env) -> None:
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
    new = [real(Path(value) if value.startswith("/") else cwd / value) for cwd in env.cwds]
    env.cwds = list(dict.fromkeys(env.cwds + new))[:8]  # a cd in a subshell may not last: keep both


# ---------------------------------------------------------------- segments


@dataclass
class Segment:
    words: list[Word] = field(default_factory=list)
    redirects: list[tuple[str, Word | None]] = field(default_factory=list)
    pipeline: int = 0


_SEPARATORS = {";", "&&", "||", "&", ";;", ";&", ";;&", "(", ")"}
_PIPES = {"|", "|&"}


def _segments(tokens: list) -> tuple[list[Segment], bool]:
    segments = [Segment()]
    structured = False
    pipeline = 0
    pending: str | None = None
    for tok in tokens:
        if isinstance(tok, Op):
            base = tok.text.lstrip("0123456789")
            if pending is not None:  # an operator where a redirection's target should be
                segments[-1].redirects.append((pending, None))
                pending = None
            if base in _PIPES:
                segments.append(Segment(pipeline=pipeline))
            elif base in _SEPARATORS:
                if base in ("(", ")", ";;", ";&", ";;&"):
                    structured = True
                pipeline += 1
                segments.append(Segment(pipeline=pipeline))
            else:
                pending = tok.text
        elif pending is not None:
            segments[-1].redirects.append((pending, tok))
            pending = None
        else:
            segments[-1].words.append(tok)
    if pending is not None:
        segments[-1].redirects.append((pending, None))
    return [s for s in segments if s.words or s.redirects], structured


def _redirects(seg: Segment, env: Env, verdict: Verdict) -> None:
    for op, target in seg.redirects:
        base = op.lstrip("0123456789")
        if target is None:
            verdict.add(ASK, f"a redirection ({op}) without a target")
            continue
        if base in ("<<", "<<-"):
            # bash expands $(...) and backticks in a here-document's body whatever quotes or # it holds
            verdict.add(ASK, "a here-document (its text is expanded when the command runs)")
            continue
        if base in (">&", "<&") and (target.text.isdigit() or target.text == "-"):
            continue  # 2>&1: a descriptor, not a file
        if target.unknown or SUB in target.text:
            verdict.add(ASK, f"redirects to a place computed when it runs ({op})")
        check_words([target], env, False, verdict)
        if base in ("<", "<<<"):
            continue
        for path in resolve_targets(target, env, follow_last=True) or []:
            if str(path) in SINKS:
                continue
            if str(path).startswith("/dev/"):
                verdict.add(REFUSE, f"writes onto a device ({path})")
            elif under_system(path):
                verdict.add(REFUSE, f"writes into a system folder ({path})")
        if target.text not in SINKS:
            verdict.add(ASK, f"writes to a file ({op} {target.text})")


def _segment(seg: Segment, env: Env, verdict: Verdict, depth: int, subs: list[str]) -> None:
    words = seg.words
    while words and not words[0].quoted and words[0].text in RESERVED:
        if words[0].text in STRUCTURE:
            verdict.add(ASK, "uses shell control structures (loops, conditions, groups, functions)")
        words = words[1:]
    if any(w.brace for w in words):
        expanded: list[Word] = []
        for w in words:
            values = expand_braces(w.text) if w.brace else [w.text]
            expanded += [replace(w, text=v, brace=False) for v in values]
        words = expanded
    assignments = []
    while words and _ASSIGN.match(words[0].text) and not words[0].text.startswith("="):
        assignments.append(words[0])
        words = words[1:]
    for w in assignments:
        name, _, value = w.text.partition("=")
        values = word_values(replace(w, text=value, tilde=value.startswith("~")), env)
        env.assigned[name.rstrip("+")] = values[0] if values and len(values) == 1 else ""
        verdict.add(ASK, "sets shell variables")
    name = words[0].text.rsplit("/", 1)[-1] if words else ""
    check_words(assignments + words, env, _recursive_read(name, words[1:]) if words else False, verdict)
    for w in words:
        if w.unknown or SUB in w.text:
            verdict.add(ASK, "uses values computed when it runs (substitutions, $'…', ${…})")
        unsafe = w.vars - SAFE_VARS - set(env.assigned)
        if unsafe:
            verdict.add(ASK, f"uses variables (${sorted(unsafe)[0]})")
    _redirects(seg, env, verdict)
    _command(words, env, verdict, depth, subs)


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
    segments, structured = _segments(tokens)
    if structured:
        verdict.add(ASK, "uses shell control structures (subshells, case)")
    pipelines: dict[int, list[Segment]] = {}
    for seg in segments:
        pipelines.setdefault(seg.pipeline, []).append(seg)
    for group in pipelines.values():
        names = [_name(seg) for seg in group]
        for i, n in enumerate(names):
            if n in DOWNLOADERS and any(m in INTERPRETERS or m in ("source", ".", "eval") for m in names[i + 1:]):
                verdict.add(REFUSE, f"pipes a download ({n}) into a shell or interpreter")
    for seg in segments:
        _segment(seg, env, verdict, depth, subs)
    return verdict.level, verdict.reason


def _name(seg: Segment) -> str:
    """The program a segment runs, looking past reserved words, assignments and wrappers."""
    words = [w for w in seg.words if not (w.text in RESERVED and not w.quoted)]
    while words and _ASSIGN.match(words[0].text):
        words = words[1:]
    while words:
        name = words[0].text.rsplit("/", 1)[-1]
        if name in WRAPPERS or name in AS_ROOT:
            rest = [w for w in words[1:] if not w.text.startswith("-") and not _ASSIGN.match(w.text)
                    and not w.text.replace(".", "").isdigit()]
            words = rest
            continue
        return name
    return ""


def classify(command: str, ctx: ToolContext) -> tuple[str, str]:
    """(class, reason) of a shell command line run in the agent's private workspace; see the module doc."""
    return _classify(command, env_for(ctx), 0)

