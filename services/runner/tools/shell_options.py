"""What the read-only commands' options do: an allow-list per command, read the way the command reads it.

A read-only command runs free only in the forms listed here (``SPECS``, and the readers with their own
grammar: find, xxd, jq, git, test, printf). Options are parsed as GNU getopt_long does: clusters
(-rn), glued and separate arguments (-k2, -k 2, --key=2, --key 2), options after operands, ``--``, and
abbreviated long options: an abbreviation that could stand for a listed dangerous option *is* that
option (--compress-prog, --outp), one that matches no listed option is unknown, and an unknown option
asks. Dangerous (``deny``): options that write files, run programs, or read the names of the files to
open from a file the check cannot see (files0-from, file -f, md5sum -c). ``judge`` returns what the
classifier needs: reasons to ask, whether and from where the command recurses, the files its options
read, and the commands it runs (find -exec), whose hard line still applies.

The option tables follow coreutils 9.1, grep 3.8, diffutils 3.8, findutils 4.9, file 5.44, jq 1.6,
util-linux 2.38; tests/test_classify.py checks their argument kinds against the installed tools.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from services.runner.tools.shell_lex import Word


@dataclass(frozen=True)
class Spec:
    short: dict[str, str]  # letter → "" (no argument), ":" (required), "::" (optional, glued only)
    long: dict[str, str]  # name → "" | "=" (required) | "?" (optional, after = only)
    deny: dict[str, str] = field(default_factory=dict)  # letter or name → what it does that is not a read
    paths: frozenset[str] = frozenset()  # letters and names whose argument is a file the command reads
    recurse: frozenset[str] = frozenset()  # letters and names that make it read folders recursively
    follow: frozenset[str] = frozenset()  # ... following symbolic links on the way
    recursive: bool = False  # always reads the folders it is given recursively
    numeric: bool = False  # a -NUM word is an operand (seq -5 5)
    abbrev: bool = True  # GNU getopt_long: long options may be abbreviated


def spec(short: str = "", long: str = "", *, deny: str = "", paths: str = "", recurse: str = "", follow: str = "",
         recursive: bool = False, numeric: bool = False, abbrev: bool = True) -> Spec:
    shorts: dict[str, str] = {}
    i = 0
    while i < len(short):
        c, i = short[i], i + 1
        kind = ""
        while i < len(short) and short[i] == ":":
            kind, i = kind + ":", i + 1
        shorts[c] = kind
    longs = {}
    for item in (long + " help version").split():
        name = item.rstrip("=?")
        longs[name] = item[len(name):]
    denied = {}
    for clause in deny.split(";"):
        keys, _, what = clause.partition(":")
        denied.update(dict.fromkeys(keys.split(), what.strip()))
    return Spec(shorts, longs, denied, frozenset(paths.split()), frozenset(recurse.split()), frozenset(follow.split()),
                recursive, numeric, abbrev)


_GREP = spec(
    "abchilnoqrsuvwxyzEFGHILPRTUVZ0123456789d:e:f:m:A:B:C:D:X:",
    "after-context= basic-regexp before-context= binary-files= byte-offset context= color? colour? count devices="
    " directories= dereference-recursive exclude= exclude-from= exclude-dir= extended-regexp file="
    " files-with-matches files-without-match fixed-strings include= ignore-case no-ignore-case initial-tab label="
    " line-buffered line-number line-regexp max-count= no-filename no-group-separator group-separator="
    " no-messages null null-data only-matching perl-regexp quiet recursive regexp= invert-match silent text binary"
    " unix-byte-offsets with-filename word-regexp",
    paths="f file exclude-from", recurse="r R d directories recursive dereference-recursive",
    follow="R dereference-recursive")
_LIST = "reads the names of the files to open from a file"
_DIGEST = spec("bctwz", "check ignore-missing quiet status warn strict tag zero binary text", deny=f"c check: {_LIST}")
_DIGITS_OPTIONAL = "0::1::2::3::4::5::6::7::8::9::"

SPECS: dict[str, Spec] = {
    "ls": spec(
        "abcdfghiklmnopqrstuvw:xABCDFGHI:LNQRST:UXZ1",
        "all escape directory dired full-time group-directories-first human-readable inode kibibytes"
        " numeric-uid-gid no-group hide-control-chars reverse size width= almost-all ignore-backups classify?"
        " file-type si dereference-command-line dereference-command-line-symlink-to-dir hide= ignore="
        " indicator-style= dereference literal quote-name quoting-style= recursive format= show-control-chars"
        " sort= tabsize= time= time-style= zero color? hyperlink? block-size= context author",
        recurse="R recursive", follow="L dereference"),
    "cat": spec("benstuvAET", "number-nonblank number squeeze-blank show-nonprinting show-ends show-tabs show-all"),
    "head": spec("c:n:qvz0123456789", "bytes= lines= quiet silent verbose zero-terminated"),
    "tail": spec("c:n:fFqs:vz0123456789", "bytes= follow? lines= max-unchanged-stats= pid= quiet retry silent"
                 " sleep-interval= verbose zero-terminated"),
    "wc": spec("clLmw", "bytes chars lines words debug files0-from= max-line-length", deny=f"files0-from: {_LIST}"),
    "grep": _GREP, "egrep": _GREP, "fgrep": _GREP,
    "date": spec("d:f:I::r:Rs:u", "date= debug file= iso-8601? reference= resolution rfc-email rfc-822 rfc-2822"
                 " rfc-3339= set= uct utc universal", deny="s set: sets the clock", paths="f file r reference"),
    "df": spec("aB:iF:hHklmPTt:vx:", "all block-size= inodes human-readable si local output? portability"
               " print-type sync no-sync total type= exclude-type="),
    "du": spec("0abd:chHklmst:xB:DLPSX:", "all apparent-size block-size= bytes count-links dereference"
               " dereference-args exclude= exclude-from= files0-from= human-readable inodes si max-depth= null"
               " no-dereference one-file-system separate-dirs summarize total threshold= time? time-style=",
               deny=f"files0-from: {_LIST}", paths="X exclude-from", recursive=True, follow="L dereference"),
    "stat": spec("c:fLt", "dereference file-system format= printf= terse cached="),
    "file": spec("bcdhiklnprszCELNSZ0e:f:m:F:P:", "magic-file= uncompress uncompress-noreport brief checking-printout"
                 " exclude= exclude-quiet= files-from= separator= mime apple extension mime-type mime-encoding"
                 " keep-going list dereference no-dereference no-buffer no-pad print0 preserve-date parameter= raw"
                 " special-files no-sandbox compile debug",
                 deny=f"C compile: writes a compiled magic file; f files-from: {_LIST}; p preserve-date: changes"
                      " access times; S no-sandbox: turns off its sandbox; z Z uncompress uncompress-noreport: runs"
                      " decompressors; s special-files: reads devices", paths="m magic-file"),
    "sort": spec("bcCdfghik:mMno:rRsS:t:T:uVy:z", "ignore-leading-blanks check? compress-program= debug"
                 " dictionary-order ignore-case files0-from= general-numeric-sort ignore-nonprinting key= merge"
                 " month-sort numeric-sort human-numeric-sort version-sort random-sort random-source= sort= output="
                 " reverse stable batch-size= buffer-size= field-separator= temporary-directory= unique"
                 " zero-terminated parallel=",
                 deny="o output: writes its output to a file; T temporary-directory: writes temporary files there;"
                      f" compress-program: runs a program; files0-from: {_LIST}", paths="random-source"),
    "uniq": spec("0123456789Dcdf:is:uw:z", "count repeated all-repeated? group? ignore-case unique skip-fields="
                 " skip-chars= check-chars= zero-terminated"),
    "cut": spec("b:c:d:f:nsz", "bytes= characters= fields= delimiter= only-delimited output-delimiter= complement"
                " zero-terminated"),
    "tr": spec("AcCdst", "complement delete squeeze-repeats truncate-set1"),
    "diff": spec("abcdefhilnpqrstuwyBEHNPTZ0123456789x:C:D:F:I:L:S:U:W:X:",
                 "normal brief report-identical-files context? unified? ed rcs side-by-side width= left-column"
                 " suppress-common-lines show-c-function show-function-line= label= expand-tabs initial-tab tabsize="
                 " suppress-blank-empty paginate recursive no-dereference new-file unidirectional-new-file"
                 " ignore-file-name-case no-ignore-file-name-case exclude= exclude-from= starting-file= from-file="
                 " to-file= ignore-case ignore-tab-expansion ignore-trailing-space ignore-space-change"
                 " ignore-all-space ignore-blank-lines ignore-matching-lines= text strip-trailing-cr ifdef="
                 " old-group-format= new-group-format= unchanged-group-format= changed-group-format= line-format="
                 " old-line-format= new-line-format= unchanged-line-format= minimal horizon-lines= speed-large-files"
                 " color? palette= binary",
                 deny="l paginate: runs pr", paths="X exclude-from from-file to-file", recurse="r recursive",
                 follow="r recursive"),
    "cmp": spec("bclsi:n:", "print-bytes ignore-initial= verbose bytes= quiet silent"),
    "comm": spec("123z", "check-order nocheck-order output-delimiter= total zero-terminated"),
    "basename": spec("as:z", "multiple suffix= zero"),
    "dirname": spec("z", "zero"),
    "realpath": spec("eLmPqsz", "canonicalize-existing canonicalize-missing relative-to= relative-base= quiet strip"
                     " no-symlinks zero logical physical"),
    "readlink": spec("efmnqsvz", "canonicalize canonicalize-existing canonicalize-missing no-newline quiet silent"
                     " verbose zero"),
    "seq": spec("f:s:w", "equal-width format= separator=", numeric=True),
    "nl": spec("h:b:f:v:i:pl:s:w:n:d:", "header-numbering= body-numbering= footer-numbering= starting-line-number="
               " line-increment= no-renumber join-blank-lines= number-separator= number-width= number-format="
               " section-delimiter="),
    "tac": spec("brs:", "before regex separator="),
    "rev": spec("hV"),
    "md5sum": _DIGEST, "sha1sum": _DIGEST, "sha224sum": _DIGEST, "sha256sum": _DIGEST, "sha384sum": _DIGEST,
    "sha512sum": _DIGEST,
    "cksum": spec("a:l:bctwz", "length= check ignore-missing quiet status warn strict tag zero algorithm= debug"
                  " untagged", deny="c check: reads the names of the files to open from a file"),
    "printenv": spec("0", "null"),
    "sleep": spec(), "whoami": spec(), "groups": spec(),
    "nproc": spec("", "all ignore="),
    "tty": spec("s", "silent quiet"),
    "id": spec("agnruzGZ", "context group groups name real user zero"),
    "uname": spec("asnrvmpio", "all kernel-name sysname nodename kernel-release release kernel-version machine"
                  " processor hardware-platform operating-system"),
    "uptime": spec("hpsV", "pretty since"),
    "locale": spec("ackmv", "all-locales charmaps category-name keyword-name verbose usage"),
    "hostname": spec("aAdfiIsbF:y", "alias all-fqdns domain fqdn long ip-address all-ip-addresses short boot file="
                     " yp nis", deny="b boot F file y yp nis: sets the host or domain name"),
    "which": spec("a", abbrev=False),
    "pwd": spec("LP"),
    "type": spec("afptP"),
    "fold": spec("bsw:" + _DIGITS_OPTIONAL, "bytes spaces width="),
    "expand": spec("it:" + _DIGITS_OPTIONAL, "tabs= initial"),
    "unexpand": spec(",0123456789at:", "tabs= all first-only"),
    "paste": spec("d:sz", "serial delimiters= zero-terminated"),
    "join": spec("a:e:i1:2:j:o:t:v:z", "ignore-case check-order nocheck-order zero-terminated header"),
    "fmt": spec("0123456789cstuw:p:g:", "crown-margin prefix= split-only tagged-paragraph uniform-spacing width="
                " goal="),
    "od": spec("A:aBbcDdeFfHhIij:LlN:OoS:st:vw::Xx", "skip-bytes= address-radix= read-bytes= format="
               " output-duplicates strings? traditional width? endian="),
    "hexdump": spec("bcdovxCLhVe:f:n:s:", "one-byte-octal one-byte-char canonical two-bytes-decimal two-bytes-octal"
                    " two-bytes-hex color? format= format-file= length= skip= no-squeezing",
                    paths="f format-file"),
    "strings": spec("adfowhHvV0123456789e:n:s:t:T:U:", "all data print-file-name bytes= radix= include-all-whitespace"
                    " target= encoding= unicode= output-separator="),
    "column": spec("detxJLhVc:i:l:n:o:p:r:s:E:H:N:O:R:T:W:",
                   "table table-name= table-order= table-columns= table-columns-limit= table-noextreme="
                   " table-noheadings table-header-repeat table-hide= table-right= table-truncate= table-wrap="
                   " keep-empty-lines json tree= tree-id= tree-parent= output-width= output-separator= separator="
                   " fillrows"),
    "getconf": spec("av:", abbrev=False),
    # not installed everywhere; their own parsers take no abbreviations
    "rg": spec("iSswxvnNlcFHpuU0LaoqbIhV.e:f:g:t:T:A:B:C:m:r:d:j:E:M:z",
               "ignore-case smart-case case-sensitive word-regexp line-regexp invert-match line-number"
               " no-line-number files-with-matches files-without-match count count-matches fixed-strings"
               " with-filename no-filename heading no-heading hidden no-ignore no-ignore-vcs follow text"
               " only-matching quiet byte-offset files type-list json null column vimgrep trim multiline"
               " unrestricted sort= sortr= regexp= file= glob= iglob= type= type-not= after-context= before-context="
               " context= max-count= replace= max-depth= threads= encoding= max-columns= color= colors= pre="
               " pre-glob= search-zip hostname-bin=",
               deny="z search-zip pre pre-glob hostname-bin: runs programs", paths="f file", recursive=True,
               follow="L follow", abbrev=False),
    "tree": spec("adlfxiqNQpugshDFvtcUrnCASJXL:P:I:o:H:T:R", "noreport dirsfirst filesfirst du si prune matchdirs"
                 " ignore-case inodes device charset= filelimit= timefmt= sort= gitignore fromfile",
                 deny="o: writes its output to a file; R: writes files; fromfile: reads a listing from a file",
                 recursive=True, follow="l", abbrev=False),
}
READ_ONLY = frozenset(SPECS) | {"find", "xxd", "jq", "echo", "printf", "test", "[", "cd", "true", "false"}


@dataclass
class Judgment:
    problems: list[str] = field(default_factory=list)  # each makes the command ask
    recursive: bool = False  # reads folders recursively
    follows: bool = False  # ... following symbolic links
    starts: list[Word] = field(default_factory=list)  # where it recurses from (none given: the working folder)
    paths: list[Word] = field(default_factory=list)  # option arguments that are files it reads
    inner: list[list[Word]] = field(default_factory=list)  # commands it runs (find -exec …)
    deletes: bool = False  # find -delete: judged like rm -r on its starting points
    getopt: bool = True  # options are parsed GNU-style: "--" ends them, globs before it may become options
    options_end: int = -1  # index in args of the "--" that ended the options (-1: none)


@dataclass
class Parsed:
    options: list[tuple[str, Word | None]] = field(default_factory=list)
    operands: list[Word] = field(default_factory=list)


def parse(s: Spec, args: list[Word], out: Judgment) -> Parsed:
    """Read ``args`` as GNU getopt_long would with spec ``s``; unknown and dangerous options go to out.problems."""
    parsed = Parsed()
    i = 0
    while i < len(args):
        w, t = args[i], args[i].text
        i += 1
        if out.options_end >= 0 or t == "-" or not t.startswith("-") or (
                s.numeric and re.fullmatch(r"-\.?\d.*", t)):
            parsed.operands.append(w)
            continue
        if t == "--":
            out.options_end = i - 1
            continue
        if t.startswith("--"):
            name, eq, _ = t[2:].partition("=")
            key = _long(s, name)
            if key is None:
                out.problems.append(f"an option it does not list as read-only ({t.split('=')[0]})")
                continue
            value = w.tail(3 + len(name)) if eq else None
            if s.long[key] == "=" and not eq:
                value = args[i] if i < len(args) else None
                i += 1
            _option(s, key, value, t, parsed, out)
            continue
        j = 1
        while j < len(t):
            c = t[j]
            if c not in s.short:
                out.problems.append(f"an option it does not list as read-only (-{c})")
                break
            kind = s.short[c]
            if kind:
                value = w.tail(j + 1) if j + 1 < len(t) else None
                if kind == ":" and value is None:
                    value = args[i] if i < len(args) else None
                    i += 1
                _option(s, c, value, t, parsed, out)
                break
            _option(s, c, None, t, parsed, out)
            j += 1
    return parsed


def _long(s: Spec, name: str) -> str | None:
    if name in s.long:
        return name
    if not s.abbrev or not name:
        return None
    candidates = [n for n in s.long if n.startswith(name)]
    dangerous = [n for n in candidates if n in s.deny]
    return (dangerous or candidates or [None])[0]


def _option(s: Spec, key: str, value: Word | None, text: str, parsed: Parsed, out: Judgment) -> None:
    shown = f"-{key}" if len(key) == 1 else f"--{key}"
    if key in s.deny:
        given = text.split("=")[0]
        out.problems.append(f"{shown} {s.deny[key]}" + ("" if given.startswith(shown) else f" ({given} is {shown})"))
    if key in s.paths and value is not None:
        out.paths.append(value)
    if key in s.recurse:
        out.recursive = True
    if key in s.follow:
        out.follows = True
    parsed.options.append((key, value))


# ---------------------------------------------------------------- the commands


def judge(name: str, args: list[Word]) -> Judgment:
    """What a read-only command does with these arguments (see the module doc)."""
    out = Judgment()
    special = _SPECIAL.get(name)
    if special is not None:
        special(args, out)
        return out
    s = SPECS[name]
    parsed = parse(s, args, out)
    keys = {k for k, _ in parsed.options}
    out.recursive = out.recursive or s.recursive
    operands = parsed.operands
    if name in ("grep", "egrep", "fgrep", "rg"):
        if name != "rg" and any(k in ("d", "directories") for k in keys):
            values = [v.text for k, v in parsed.options if k in ("d", "directories") and v is not None]
            out.recursive = "r" in keys or "R" in keys or "recursive" in keys or "dereference-recursive" in keys or any(
                v not in ("read", "skip") for v in values)
        if not keys & {"e", "f", "regexp", "file"}:
            operands = operands[1:]  # the pattern
    elif name == "uniq" and len(operands) > 1:
        out.problems.append("uniq writes its second file operand")
    elif name == "date" and any(not w.text.startswith("+") for w in operands):
        out.problems.append("date with an operand that is not +FORMAT sets the clock")
    elif name == "hostname" and operands:
        out.problems.append("hostname NAME sets the host name")
    elif name == "strings" and any(w.text.startswith("@") for w in args):
        out.problems.append("strings reads more options from an @file")
    elif name == "ls" and out.follows and not out.recursive:
        out.follows = False
    elif name == "diff" and "no-dereference" in keys:
        out.follows = False
    out.starts = operands
    return out


def _builtin_any(args: list[Word], out: Judgment) -> None:
    out.getopt = False  # echo, true, false: every word is printed or ignored


def _printf(args: list[Word], out: Judgment) -> None:
    out.getopt = False
    first = args[0].text if args else ""
    if first.startswith("-") and first != "--":
        out.problems.append("printf -v assigns a variable (a subscript in it runs commands)" if first == "-v"
                            else f"an option it does not list as read-only ({first})")


def _test(args: list[Word], out: Judgment) -> None:
    out.getopt = False
    if any(w.text == "-v" for w in args):
        out.problems.append("test -v evaluates an array subscript, which can run commands")


def _cd(args: list[Word], out: Judgment) -> None:
    parse(spec("LPe@"), args, out)


_FIND_GLOBAL = {"-H": 0, "-L": 0, "-P": 0, "-D": 1}
_FIND_SAFE = {
    **dict.fromkeys("-depth -d -follow -mount -xdev -noleaf -ignore_readdir_race -noignore_readdir_race -daystart"
                    " -nowarn -warn -help --help -version --version -true -false -empty -executable -readable"
                    " -writable -nouser -nogroup -print -print0 -ls -prune -quit -not -a -and -o -or ! ( ) ,".split(),
                    0),
    **dict.fromkeys("-maxdepth -mindepth -regextype -amin -atime -cmin -ctime -mmin -mtime -used -anewer -cnewer"
                    " -newer -fstype -gid -group -uid -user -ilname -iname -inum -ipath -iregex -iwholename -links"
                    " -lname -name -path -perm -regex -size -type -xtype -wholename -samefile -context -printf".split(),
                    1),
}
_FIND_FILE_ARGS = {"-anewer", "-cnewer", "-newer", "-samefile"}
_FIND_DENY = {"-delete": 0, "-fprint": 1, "-fprint0": 1, "-fprintf": 2, "-fls": 1, "-files0-from": 1}
_FIND_RUN = ("-exec", "-execdir", "-ok", "-okdir")
_NEWER_XY = re.compile(r"^-newer[aBcm][aBcmt]$")


def _find(args: list[Word], out: Judgment) -> None:
    """find [-H|-L|-P] [-D opts] [-Olevel] [start…] [expression]: predicates are exact (no abbreviations)."""
    out.recursive, out.getopt = True, False
    i = 0
    while i < len(args) and (args[i].text in _FIND_GLOBAL or re.fullmatch(r"-O\d*", args[i].text)):
        if args[i].text == "-L":
            out.follows = True
        i += 1 + _FIND_GLOBAL.get(args[i].text, 0)
    while i < len(args) and not (args[i].text.startswith("-") or args[i].text in ("(", "!")):
        out.starts.append(args[i])
        i += 1
    while i < len(args):
        t = args[i].text
        if t in _FIND_RUN:
            inner = []
            i += 1
            while i < len(args) and args[i].text not in (";", "+"):
                inner.append(args[i])
                i += 1
            out.inner.append(inner)
            out.problems.append(f"find {t} runs a command")
            if inner and inner[0].text.rsplit("/", 1)[-1] in ("rm", "rmdir", "unlink", "shred"):
                out.deletes = True  # find … -exec rm {} deletes what it finds, as -delete does
        elif t in _FIND_DENY:
            out.problems.append(f"find {t} " + ("deletes files" if t == "-delete" else "writes or reads file lists"))
            out.deletes = out.deletes or t == "-delete"
            i += _FIND_DENY[t]
        elif t in _FIND_SAFE or _NEWER_XY.match(t):
            count = _FIND_SAFE.get(t, 1)
            if t == "-follow":
                out.follows = True
            if (t in _FIND_FILE_ARGS or (_NEWER_XY.match(t) and not t.endswith("t"))) and i + 1 < len(args):
                out.paths.append(args[i + 1])
            i += count
        else:
            out.problems.append(f"a find predicate it does not list as read-only ({t})")
        i += 1


_XXD_FLAGS = {"a", "autoskip", "b", "bits", "C", "capitalize", "d", "e", "E", "EBCDIC", "h", "help", "i", "include",
              "p", "ps", "postscript", "plain", "r", "revert", "u", "uppercase", "v", "version"}
_XXD_VALUES = {"c": "cols", "g": "groupsize", "l": "len", "n": "name", "o": "offset", "s": "seek", "R": ""}


def _xxd(args: list[Word], out: Judgment) -> None:
    """xxd [options] [infile [outfile]]: options end at the first operand; a second operand is written."""
    out.getopt = False
    i, operands = 0, []
    while i < len(args):
        t = args[i].text
        if operands or not t.startswith("-") or t == "-":
            operands.append(args[i])
            i += 1
            continue
        body = t[2:] if t.startswith("--") else t[1:]
        if body in _XXD_FLAGS:
            i += 1
            continue
        letter = body[:1]
        if letter in _XXD_VALUES and body in (letter, _XXD_VALUES[letter]):
            i += 2  # the value is the next word
        elif letter in _XXD_VALUES and re.fullmatch(r"[-+]?\d\w*", body[1:]):
            i += 1  # glued value: -c16
        else:
            out.problems.append(f"an xxd option it does not list as read-only ({t})")
            return
    if len(operands) > 1:
        out.problems.append("xxd writes its second file operand")
    if any(w.text == "-" for w in operands):
        out.problems.append("xxd with - as a file operand")


_JQ_SHORT = set("srjacCMSnReh")
_JQ_LONG = {"slurp": 0, "raw-output": 0, "join-output": 0, "ascii-output": 0, "compact-output": 0, "color-output": 0,
            "monochrome-output": 0, "sort-keys": 0, "null-input": 0, "raw-input": 0, "exit-status": 0, "help": 0,
            "version": 0, "tab": 0, "indent": 1, "unbuffered": 0, "stream": 0, "stream-errors": 0, "seq": 0,
            "arg": 2, "argjson": 2, "slurpfile": 2, "rawfile": 2, "argfile": 2, "args": 0, "jsonargs": 0,
            "raw-output0": 0}
_JQ_MODULES = re.compile(r"\b(import|include|modulemeta|get_search_list)\b")


def _jq(args: list[Word], out: Judgment) -> None:
    """jq: its own option parser (exact long names, short letters anywhere in a cluster); modules read files."""
    out.getopt = False
    i, program = 0, None
    while i < len(args):
        t = args[i].text
        if t.startswith("--") and len(t) > 2:
            count = _JQ_LONG.get(t[2:])
            if count is None:
                out.problems.append(f"a jq option it does not list as read-only ({t})")
                return
            if t[2:] in ("slurpfile", "rawfile", "argfile") and i + 2 < len(args):
                out.paths.append(args[i + 2])
            i += 1 + count
            continue
        if t.startswith("-") and len(t) > 1:
            if not set(t[1:]) <= _JQ_SHORT:
                out.problems.append(f"a jq option it does not list as read-only ({t}): -f and -L read programs")
                return
        elif program is None:
            program = args[i]
        i += 1
    if program is not None and _JQ_MODULES.search(program.text):
        out.problems.append("a jq program that loads modules or data files (import, include)")


_GIT_READ = frozenset({"status", "log", "diff", "show"})
_GIT_DENY = ("output", "output-directory", "ext-diff", "textconv", "show-signature", "open-files-in-pager", "exec",
             "run", "upload-pack", "receive-pack")


def git(args: list[Word]) -> Judgment:
    """git status|log|diff|show with options that neither write (--output) nor run programs (--ext-diff …)."""
    out = Judgment(getopt=False)
    if not args:
        out.problems.append("`git` without a subcommand")
        return out
    if args[0].text.startswith("-"):
        out.problems.append("git with global options (-c, -C, --git-dir …)")
        return out
    sub = args[0].text
    if sub not in _GIT_READ:
        out.problems.append(f"`git {sub}` changes the repository or uses the network")
        return out
    if sub == "diff":  # outside a repository (or with --no-index) it compares folders, recursively
        out.recursive = True
        out.starts = [w for w in args[1:] if not w.text.startswith("-")]
    for w in args[1:]:
        t = w.text
        if t == "--":
            break
        name = t[2:].split("=", 1)[0]
        if t.startswith("--") and name and any(d.startswith(name) or name.startswith(d) for d in _GIT_DENY) and not (
                name.startswith("output-indicator") or name.startswith("no-")):
            out.problems.append(f"git {sub} {t.split('=')[0]} writes files or runs programs")
        elif re.fullmatch(r"-[^-]*[oO].*", t) and not re.fullmatch(r"-[nUl]\d+|-[SGL].*", t):
            out.problems.append(f"git {sub} {t} (-o writes a file, -O reads an order file)")
    return out


_SPECIAL = {"echo": _builtin_any, "true": _builtin_any, "false": _builtin_any, "printf": _printf, "test": _test,
            "[": _test, "find": _find, "xxd": _xxd, "jq": _jq, "cd": _cd}
