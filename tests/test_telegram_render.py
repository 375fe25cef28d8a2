"""Tests for services/gateway/telegram/render.py: Markdown to Telegram HTML, splitting, plain fallback."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.markup.plain import split_plain
from services.gateway.markup.split import utf16_len
from services.gateway.telegram.render import split_html, to_html, to_plain

ALLOWED_TAGS = {"b", "i", "s", "code", "pre", "a", "blockquote"}
_MARKUP = re.compile(
    r'<(?:/?(?:b|i|s|code|pre|blockquote|a)|a href="[^"<>]*"|code class="language-[^"<>]*")>'
    r"|&(?:lt|gt|amp|quot|#x27);"
)


class _Checker(HTMLParser):
    """Records every problem that would make Telegram reject the HTML."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ALLOWED_TAGS:
            self.problems.append(f"tag {tag}")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"stray </{tag}> with open {self.stack}")
        else:
            self.stack.pop()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.problems.append(f"self-closing {tag}")

    def handle_comment(self, data: str) -> None:
        self.problems.append("comment")

    def handle_decl(self, decl: str) -> None:
        self.problems.append("declaration")


def problems(markup: str) -> list[str]:
    """Empty when `markup` is balanced, uses only allowed tags, and escapes all other <, >, &."""
    checker = _Checker()
    checker.feed(markup)
    checker.close()
    found = list(checker.problems)
    if checker.stack:
        found.append(f"unclosed {checker.stack}")
    leftover = _MARKUP.sub("", markup)
    if any(ch in leftover for ch in "<>&"):
        found.append(f"unescaped markup character in {leftover!r}")
    return found


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- to_html: a table of conversions ----------------------------------------------------------

CONVERSIONS = [
    ("plain text", "plain text"),
    ("**bold**", "<b>bold</b>"),
    ("__bold__", "<b>bold</b>"),
    ("*italic* and _italic_", "<i>italic</i> and <i>italic</i>"),
    ("~~gone~~", "<s>gone</s>"),
    ("**bold *and italic***", "<b>bold <i>and italic</i></b>"),
    ("use `x < y && z`", "use <code>x &lt; y &amp;&amp; z</code>"),
    ("`` a ` b ``", "<code>a ` b</code>"),
    ("`**not bold**`", "<code>**not bold**</code>"),
    ("```\nplain <code>\n```", "<pre>plain &lt;code&gt;</pre>"),
    (
        "```python\nif a < b:\n    pass\n```",
        '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>',
    ),
    ("```\nunclosed\nfence", "<pre>unclosed\nfence</pre>"),
    ("[site](https://example.com/a_b)", '<a href="https://example.com/a_b">site</a>'),
    (
        '[q](https://x.io/?a=1&b="2")',
        '<a href="https://x.io/?a=1&amp;b=&quot;2&quot;">q</a>',
    ),
    ("[me](tg://user?id=42)", '<a href="tg://user?id=42">me</a>'),
    ("[mail](mailto:a@b.c)", '<a href="mailto:a@b.c">mail</a>'),
    ("[**bold** link](http://a.b)", '<a href="http://a.b"><b>bold</b> link</a>'),
    ("[click](javascript:alert(1))", "click"),
    ("[file](file:///etc/passwd)", "file"),
    ("[rel](/relative/path)", "rel"),
    (
        "> quoted *text*\n> second",
        "<blockquote>quoted <i>text</i>\nsecond</blockquote>",
    ),
    ("para one\n\n\n\npara two", "para one\n\npara two"),
    ("- one\n- two\n* three", "• one\n• two\n• three"),
    ("## Heading", "<b>Heading</b>"),
    ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
    ("2*3*4", "2*3*4"),
    ("snake_case_name", "snake_case_name"),
    ("a * b * c", "a * b * c"),
    ("**unclosed bold", "**unclosed bold"),
    ("`unclosed code", "`unclosed code"),
    ("[not a link]", "[not a link]"),
    (r"\*literal\*", "*literal*"),
    ("https://x.com/_a_b_", "https://x.com/_a_b_"),
    ("\"quotes\" & 'apostrophes'", "\"quotes\" &amp; 'apostrophes'"),
    ("emoji 😀 **𝔘**", "emoji 😀 <b>𝔘</b>"),
    ("", ""),
]


@pytest.mark.parametrize(("markdown", "expected"), CONVERSIONS)
def test_to_html_conversions(markdown: str, expected: str) -> None:
    assert expected == to_html(markdown)


@pytest.mark.parametrize(("markdown", "expected"), CONVERSIONS)
def test_conversion_table_outputs_are_valid(markdown: str, expected: str) -> None:
    assert [] == problems(to_html(markdown))


# --- to_html: properties over arbitrary text ----------------------------------------------------

