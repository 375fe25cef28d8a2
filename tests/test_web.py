"""web_fetch against a local server (readable text, caps, redirects, the address rules, approvals) and
web_search against the fake search APIs. Every server is on 127.0.0.1, so the tests allow loopback
([web] allow_networks) and check that without it it is refused; private addresses are refused before
any connection is tried, never contacted."""

from __future__ import annotations

import asyncio
import socket

import msgspec
import pytest
from aiohttp import web as aioweb

from common.config import Web
from common.secrets import set_secret
from services.runner.tools import registry, web, web_net
from services.runner.tools.base import ToolContext, ToolResult
from tests.fake_search import BRAVE_KEY, TAVILY_KEY, FakeSearch
from tests.fake_server import listen
from tests.tool_helpers import make_ctx, no_secrets_from_other_tests  # noqa: F401 - a fixture

ARTICLE = """<html><head><title>Pelican facts</title></head><body>
<nav>Home | About | Login</nav>
<article><h1>Pelicans</h1><p>Pelicans are large water birds with a long beak and a big throat pouch used for
catching prey and draining water from the scooped-up contents before swallowing.</p>
<p>They live on every continent except Antarctica, mostly near coasts, lakes and rivers, in colonies.</p></article>
<footer>Copyright nobody</footer></body></html>"""


def app() -> aioweb.Application:
    async def page(request):
        return aioweb.Response(text=ARTICLE, content_type="text/html")

    async def big(request):
        return aioweb.Response(body=b"a" * (300 * 1024), content_type="text/plain")

    async def slow(request):
        await asyncio.sleep(3)
        return aioweb.Response(text="late")

    async def hop(request):
        n = int(request.match_info["n"])
        raise aioweb.HTTPFound("/page" if n == 0 else f"/hop/{n - 1}")

    async def to(request):
        raise aioweb.HTTPFound(request.query["url"])

    async def host(request):
        return aioweb.Response(text=f"you asked for {request.host}", content_type="text/plain")

    async def binary(request):
        return aioweb.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(100), content_type="image/png")

    a = aioweb.Application()
    a.add_routes([aioweb.get("/page", page), aioweb.get("/big", big), aioweb.get("/slow", slow),
                  aioweb.get("/hop/{n}", hop), aioweb.get("/to", to), aioweb.get("/host", host),
                  aioweb.get("/png", binary)])
    return a


def with_web(ctx: ToolContext, **kw) -> ToolContext:
    settings = {"allow_networks": ["127.0.0.0/8"], "timeout_s": 2.0, **kw}
    ctx.cfg = msgspec.structs.replace(ctx.cfg, web=Web(**settings))
    return ctx


def allow(home, agent: str, domains: list[str]) -> None:
    pack = home.paths.agents_dir / agent / "config.toml"
    pack.write_text(pack.read_text().replace("web_allow = []", f"web_allow = {domains!r}".replace("'", '"')))


