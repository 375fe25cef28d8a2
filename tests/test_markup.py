"""Tests for services/gateway/markup/: the document model, the one splitter under every renderer, plain text."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.markup import marks, plain
from services.gateway.markup import model as md
from services.gateway.markup.split import Atom, Measure, split, text_atoms, utf16_len
from services.gateway.slack import render as slack
from services.gateway.telegram import render as telegram
from services.gateway.whatsapp import render as whatsapp


class Renderer(NamedTuple):
    render: Callable[[str], str]
    atoms: Callable[[str, int], list[Atom]]
    measure: Measure
    visible: Callable[[str], str] = lambda text: text  # what a reader sees (a tag pair too long to repeat goes)


RENDERERS = {
    "telegram": Renderer(telegram.to_html, lambda text, limit: telegram.atoms(text), utf16_len, telegram.to_plain),
    "slack": Renderer(slack.to_mrkdwn, slack.atoms, utf16_len),
    "whatsapp": Renderer(whatsapp.to_whatsapp, lambda text, limit: marks.atoms(text, len), len),
    "plain": Renderer(plain.to_plain, lambda text, limit: plain.atoms(text), utf16_len),
}

PIECES = st.sampled_from([
    "*", "**", "_", "__", "~~", "`", "```", "```py\n", "\n```\n", "[", "]", "(", ")",
    "[a](https://x.y/?q=1&r=2)", "[b](javascript:x)", "<https://x.y/z>", "<@U024BE7LH>", "> ", "\n> ",
    "- ", "  * ", "# ", "\\", "<", ">", "&", "&amp;", " ", "\n", "\n\n", ". ", "http://a_b_c.d/*x*",
    "😀", "👍🏽", "🇺🇸", "👩\u200d👩\u200d👧", "e\u0301", "𝔘", "word", "snake_case", "words " * 12,
])
MARKDOWN = st.lists(st.one_of(PIECES, st.text(max_size=30)), max_size=150).map("".join)
LIMITS = st.one_of(st.integers(32, 120), st.integers(32, 1000))


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def clusters(text: str) -> list[str]:
    return [a.raw for a in text_atoms(text, len) if a.raw.strip()]  # a part of only whitespace (\x85 too) goes


@pytest.mark.parametrize("name", RENDERERS)
@settings(deadline=None, max_examples=120)
@given(markdown=MARKDOWN, limit=LIMITS)
def test_every_renderer_splits_within_the_limit_balanced_and_whole(name: str, markdown: str, limit: int) -> None:
    r = RENDERERS[name]
    atoms = r.atoms(r.render(markdown), limit)
    parts = split(atoms, limit, r.measure)
    carried = r.visible("".join(a.raw for a in atoms))
    for part in parts:
        text = str(part)
        assert r.measure(text) <= limit, text
        assert part.body.strip()
        text.encode("utf-16-le")  # strict: no half of a surrogate pair
        again = r.atoms(text, limit)  # tags, entities, pairs and fences balanced within the part
        assert text == "".join(a.raw for a in again)
        assert sum(a.kind == "open" for a in again) == sum(a.kind == "close" for a in again), text
    bodies = [r.visible(p.body) for p in parts]
    assert squash(carried) == squash("".join(bodies))  # nothing lost
    assert clusters(carried) == [c for body in bodies for c in clusters(body)]  # no cluster cut


@pytest.mark.parametrize("name", RENDERERS)
@settings(deadline=None, max_examples=60)
@given(markdown=MARKDOWN)
def test_every_renderers_output_reads_back_whole(name: str, markdown: str) -> None:
    r = RENDERERS[name]
    rendered = r.render(markdown)
    assert rendered == "".join(a.raw for a in r.atoms(rendered, 4096))


@pytest.mark.parametrize("name", RENDERERS)
def test_no_renderer_cuts_an_emoji_sequence(name: str) -> None:
    r = RENDERERS[name]
    family = "👩\u200d👩\u200d👧"  # 8 UTF-16 units, 5 code points
    parts = [p.body for p in split(r.atoms(r.render(family * 20), 36), 36, r.measure)]
    assert all(p.replace(family, "") == "" for p in parts), parts
    assert 20 == sum(p.count(family) for p in parts)


# --- the splitter ---------------------------------------------------------------------------------


def test_a_sentence_end_is_preferred_to_a_space() -> None:
    text = "First sentence here. Then more words follow on"
    assert ["First sentence here.", "Then more words follow on"] == plain.split_plain(text, 40)


def test_a_code_block_cut_keeps_its_indentation() -> None:
    html = telegram.to_html("```\n" + "\n".join(f"    indented line {n}" for n in range(20)) + "\n```")
    parts = telegram.split_html(html, 100)
    assert len(parts) > 2 and all(p.startswith("<pre>    indented") and p.endswith("</pre>") for p in parts)


def test_whatsapp_reopens_a_code_block_and_a_bold_span_across_parts() -> None:
    code = whatsapp.split_whatsapp(whatsapp.to_whatsapp("```\n" + "line\n" * 30 + "```"), 60)
    assert len(code) > 1 and all(p.startswith("```\n") and p.endswith("\n```") for p in code)
    bold = whatsapp.split_whatsapp(whatsapp.to_whatsapp("**" + "bold words " * 10 + "end**"), 40)
    assert len(bold) > 1 and all(p.startswith("*") and p.endswith("*") for p in bold), bold


SPLITTERS = {"telegram": telegram.split_html, "slack": slack.split_mrkdwn, "whatsapp": whatsapp.split_whatsapp,
             "plain": plain.split_plain}
UTF16 = ("telegram", "slack", "plain")


@pytest.mark.parametrize(("name", "text"), [("telegram", "<b>hi</b>"), ("slack", "*hi*"), ("whatsapp", "*hi*"),
                                            ("plain", "hi")])
def test_short_text_is_one_part(name: str, text: str) -> None:
    assert [text] == SPLITTERS[name](text)


@pytest.mark.parametrize("name", SPLITTERS)
def test_breaks_as_preferred(name: str) -> None:
    cut = SPLITTERS[name]
    assert ([], []) == (cut(""), cut(" \n\n "))
    text = "first paragraph here\n\nsecond one goes on and on"
    assert ["first paragraph here", "second one goes on and on"] == cut(text, 40)
    text = "alpha beta gamma delta\nepsilon zeta eta theta"
    assert ["alpha beta gamma delta", "epsilon zeta eta theta"] == cut(text, 36)
    text = "alpha beta gamma\ndelta epsilon zeta eta"  # an early line break loses to a late space
    assert ["alpha beta gamma\ndelta epsilon zeta", "eta"] == cut(text, 36)
    assert ["aaaa bbbb cccc dddd eeee ffff", "gggg"] == cut("aaaa bbbb cccc dddd eeee ffff gggg", 32)
    assert ["x" * 32, "x" * 32, "x" * 6] == cut("x" * 70, 32)  # a hard break without whitespace
    with pytest.raises(ValueError):
        cut("abc", 31)


@pytest.mark.parametrize("name", UTF16)
def test_never_splits_a_surrogate_pair_a_flag_an_accent_or_an_emoji_sequence(name: str) -> None:
    cut = SPLITTERS[name]
    parts = cut("😀" * 40, 33)
    assert ["😀" * 16, "😀" * 16, "😀" * 8] == parts
    for part in parts:
        part.encode("utf-16-le")  # strict: raises on half a pair
    assert ["👍🏽" * 8] * 5 == cut("👍🏽" * 40, 33)  # 4 UTF-16 units each
    assert ["ab" + "👍🏽" * 7] + ["👍🏽" * 8] * 4 + ["👍🏽"] == cut("ab" + "👍🏽" * 40, 33)  # the old Telegram one cut 👍|🏽
    assert ["🇺🇸" * 8, "🇺🇸" * 2] == cut("🇺🇸" * 10, 32)
    assert ["e\u0301" * 16, "e\u0301" * 4] == cut("e\u0301" * 20, 32)


# --- the model ------------------------------------------------------------------------------------


def test_the_model_of_a_message() -> None:
    blocks = md.parse("# Title\n\n- **bold** `code`\n  * [site](https://x.io)\n> quoted\n```py\nx = 1\n```")
    assert (
        md.Heading((md.Text("Title"),)),
        md.Line(()),
        md.Item("", (md.Emphasis("bold", (md.Text("bold"),), " "), md.Text(" "), md.Code("code"))),
        md.Item("  ", (md.Link("https://x.io", (md.Text("site"),), ""),)),
        md.Quote((md.Line((md.Text("quoted"),)),)),
        md.CodeBlock("x = 1", "py"),
    ) == blocks


def test_the_model_keeps_what_it_does_not_know_as_text() -> None:
    assert (md.Line((md.Text("2*3*4 snake_case_name **open"),)),) == md.parse("2*3*4 snake_case_name **open")
    assert (md.Line((md.Url("https://x.io/a_b"), md.Text("_. "), md.Angle("mention", "<@U024BE7LH>"))),) == md.parse(
        "https://x.io/a_b_. <@U024BE7LH>")  # the punctuation after a bare URL is not part of it


# --- WhatsApp and plain renderers ----------------------------------------------------------------

WHATSAPP = [
    ("hello **there**", "hello *there*"),
    ("*it* _it_ ~~gone~~ `co*de*`", "_it_ _it_ ~gone~ `co*de*`"),
    ("# Title", "*Title*"),
    ("[site](https://x.io) [https://x.io](https://x.io)", "site (https://x.io) https://x.io"),
    ("- one\n* two", "- one\n- two"),
    ("> quoted\n> more", "> quoted\n> more"),
    ("```python\nif a < b: *x*\n```", "```\nif a < b: *x*\n```"),
    ("a < b & c", "a < b & c"),
    ("para\n\n\n\npara", "para\n\npara"),
]


@pytest.mark.parametrize(("markdown", "expected"), WHATSAPP)
def test_whatsapp_conversions(markdown: str, expected: str) -> None:
    assert expected == whatsapp.to_whatsapp(markdown)


PLAIN = [
    ("**bold** and _it_ `code`", "bold and it code"),
    ("# Title\n- item\n> quote", "Title\n• item\n> quote"),
    ("[site](https://x.io) <https://y.io>", "site (https://x.io) https://y.io"),
    ("```\n  code *x*\n```", "  code *x*"),
]


@pytest.mark.parametrize(("markdown", "expected"), PLAIN)
def test_plain_conversions(markdown: str, expected: str) -> None:
    assert expected == plain.to_plain(markdown)