PIECES = st.sampled_from(
    [
        "*",
        "**",
        "_",
        "__",
        "~~",
        "`",
        "```",
        "```py\n",
        "\n```\n",
        "[",
        "]",
        "(",
        ")",
        "[a](https://x.y/?q=1&r=2)",
        "[b](javascript:x)",
        "> ",
        "\n> ",
        "- ",
        "# ",
        "\\",
        "<",
        ">",
        "&",
        "&amp;",
        '"',
        "'",
        " ",
        "\n",
        "\n\n",
        "http://a_b_c.d/*x*",
        "😀",
        "👍🏽",
        "𝔘",
        "é",
        "word",
        "snake_case",
    ]
)
MARKDOWNISH = st.lists(st.one_of(PIECES, st.text(max_size=8)), max_size=60).map("".join)


@settings(deadline=None, max_examples=300)
@given(MARKDOWNISH)
def test_to_html_output_is_always_valid(markdown: str) -> None:
    assert [] == problems(to_html(markdown))


@settings(deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_characters="*_~`[\\>#-+\n\r"), max_size=200
    )
)
def test_to_html_keeps_text_without_markup_characters(text: str) -> None:
    assert text.strip() == to_plain(to_html(text)).strip()


# --- utf16_len / to_plain ---------------------------------------------------------------------


def test_utf16_len_counts_astral_characters_twice() -> None:
    assert (0, 1, 2, 4, 3) == tuple(
        utf16_len(s) for s in ("", "a", "😀", "👍🏽", "a😀")
    )


def test_to_plain_strips_tags_and_unescapes() -> None:
    assert 'a < b & "c" x' == to_plain(
        '<b>a &lt; b</b> &amp; &quot;c&quot; <a href="u">x</a>'
    )


# --- split_html / split_plain: examples --------------------------------------------------------


def test_never_splits_an_entity() -> None:
    parts = split_html("&amp;" * 100, 52)
    assert all(set(to_plain(p)) == {"&"} for p in parts)
    assert 100 == sum(len(to_plain(p)) for p in parts)


def test_reopens_tags_with_attributes() -> None:
    html = '<a href="https://example.com/x">' + "link words " * 20 + "</a>"
    parts = split_html(html, 80)
    assert len(parts) > 1
    for part in parts:
        assert part.startswith('<a href="https://example.com/x">')
        assert part.endswith("</a>")
        assert [] == problems(part)


def test_drops_a_tag_pair_too_large_to_repeat() -> None:
    html = '<a href="https://example.com/' + "p" * 100 + '">text</a>'
    assert ["text"] == split_html(html, 50)


def test_long_code_block_splits_into_valid_pre_parts() -> None:
    code = "\n".join(f"line {n:05d} = value_{n} * 2 < 3 & 4" for n in range(300))
    assert len(code) > 10_000
    html = to_html(f"```python\n{code}\n```")
    parts = split_html(html)
    assert len(parts) >= 3
    for part in parts:
        assert utf16_len(part) <= 4096
        assert part.startswith('<pre><code class="language-python">')
        assert part.endswith("</code></pre>")
        assert [] == problems(part)
    assert squash(code) == squash("".join(to_plain(p) for p in parts))


def test_single_unbroken_code_line_splits() -> None:
    html = to_html("```\n" + "x" * 10_000 + "\n```")
    parts = split_html(html)
    assert [4096, 4096] == [utf16_len(p) for p in parts[:2]]
    assert all(p.startswith("<pre>") and p.endswith("</pre>") for p in parts)
    assert "x" * 10_000 == "".join(to_plain(p) for p in parts)


# --- split_html / split_plain: properties ---------------------------------------------------

LONG_MARKDOWN = st.lists(st.one_of(PIECES, st.text(max_size=40)), max_size=300).map(
    "".join
)
LIMITS = st.one_of(st.integers(50, 300), st.integers(50, 4096))


@settings(deadline=None, max_examples=150)
@given(LONG_MARKDOWN, LIMITS)
def test_split_html_parts_fit_are_valid_and_keep_the_text(
    markdown: str, limit: int
) -> None:
    html = to_html(markdown)
    parts = split_html(html, limit)
    for part in parts:
        assert utf16_len(part) <= limit
        assert [] == problems(part)
        assert to_plain(part).strip() != ""
    assert squash(to_plain(html)) == squash("".join(to_plain(p) for p in parts))


@settings(deadline=None, max_examples=150)
@given(st.text(max_size=3000), LIMITS)
def test_split_plain_parts_fit_and_keep_the_text(text: str, limit: int) -> None:
    parts = split_plain(text, limit)
    for part in parts:
        assert utf16_len(part) <= limit
        assert part.strip() != ""
    assert squash(text) == squash("".join(parts))
