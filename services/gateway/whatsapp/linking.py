"""Linking and unlinking a number, inside the gateway, through the client interface it runs: what
`starling whatsapp link|unlink` ask of it by request file (common/whatsapp_requests.py; the CLI speaks
no WhatsApp and imports no gateway code).

- link: takes the session (the gateway does not hold it while unlinked), pairs by QR code or pair code,
  waits until the phone confirmed and the first connection stands, saves, and writes the link record
  last; the gateway then connects with it. What the person must see goes back to the CLI as it comes.
- unlink: when the gateway holds the session, it logs out itself (linked_transport.py); otherwise this
  connects, logs out and deletes the session. Deleting is the way out of a session that is refused
  (wrong key, altered files), so it works without decrypting.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Callable

from common import whatsapp_qr, whatsapp_requests
from common.errors import StarlingError
from common.home import Paths
from services.gateway.whatsapp import linked
from services.gateway.whatsapp.linked import LinkedMessage, LinkRecord, LogoutReason
from services.gateway.whatsapp.session_vault import SessionBusy, SessionError, SessionVault

Show = Callable[[str], None]
LOGOUT_CONNECT_S = 20.0


def render_qr(code: str) -> str:
    """The QR code for a terminal (segno comes with neonize); the raw text when segno is missing."""
    try:
        import io

        import segno

        out = io.StringIO()
        segno.make_qr(code).terminal(out=out, compact=True)
        return out.getvalue()
    except ImportError:
        return f"(segno is not installed: make a QR code of this text)\n{code}"


class _Pairing:
    """linked.Events for `link`: shows the codes, and settles ``done`` with the account or an error."""

    def __init__(self, show: Show, qr: Callable[[str], str], shown: Callable[[str, str], None] | None = None) -> None:
        self.show = show
        self.shown = shown or (lambda _kind, _code: None)  # the code for the dashboard too (common/whatsapp_qr.py)
        self.render = qr
        self.account = ""
        self.paired_once = False
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def _fail(self, why: str) -> None:
        if not self.done.done():
            self.done.set_exception(StarlingError(why))

    async def qr(self, code: str) -> None:
        self.shown("qr", code)
        self.show("Scan this with WhatsApp on the phone: Settings → Linked devices → Link a device\n"
                  + self.render(code))

    async def pair_code(self, code: str) -> None:
        self.shown("pair", code)
        self.show(f"On the phone: WhatsApp → Settings → Linked devices → Link a device → Link with phone number"
                  f" instead, and enter:\n\n    {code}\n")

    async def paired(self, account: str) -> None:
        self.account, self.paired_once = account, True
        self.show(f"Paired with +{account}; connecting…")

    async def connected(self, account: str) -> None:
        if not self.done.done():
            self.done.set_result(account or self.account)

    async def disconnected(self, reason: str) -> None:
        if not self.paired_once:  # after pairing, WhatsApp drops the socket once and the client reconnects
            self._fail(f"linking failed: {reason}")

    async def logged_out(self, reason: LogoutReason, detail: str = "") -> None:
        self._fail(f"linking failed: {reason.value}{' (' + detail + ')' if detail else ''}")

    async def message(self, msg: LinkedMessage) -> None:
        pass  # nothing is answered while linking; the gateway takes over once it connects


async def link(paths: Paths, instance: str, phone: str = "", *, show: Show = print, timeout_s: float = 180.0,
               make_client: linked.MakeClient | None = None, qr: Callable[[str], str] = render_qr) -> LinkRecord:
    make = make_client or linked.client_factory()
    store = SessionVault.open(paths, instance)
    try:
        store.lock()
    except SessionBusy as exc:
        raise StarlingError(f"{exc}; the gateway holds it while the number is linked:"
                            f" `starling whatsapp unlink {instance}` first") from None
    try:
        old = LinkRecord.read(store)
        if old is not None and old.usable:
            raise StarlingError(f"{instance} is linked already (as +{old.account}); `starling whatsapp unlink"
                                f" {instance}` first")
        if store.names():
            show("Removing the previous session" + (f" ({LogoutReason[old.logged_out].value})"
                                                    if old and old.logged_out in LogoutReason.__members__ else ""))
            store.clear()
        events = _Pairing(show, qr, lambda kind, code: whatsapp_qr.write(paths, instance, kind, code))
        client = make(instance, store, events, _CliLog(show))
        try:
            await client.pair(phone)
            account = await asyncio.wait_for(asyncio.shield(events.done), timeout_s)
        except asyncio.TimeoutError:
            raise StarlingError(f"not linked within {timeout_s:.0f}s; run the command again for new codes") from None
        finally:
            whatsapp_qr.clear(paths, instance)
            await client.close()  # saves the session before the record says it is there
        record = LinkRecord(account=account, linked_at=time.time(), session=secrets.token_hex(8))
        record.write(store)
        return record
    finally:
        store.unlock()


async def unlink(paths: Paths, instance: str, *, show: Show = print, timeout_s: float = 30.0,
                 make_client: linked.MakeClient | None = None, ask: bool = True) -> str:
    """Unlink here, or (``ask``) through the request file when a running gateway holds the session."""
    store = SessionVault.open(paths, instance)
    try:
        store.lock()
    except SessionBusy as exc:
        if not ask:
            return f"not unlinked: {exc}; try again in a moment"
        return await asyncio.to_thread(whatsapp_requests.ask_unlink, paths, instance, timeout_s)
    try:
        try:
            record = LinkRecord.read(store)
        except SessionError as exc:
            show(f"warning: {exc}")
            store.clear()
            return "unlinked here (the session could not be read, so WhatsApp was not told): remove the device on" \
                   " the phone too (Settings → Linked devices)"
        if record is None and not store.names():
            return f"{instance} is not linked: nothing to do"
        result = "the session is deleted here"
        if record is not None and record.usable:
            result = await _logout(store, instance, make_client or linked.client_factory(), show)
        store.clear()
        return result
    finally:
        store.unlock()


async def _logout(store: SessionVault, instance: str, make: linked.MakeClient, show: Show) -> str:
    events = _Pairing(show, render_qr)
    events.paired_once = True  # a drop while connecting is not a failure here: we only want one connection
    client = make(instance, store, events, _CliLog(show))
    try:
        await client.connect()
        await asyncio.wait_for(asyncio.shield(events.done), LOGOUT_CONNECT_S)
        await client.logout()
        return "unlinked: WhatsApp removed this device from the phone's Linked devices"
    except (StarlingError, asyncio.TimeoutError) as exc:
        return (f"unlinked here, but WhatsApp could not be told ({exc or 'no connection in time'}): remove the"
                " device on the phone too (Settings → Linked devices)")
    finally:
        await client.close()


# ---------------------------------------------------------------- requests from the CLI


async def answer_link(paths: Paths, instance: str, request: dict, make_client: linked.MakeClient) -> str:
    """A `starling whatsapp link` request the gateway took while it holds no session: pair, telling the CLI
    each step (the QR code drawn here: segno comes with neonize). The linked account, or "" when it failed."""
    progress = whatsapp_requests.LinkProgress(whatsapp_requests.folder(paths, instance))
    phone = "".join(ch for ch in str(request.get("phone", "")) if ch.isdigit())
    try:
        timeout_s = min(max(float(request.get("timeout_s", 180.0)), 1.0), 3600.0)
    except (TypeError, ValueError):
        timeout_s = 180.0
    try:
        record = await link(paths, instance, phone, show=progress.say, timeout_s=timeout_s, make_client=make_client)
    except StarlingError as exc:
        progress.failed(str(exc))
        return ""
    progress.linked(record.account)
    return record.account


def refuse_link(paths: Paths, instance: str, account: str) -> None:
    """A link request while the gateway runs a linked session."""
    whatsapp_requests.LinkProgress(whatsapp_requests.folder(paths, instance)).failed(
        f"{instance} is linked already" + (f" (as +{account})" if account else "")
        + f"; `starling whatsapp unlink {instance}` first")


async def answer_unlink(paths: Paths, instance: str, make_client: linked.MakeClient) -> str:
    """A `starling whatsapp unlink` request the gateway took while it holds no session."""
    shown: list[str] = []
    result = await unlink(paths, instance, show=shown.append, make_client=make_client, ask=False)
    whatsapp_requests.answer_unlink(whatsapp_requests.folder(paths, instance), "\n".join([*shown, result]))
    return result


class _CliLog:
    """The client's log lines in a CLI command: warnings and errors to the terminal, the rest dropped."""

    def __init__(self, show: Show) -> None:
        self.show = show

    def bind(self, **_kw) -> _CliLog:
        return self

    def debug(self, *_a, **_kw) -> None:
        pass

    info = debug

    def warning(self, event: str, **kw) -> None:
        self.show(f"warning: {event} {kw.get('detail') or kw.get('error') or ''}".rstrip())

    error = warning
