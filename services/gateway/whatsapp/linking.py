"""Linking and unlinking a number, as `starling whatsapp link|unlink` do it, through the same client
interface the gateway uses.

- link: takes the session (the gateway does not hold it while unlinked), pairs by QR code or pair code,
  waits until the phone confirmed and the first connection stands, saves, and writes the link record
  last; the gateway notices the record within a second and connects.
- unlink: when the gateway holds the session, asks it through a request file (it logs out, deletes the
  session and answers); otherwise connects, logs out and deletes the session itself. Deleting is the
  way out of a session that is refused (wrong key, altered files), so it works without decrypting.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Callable

from common import whatsapp_qr
from common.errors import StarlingError
from common.home import Paths
from services.gateway.whatsapp import linked
from services.gateway.whatsapp.linked import LinkedMessage, LinkRecord, LogoutReason
from services.gateway.whatsapp.linked_transport import UNLINK_REQUEST, UNLINK_RESULT
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
                 make_client: linked.MakeClient | None = None) -> str:
    store = SessionVault.open(paths, instance)
    try:
        store.lock()
    except SessionBusy:
        return await _ask_gateway(store, timeout_s)
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


async def _ask_gateway(store: SessionVault, timeout_s: float) -> str:
    request, answer = store.folder / UNLINK_REQUEST, store.folder / UNLINK_RESULT
    answer.unlink(missing_ok=True)
    request.write_text(str(time.time()))
    deadline = time.monotonic() + timeout_s
    while request.exists():
        if time.monotonic() > deadline:
            request.unlink(missing_ok=True)
            raise StarlingError(f"the gateway holds the session but did not act on the request in {timeout_s:.0f}s;"
                                " is it stuck? (`starling logs gateway-whatsapp`)")
        await asyncio.sleep(0.1)
    try:
        return answer.read_text()
    finally:
        answer.unlink(missing_ok=True)


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