def fetch(ctx: ToolContext, path_or_url: str, approved: str = "person") -> tuple[ToolResult, int]:
    """(the result of web_fetch on the local server, its port); ``approved``: person | auto | no."""
    ctx.approved, ctx.auto_approved = approved != "no", approved == "auto"

    async def go():
        runner, port = await listen(app(), "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{port}{path_or_url}" if path_or_url.startswith("/") else path_or_url
            return await registry.execute(ctx, "web_fetch", {"url": url.replace("{PORT}", str(port))}), port
        finally:
            await runner.cleanup()

    return asyncio.run(go())


@pytest.fixture
def ctx(home) -> ToolContext:
    return with_web(make_ctx(home, agent="alice"))


def test_a_page_becomes_its_readable_text(ctx):
    result, port = fetch(ctx, "/page")
    assert "ok" == result.outcome
    assert f"URL: http://127.0.0.1:{port}/page\nStatus: 200\nContent-Type: text/html" in result.content
    assert "Title: Pelican facts" in result.content and "throat pouch" in result.content
    assert "Login" not in result.content and "<p>" not in result.content  # the boilerplate and markup are gone


def test_the_size_and_time_caps(ctx):
    with_web(ctx, max_kb=64, timeout_s=0.5)
    big, _ = fetch(ctx, "/big")
    slow, _ = fetch(ctx, "/slow")
    assert "(only the first 64 KB were read: [web] max_kb)" in big.content and big.content.count("a") < 70 * 1024
    assert "refused" == slow.outcome and "no complete answer within 0.5 s" in slow.content


def test_redirects_are_followed_within_the_cap(ctx):
    with_web(ctx, max_redirects=3)
    ok, port = fetch(ctx, "/hop/2")
    too_many, _ = fetch(ctx, "/hop/5")
    assert f"Redirected from: http://127.0.0.1:{port}/hop/2 -> " in ok.content and "throat pouch" in ok.content
    assert "more than 3 redirects" in too_many.content


def test_loopback_is_refused_unless_allowed(ctx):
    with_web(ctx, allow_networks=[])
    for url in ("/page", "http://localhost:{PORT}/page", "http://[::1]:{PORT}/page", "http://0x7f000001:{PORT}/page",
                "http://[::ffff:127.0.0.1]:{PORT}/page"):
        result, _ = fetch(ctx, url)
        assert "refused" == result.outcome and "loopback address" in result.content, url


def test_a_private_address_or_a_redirect_to_one_is_refused_without_connecting(ctx, monkeypatch):
    tried: list[str] = []
    real = web_net._system_lookup

    async def lookup(host: str, port: int):
        tried.append(host)
        if host == "intranet.test":
            return [(socket.AF_INET, "192.168.1.5")]
        if host == "mixed.test":
            return [(socket.AF_INET, "93.184.216.34"), (socket.AF_INET, "10.1.2.3")]
        return await real(host, port)

    monkeypatch.setattr(web_net, "_system_lookup", lookup)
    direct, _ = fetch(ctx, "http://10.0.0.8/secret")
    named, _ = fetch(ctx, "http://intranet.test/admin")
    mixed, _ = fetch(ctx, "http://mixed.test/")
    redirected, _ = fetch(ctx, "/to?url=http://169.254.169.254/latest/meta-data/")
    via_name, _ = fetch(ctx, "/to?url=http://intranet.test/")
    assert "10.0.0.8 is a private address" in direct.content
    assert "intranet.test resolves to 192.168.1.5, a private address" in named.content
    assert "mixed.test resolves to 10.1.2.3, a private address" in mixed.content
    assert "169.254.169.254 is a link-local address" in redirected.content
    assert "resolves to 192.168.1.5" in via_name.content
    assert all("refused" == r.outcome for r in (direct, named, mixed, redirected, via_name))
    assert ["intranet.test", "mixed.test", "intranet.test"] == [h for h in tried if h.endswith(".test")]


def test_the_connection_goes_to_the_address_that_was_checked(ctx, monkeypatch):
    async def lookup(host: str, port: int):  # a name no DNS knows: only the resolver's answer can reach it
        return [(socket.AF_INET, "127.0.0.1")]

    monkeypatch.setattr(web_net, "_system_lookup", lookup)
    result, port = fetch(ctx, "http://rebind.test:{PORT}/host")
    assert f"you asked for rebind.test:{port}" in result.content


def test_it_asks_like_a_network_command_and_auto_never_grants_it(ctx, home):
    asked, _ = fetch(ctx, "/page", approved="no")
    auto, _ = fetch(ctx, "/page", approved="auto")
    assert ("needs_approval", "refused") == (asked.outcome, auto.outcome)
    assert asked.approval_reason.startswith("fetch http://127.0.0.1:") and "(network access)" in asked.approval_reason
    assert "approval mode is auto, which never grants it" in auto.content and "web_allow" in auto.content
    allow(home, "alice", ["127.0.0.1"])
    free, _ = fetch(ctx, "/page", approved="no")
    assert "ok" == free.outcome and "throat pouch" in free.content


def test_a_free_fetch_follows_no_redirect_to_a_host_outside_web_allow(ctx, home):
    allow(home, "alice", ["127.0.0.1"])
    stopped, port = fetch(ctx, "/to?url=http://localhost:{PORT}/page", approved="no")
    followed, _ = fetch(ctx, "/to?url=http://localhost:{PORT}/page", approved="person")
    assert "refused" == stopped.outcome and "whose host localhost is not in web_allow" in stopped.content
    assert "ok" == followed.outcome and "throat pouch" in followed.content


def test_web_allow_covers_subdomains_only_of_its_own_domains():
    allow_list = ["python.org", "https://docs.example.com/path", "*.wiki.test"]
    assert all(web.allowed_host(h, allow_list) for h in ("python.org", "docs.python.org", "docs.example.com",
                                                          "a.wiki.test", "wiki.test"))
    assert not any(web.allowed_host(h, allow_list) for h in ("evilpython.org", "python.org.evil.test", "example.com"))


def test_what_is_not_a_url_or_not_text(ctx):
    for url, fragment in (("file:///etc/passwd", "only http:// and https://"), ("ftp://x/", "only http://"),
                          ("http://user:pw@127.0.0.1/", "user name or password")):
        result, _ = fetch(ctx, url)
        assert "refused" == result.outcome and fragment in result.content
    png, _ = fetch(ctx, "/png")
    assert "bytes of image/png: not text, not shown" in png.content


def test_results_are_redacted_like_any_tool_result(ctx):
    from common.log import register_secret

    register_secret("throat pouch used for catching")
    result, _ = fetch(ctx, "/page")
    assert "throat pouch used for catching" not in result.content and "[redacted" in result.content.lower()


# ---------------------------------------------------------------- web_search


def search(ctx: ToolContext, kind: str, key: str = "", **args) -> tuple[ToolResult, list[dict]]:
    async def go():
        async with FakeSearch() as fake:
            base = fake.url + ("/res/v1" if kind == "brave" else "")
            with_web(ctx, search=kind, base_url=base, api_key="search-key" if key else "")
            if key:
                set_secret(ctx.paths.secrets_file, "search-key", key)
            return await registry.execute(ctx, "web_search", {"query": "pelican diet", **args}), fake.requests

    return asyncio.run(go())


@pytest.mark.parametrize("kind,key", [("searxng", ""), ("brave", BRAVE_KEY), ("tavily", TAVILY_KEY)])
def test_web_search_asks_each_api_as_it_expects(ctx, kind, key):
    result, [request] = search(ctx, kind, key, count=2)
    assert "ok" == result.outcome, result.content
    assert "1. Result 1 for pelican diet\n   https://example.org/1\n   snippet 1 about pelican diet" in result.content
    assert "3." not in result.content
    if kind == "searxng":
        assert {"q": "pelican diet", "format": "json"} == request["query"]
    elif kind == "brave":
        assert ("2", BRAVE_KEY) == (request["query"]["count"], request["headers"]["x-subscription-token"])
    else:
        assert {"query": "pelican diet", "max_results": 2} == {k: request["body"][k] for k in ("query", "max_results")}


def test_a_wrong_key_is_an_error_the_model_can_read(ctx):
    result, _ = search(ctx, "brave", "BSA-wrong")
    assert "error" == result.outcome and "HTTP 401" in result.content and "SUBSCRIPTION_TOKEN_INVALID" in result.content


def test_web_search_is_offered_only_with_a_provider(ctx):
    names = lambda: [s.name for s in registry.specs_for(["web"], ctx.cfg)]  # noqa: E731
    assert ["web_fetch"] == names()
    with_web(ctx, search="searxng", base_url="http://127.0.0.1:1")
    assert ["web_fetch", "web_search"] == names()


@pytest.mark.parametrize("text,key,fragment", [
    ('[web]\nsearch = "searxng"\n', "web.base_url", "required when search = \"searxng\""),
    ('[web]\nsearch = "brave"\n', "web.api_key", "required when search = \"brave\""),
    ('[web]\nallow_networks = ["10.0.0.0/33"]\n', "web.allow_networks", "expected CIDR networks"),
])
def test_the_web_config_names_what_is_wrong(tmp_path, text, key, fragment):
    from common.config import load_config
    from common.errors import ConfigError

    (tmp_path / "config.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "config.toml")
    assert key in str(err.value) and fragment in str(err.value), str(err.value)
