"""Tests for services/gateway/slack/render.py: Markdown to mrkdwn, splitting, the plain reading."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.markup.split import utf16_len
from services.gateway.slack.render import (
    DEFAULT_PART_LIMIT,
    split_parts,
    escape,
    split_mrkdwn,
    to_mrkdwn,
    to_plain,
)

ZWSP = "\u200b"
_LINK_TOKEN = re.compile(r"<(?:https?|mailto):[^\s<>|`]+(?:\|[^<>|\n]+)?>")
_MENTION_TOKEN = re.compile(r"<(?:@[UW]|#[CG])[A-Z0-9]{2,}(?:\|[^<>|&\n]*)?>")
_BROADCAST_TOKEN = re.compile(
    r"<!(?:here|channel|everyone|subteam\^S[A-Z0-9]{2,})(?:\|[^<>|&\n]*)?>"
)
_ENTITY = re.compile(r"&(?:amp|lt|gt);")
_ANY_TOKEN = re.compile(r"<[^<>\n]*>")
_CODE_SPAN = re.compile(r"(?<!`)`[^`\s](?:[^`\n]*[^`\s])?`(?!`)")
# An independent statement of the pairing rule to_mrkdwn writes for: a marker pair round content
# with no space at its ends and no word character or marker just outside.
_PAIRS = tuple(
    re.compile(rf"(?<![\w*~]){m}(?=[^\s{m}])(.+?)(?<=[^\s{m}]){m}(?![\w*~])")
    for m in (r"\*", "_", "~")
)


def problems(
    mrkdwn: str, mentions: bool = False, broadcasts: bool = False
) -> list[str]:
    """Empty when every <, > and & is syntax Slack should act on, and every fence is closed."""
    found = []
    rest = _LINK_TOKEN.sub("", mrkdwn)
    if mentions:
        rest = _MENTION_TOKEN.sub("", rest)
    if broadcasts:
        rest = _BROADCAST_TOKEN.sub("", rest)
    rest = re.sub(r"(?m)^> ", "", rest)  # the quote marker
    rest = _ENTITY.sub("", rest)
    for ch in "<>&":
        if ch in rest:
            found.append(f"raw {ch!r} in {rest!r}")
    if mrkdwn.count("```") % 2:
        found.append("unbalanced fence")
    for line in mrkdwn.split("\n"):
        if "```" in line and line != "```":
            found.append(f"fence inside a line: {line!r}")
    return found


def lone_markers(mrkdwn: str) -> str:
    """The * _ ~ left in prose once code, links and every pair Slack would format are taken out."""
    prose = "".join(mrkdwn.split("```")[::2])
    left = []
    for line in prose.split("\n"):
        line = _CODE_SPAN.sub("\ufffc", _ANY_TOKEN.sub("\ufffc", line))
        previous = None
        while previous != line:
            previous = line
            for pair in _PAIRS:
                line = pair.sub(r"\1", line)
        left.append("".join(ch for ch in line if ch in "*_~"))
    return "".join(left)


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def reading(mrkdwn: str) -> str:
    """The plain reading without whitespace or quote marks (a quoted line cut in two is quoted
    twice): what a split must not change."""
    return squash(re.sub(r"(?m)^> ", "", to_plain(mrkdwn)))


# --- to_mrkdwn: a table of conversions --------------------------------------------------------

CONVERSIONS = [
    ("plain text", "plain text"),
    ("**bold**", "*bold*"),
    ("__bold__", "*bold*"),
    ("*italic* and _italic_", "_italic_ and _italic_"),
    ("~~gone~~", "~gone~"),
    ("***both***", "*_both_*"),
    ("**bold _and italic_**", "*bold _and italic_*"),
    ("use `x < y && z`", "use `x &lt; y &amp;&amp; z`"),
    ("`**not bold**`", "`**not bold**`"),
    ("``a ` b``", "a ` b"),  # mrkdwn code cannot hold a backtick: written as text
    ("```\nplain <code> & more\n```", "```\nplain &lt;code&gt; &amp; more\n```"),
    ("```python\nif a < b:\n    pass\n```", "```\nif a &lt; b:\n    pass\n```"),
    ("```\nunclosed\nfence", "```\nunclosed\nfence\n```"),
    ("```\n\n```", ""),
    ("```\nshow ``` here\n```", f"```\nshow ``{ZWSP}` here\n```"),
    ("a ``` b", f"a ``{ZWSP}` b"),
    ("*````*``", f"_``{ZWSP}``_``"),  # runs written apart must not meet as a fence
    ("**```*```", f"*``{ZWSP}``{ZWSP}`{ZWSP}`"),
    ("[site](https://example.com/a_b)", "<https://example.com/a_b|site>"),
    ("[q](https://x.io/?a=1&b=2)", "<https://x.io/?a=1&amp;b=2|q>"),
    ("[pipe](https://x.io/a|b)", "<https://x.io/a%7Cb|pipe>"),
    ("[a | b > c](https://x.io)", "<https://x.io|a \uff5c b &gt; c>"),
    ("[**bold** link](http://a.b)", "<http://a.b|bold link>"),
    ("[mail](mailto:a@b.c)", "<mailto:a@b.c|mail>"),
    ("[click](javascript:alert(1))", "click"),
    ("[img](data:text/html,hi)", "img"),
    ("[file](file:///etc/passwd)", "file"),
    ("[rel](/relative/path)", "rel"),
    ("see https://example.com/a_b.", "see <https://example.com/a_b>."),
    ("(https://example.com/x)", "(<https://example.com/x>)"),
    ("https://x.com/?a=1&b=2", "<https://x.com/?a=1&amp;b=2>"),
    ("**https://x.com/x/**", "*<https://x.com/x/>*"),
    ("<https://auto.example/x>", "<https://auto.example/x>"),
    ("<javascript:alert(1)>", "&lt;javascript:alert(1)&gt;"),
    ("# Heading", "*Heading*"),
    ("### Deep *one* ###", "*Deep _one_*"),
    ("## **Already bold**", "*Already bold*"),
    ("- one\n- two\n  * nested\n+ three", "• one\n• two\n  • nested\n• three"),
    ("1. first\n2. second", "1. first\n2. second"),
    ("> quoted *text*\n> second", "> quoted _text_\n> second"),
    ("> a\n>\n> b", "> a\n> b"),
    ("para one\n\n\n\npara two", "para one\n\npara two"),
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("&amp; stays literal", "&amp;amp; stays literal"),
    ("2*3*4", "2*3*4"),
    ("snake_case_name", "snake_case_name"),
    ("a * b * c", "a * b * c"),
    ("foo**bar**baz", "foobarbaz"),  # Slack does not format inside a word
    ("**a*b**", "a*b"),  # a * inside would close *bold* early
    ("**a** **b**", "*a* *b*"),
    ("**unclosed bold", "**unclosed bold"),
    ("`unclosed code", "`unclosed code"),
    ("[not a link]", "[not a link]"),
    (r"\*literal\* \<b\>", "*literal* &lt;b&gt;"),
    ("emoji 😀 **𝔘**", "emoji 😀 *𝔘*"),
    ("line\r\nbreaks\rhere", "line\nbreaks\nhere"),
    ("", ""),
]


@pytest.mark.parametrize(("markdown", "expected"), CONVERSIONS)
def test_to_mrkdwn_conversions(markdown: str, expected: str) -> None:
    assert expected == to_mrkdwn(markdown)


@pytest.mark.parametrize(("markdown", "expected"), CONVERSIONS)
def test_conversion_table_outputs_are_valid(markdown: str, expected: str) -> None:
    assert [] == problems(to_mrkdwn(markdown))


# --- mentions ---------------------------------------------------------------------------------

MENTIONS = "hi <@U024BE7LH> in <#C024BE7LR|general>, " + (
    "<!here> <!channel> <!everyone> <!subteam^SAZ94GDB8>"
)


def test_mentions_are_escaped_by_default() -> None:
    assert escape(MENTIONS) == to_mrkdwn(MENTIONS)


def test_mentions_flag_passes_users_and_channels_only() -> None:
    expected = (
        "hi <@U024BE7LH> in <#C024BE7LR|general>, &lt;!here&gt; &lt;!channel&gt; "
        "&lt;!everyone&gt; &lt;!subteam^SAZ94GDB8&gt;"
    )
    assert expected == to_mrkdwn(MENTIONS, mentions=True)


def test_broadcasts_flag_passes_special_mentions_only() -> None:
    expected = (
        "hi &lt;@U024BE7LH&gt; in &lt;#C024BE7LR|general&gt;, <!here> <!channel> <!everyone> "
        "<!subteam^SAZ94GDB8>"
    )
    assert expected == to_mrkdwn(MENTIONS, broadcasts=True)


def test_both_flags_pass_everything_through() -> None:
    assert MENTIONS == to_mrkdwn(MENTIONS, mentions=True, broadcasts=True)


@pytest.mark.parametrize(
    "text",
    [
        "<@bob>",
        "<#general>",
        "<!date^1392734382^{date}|Feb 18>",
        "<@U1&x>",
        "<!here|a<b>",
    ],
)
def test_malformed_or_other_syntax_is_escaped_even_when_allowed(text: str) -> None:
    assert [] == problems(to_mrkdwn(text, mentions=True, broadcasts=True))
    assert "<" not in to_mrkdwn(text, mentions=True, broadcasts=True)


def test_mentions_in_code_stay_code() -> None:
    assert "`&lt;!channel&gt;`" == to_mrkdwn("`<!channel>`", broadcasts=True)


def test_mentions_in_link_text_are_text() -> None:
    assert "<https://x.io|&lt;@U024BE7LH&gt;>" == to_mrkdwn(
        "[<@U024BE7LH>](https://x.io)", mentions=True
    )


# --- escape / to_plain ------------------------------------------------------------------------


def test_escape_touches_only_the_three_control_characters() -> None:
    assert "a &amp; b &lt;c&gt; \"d\" 'e' |f|" == escape("a & b <c> \"d\" 'e' |f|")


def test_to_plain_reads_what_slack_shows() -> None:
    mrkdwn = (
        "*bold* _it_ ~gone~ `a &lt; b` <https://x.io?a=1&amp;b=2|site> <https://y.io> "
        "<@U1|bob> <#C2|general> <!here> &amp; 2*3*4\n```\nx &gt; y\n```"
    )
    assert (
        "bold it gone a < b site (https://x.io?a=1&b=2) https://y.io @bob #general @here & 2*3*4\n"
        "x > y" == to_plain(mrkdwn)
    )


def test_to_plain_undoes_the_added_zero_width_spaces() -> None:
    assert "a ``` b" == to_plain(to_mrkdwn("a ``` b"))


# --- to_mrkdwn: properties over arbitrary text ------------------------------------------------

PIECES = st.sampled_from(
    [
        "*",
        "**",
        "_",
        "__",
        "~",
        "~~",
        "`",
        "```",
        "```py\n",
        "\n```\n",
        "[",
        "]",
        "(",
        ")",
        "|",
        "[a](https://x.y/?q=1&r=2)",
        "[b|c>](https://x.y)",
        "[b](javascript:x)",
        "<https://x.y/z>",
        "<@U024BE7LH>",
        "<!channel>",
        "<#C024BE7LR|general>",
        "> ",
        "\n> ",
        "- ",
        "1. ",
        "# ",
        "\\",
        "<",
        ">",
        "&",
        "&amp;",
        "&lt;",
        '"',
        " ",
        "\n",
        "\n\n",
        "http://a_b_c.d/*x*",
        "https://e.f/(g)",
        "😀",
        "👍🏽",
        "🇺🇸",
        "𝔘",
        "é",
        "e\u0301",
        "word",
        "snake_case",
        "\u200b",
    ]
)
MARKDOWNISH = st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=60).map("".join)


@settings(deadline=None, max_examples=200)
@given(MARKDOWNISH, st.booleans(), st.booleans())
def test_to_mrkdwn_output_is_always_valid(
    markdown: str, mentions: bool, broadcasts: bool
) -> None:
    assert [] == problems(
        to_mrkdwn(markdown, mentions=mentions, broadcasts=broadcasts),
        mentions,
        broadcasts,
    )


@settings(deadline=None, max_examples=100)
@given(
    st.text(
        alphabet=st.characters(
            blacklist_characters="*_~`[\\>#-+<\n\r", blacklist_categories=["Cs"]
        ),
        max_size=200,
    )
)
def test_to_mrkdwn_keeps_text_without_markup_characters(text: str) -> None:
    assert text.strip() == to_plain(to_mrkdwn(text)).strip()


WORDS = st.sampled_from(
    ["alpha", "beta", "gamma", "𝔘nicode", "x<y", "a&b", "1.5", "über"]
)
SPANS = st.one_of(
    WORDS,
    WORDS.map(lambda w: f"**{w}**"),
    WORDS.map(lambda w: f"__{w}__"),
    WORDS.map(lambda w: f"*{w}*"),
    WORDS.map(lambda w: f"_{w}_"),
    WORDS.map(lambda w: f"~~{w}~~"),
    WORDS.map(lambda w: f"`{w}`"),
    WORDS.map(lambda w: f"***{w} {w}***"),
    WORDS.map(lambda w: f"**{w} *{w}* {w}**"),
    WORDS.map(lambda w: f"[{w}](https://e.x/{w})"),
    st.just("https://e.x/a_b_c "),
)
SEPARATORS = st.sampled_from([" ", ", ", " (", ") ", "\n", "\n\n", " -", ". "])
BLOCKS = st.one_of(
    st.lists(st.tuples(SPANS, SEPARATORS), max_size=12).map(
        lambda pairs: "".join(span + sep for span, sep in pairs)
    ),
    st.lists(st.tuples(SPANS, st.just(" ")), min_size=1, max_size=12).map(
        lambda pairs: "> " + "".join(span + sep for span, sep in pairs)
    ),
    st.lists(WORDS, min_size=1, max_size=12).map(
        lambda ws: "```\n" + " ".join(ws) + "\n```"
    ),
)
WELL_FORMED = st.lists(BLOCKS, max_size=4).map("\n\n".join)


@settings(deadline=None, max_examples=150)
@given(WELL_FORMED, st.integers(64, 300))
def test_well_formed_emphasis_never_leaves_a_lone_marker(
    markdown: str, limit: int
) -> None:
    mrkdwn = to_mrkdwn(markdown)
    assert "" == lone_markers(mrkdwn), mrkdwn
    assert [] == problems(mrkdwn)
    parts = check_parts(mrkdwn, limit)
    for part in parts:  # spans cut by a break are closed and reopened
        assert "" == lone_markers(part), part
    assert reading(expected_text(mrkdwn, limit)) == "".join(reading(p) for p in parts)


# --- split_mrkdwn: examples -------------------------------------------------------------------


def test_never_splits_an_entity() -> None:
    parts = split_mrkdwn("&amp;" * 100, 52)
    assert all(_ENTITY.sub("", p) == "" for p in parts)
    assert 100 == sum(p.count("&amp;") for p in parts)


def test_never_splits_a_link_or_mention() -> None:
    text = " ".join(["<https://example.com/path|a link>", "<@U024BE7LH>"] * 30)
    parts = split_mrkdwn(text, 60)
    assert len(parts) > 1
    for part in parts:
        assert _ANY_TOKEN.sub("", part).count("<") == 0
        assert _ANY_TOKEN.sub("", part).count(">") == 0
    assert squash(text) == squash("".join(parts))


def test_a_link_too_long_for_any_part_is_shown_as_text() -> None:
    link = "<https://example.com/" + "p" * 100 + "|text>"
    parts = split_mrkdwn(link, 50)
    assert all("<" not in p and ">" not in p for p in parts)
    assert escape(link[1:-1]).join(["&lt;", "&gt;"]) == "".join(parts)


def test_code_block_is_closed_and_reopened() -> None:
    code = "\n".join(f"    line {n:03d} & < >" for n in range(40))
    text = to_mrkdwn(f"Intro.\n\n```\n{code}\n```\n\nOutro.")
    parts = split_mrkdwn(text, 200)
    assert len(parts) > 2
    for part in parts:
        assert len(part) <= 200
        assert 0 == part.count("```") % 2
    middle = parts[1:-1]
    assert all(p.startswith("```\n    line") and p.endswith("\n```") for p in middle)
    body = "\n".join(p.removeprefix("```\n").removesuffix("\n```") for p in middle)
    assert body in escape(code)  # whole lines, indentation kept


def test_code_break_never_leaves_an_empty_block() -> None:
    text = "```\n" + "\n".join("abcdefgh" * 3 for _ in range(6)) + "\n```"
    for limit in range(32, 80):
        for part in split_mrkdwn(text, limit):
            assert "```\n```" not in part
            assert part.strip("`\n") != ""


def test_unclosed_fence_is_closed_at_the_end() -> None:
    assert ["```\ncode"] != split_mrkdwn("```\ncode")
    assert ["```\ncode\n```"] == split_mrkdwn("```\ncode")


def test_long_unbroken_code_line_is_cut_and_fenced() -> None:
    parts = split_mrkdwn("```\n" + "x" * 200 + "\n```", 64)
    assert all(p.startswith("```\n") and p.endswith("\n```") for p in parts)
    assert "x" * 200 == "".join(p[4:-4] for p in parts)


def test_default_limit_suits_slack() -> None:
    text = to_mrkdwn(
        (
            "A sentence with **bold** and a [link](https://x.io/a?b=c&d=e). " * 20
            + "\n\n"
        )
        * 30
    )
    parts = split_mrkdwn(text)
    assert len(parts) > 5
    assert all(utf16_len(p) <= DEFAULT_PART_LIMIT for p in parts)


# --- split_mrkdwn: properties -----------------------------------------------------------------

REOPEN, CLOSE = "```\n", "\n```"


def expected_text(original: str, limit: int) -> str:
    """The original as split_mrkdwn keeps it: a <...> too long for any part becomes escaped text."""
    return _ANY_TOKEN.sub(
        lambda m: (
            m.group()
            if utf16_len(m.group()) <= limit - 10
            else f"&lt;{m.group()[1:-1]}&gt;"
        ),
        original,
    )


def _before_fence(text: str) -> str:
    """Whitespace before a fence as one space (a split may drop whitespace ending a code block)."""
    return re.sub(r"[ \t\n]+(?=```)", " ", text)


def added_markup(piece: str, *, head: bool) -> bool:
    """What a split may add round a part: a fence, or (before) "> " and open markers, or (after)
    their closers; at most one marker of each kind."""
    if piece == (REOPEN if head else CLOSE):
        return True
    if head:
        piece = piece.removeprefix("> ")
    return set(piece) <= set("`*_~") and len(set(piece)) == len(piece)


def assert_content_kept(original: str, carried: list[str]) -> None:
    """The text the parts carry is the original in order, less whitespace at the breaks (and
    whitespace that ends a code block, which a split may drop)."""
    original = _before_fence(original)
    pos = 0
    for piece in carried:
        piece = _before_fence(piece)
        at = original.find(piece, pos)
        assert at >= 0 and original[pos:at].strip() == "", (piece, original[pos:])
        pos = at + len(piece)
    assert original[pos:].strip() == ""


def fences(part: str) -> int:
    return _ANY_TOKEN.sub("\ufffc", part).count("```")


def check_parts(original: str, limit: int) -> list[str]:
    """Split `original` and check every promise split_mrkdwn makes; returns the parts."""
    parts = split_mrkdwn(original, limit)
    triples = [(p.head, p.body, p.tail) for p in split_parts(original, limit)]
    assert parts == ["".join(t) for t in triples]
    for part, (head, carried, tail) in zip(parts, triples):
        assert utf16_len(part) <= limit
        assert carried.strip() != ""
        assert added_markup(head, head=True) and added_markup(tail, head=False), (
            head,
            tail,
        )
        assert 0 == fences(part) % 2, part
        part.encode("utf-8")  # strict: no lone surrogate
    assert_content_kept(expected_text(original, limit), [t[1] for t in triples])
    return parts


LONG_MARKDOWN = st.lists(
    st.one_of(
        PIECES,
        st.text(max_size=40),
        st.sampled_from(["a" * 300, "😀" * 90, "word " * 60, "`" * 7]),
    ),
    max_size=150,
).map("".join)
LIMITS = st.one_of(st.integers(32, 120), st.integers(32, 1000))


@settings(deadline=None, max_examples=120)
@given(LONG_MARKDOWN, LIMITS, st.booleans())
def test_split_of_converted_markdown_fits_and_is_valid(
    markdown: str, limit: int, mentions: bool
) -> None:
    for part in check_parts(to_mrkdwn(markdown, mentions=mentions), limit):
        assert [] == problems(part, mentions), part


NASTY = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "```",
                "`",
                "<",
                ">",
                "&",
                "&amp;",
                "&#128512;",
                "<@U1>",
                "<a|b>",
                "\n",
                " ",
                "\t",
            ]
        ),
        st.text(max_size=30),
    ),
    max_size=120,
).map("".join)


@settings(deadline=None, max_examples=120)
@given(NASTY, LIMITS)
def test_split_of_any_text_fits_and_keeps_it(text: str, limit: int) -> None:
    check_parts(text, limit)
