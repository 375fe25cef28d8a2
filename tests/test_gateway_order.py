"""A chat's inbound messages in order (services/gateway/order.py): by arrival, or by the platform's
timestamps with a short hold for a predecessor that may come after its successor (WhatsApp Cloud)."""

from __future__ import annotations

import asyncio
import time

from services.gateway.order import ChatOrder, Window

WINDOW = Window(skew_s=0.2, max_hold_s=0.6)


async def _one(order: ChatOrder, out: list, chat: str, sent_at: float, name: str, after_s: float = 0.0,
               work_s: float = 0.01) -> None:
    await asyncio.sleep(after_s)
    async with order.turn(chat, sent_at):
        out.append((name, time.time()))
        await asyncio.sleep(work_s)


def _names(out: list) -> list[str]:
    return [name for name, _ in out]


def test_messages_that_come_the_wrong_way_round_go_in_timestamp_order_ties_by_arrival():
    async def run() -> list:
        order, out, now = ChatOrder(WINDOW), [], time.time()
        # stamped: a, b in the second before now, c and d (a tie) now; they come d, c, b, a
        await asyncio.gather(_one(order, out, "x", now - 1, "a", after_s=0.15),
                             _one(order, out, "x", now - 1, "b", after_s=0.10),
                             _one(order, out, "x", now, "d", after_s=0.0),
                             _one(order, out, "x", now, "c", after_s=0.05))
        return out

    assert ["b", "a", "d", "c"] == _names(asyncio.run(run()))


def test_without_a_window_the_order_is_arrival_whatever_the_timestamps():
    async def run() -> list:
        order, out, now = ChatOrder(None), [], time.time()
        await asyncio.gather(*(_one(order, out, "x", now - k, str(k), after_s=k * 0.01) for k in range(5)))
        return out

    assert ["0", "1", "2", "3", "4"] == _names(asyncio.run(run()))


def test_a_message_no_later_than_the_last_let_go_waits_for_nothing_and_a_late_one_is_not_held():
    async def run() -> tuple[float, float, list]:
        order, out, now = ChatOrder(WINDOW), [], time.time()
        await _one(order, out, "x", now, "first")  # waits for a predecessor that never comes
        start = time.time()
        await _one(order, out, "x", now, "same second")
        await _one(order, out, "x", now - 5, "late")  # its successors are stored already: it goes when it comes
        return start, time.time(), out

    start, end, out = asyncio.run(run())
    assert ["first", "same second", "late"] == _names(out)
    assert end - start < 0.15


def test_the_hold_is_bounded_for_a_timestamp_ahead_of_this_clock():
    async def run() -> float:
        order, out = ChatOrder(WINDOW), []
        start = time.time()
        await _one(order, out, "x", time.time() + 3600, "from the future")
        return out[0][1] - start

    held = asyncio.run(run())
    assert WINDOW.max_hold_s - 0.05 <= held < WINDOW.max_hold_s + 0.3


def test_chats_go_side_by_side_and_a_cancelled_wait_frees_the_line():
    async def run() -> tuple[list, dict]:
        order, out, now = ChatOrder(WINDOW), [], time.time()
        waiting = asyncio.create_task(_one(order, out, "x", now + 3600, "never"))  # held for max_hold_s
        await asyncio.sleep(0.05)
        await _one(order, out, "y", now - 5, "other chat")  # not behind x's hold
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await _one(order, out, "x", now - 5, "after the cancel")
        return out, order._chats

    out, chats = asyncio.run(run())
    assert (["other chat", "after the cancel"], {}) == (_names(out), chats)


def test_while_the_platform_posts_concurrently_even_an_old_timestamp_waits_for_one_right_behind():
    async def run(concurrent: bool) -> list:
        order, out, old = ChatOrder(WINDOW), [], time.time() - 60  # a backlog, delivered late
        if concurrent:  # another chat's two messages in the line at once: the platform posts concurrently
            await asyncio.gather(_one(order, [], "y", old, "y1"), _one(order, [], "y", old, "y2"))
        await asyncio.gather(_one(order, out, "x", old + 1, "second", after_s=0.0),
                             _one(order, out, "x", old, "first", after_s=0.1, work_s=0.0))
        return _names(out)

    # one at a time, a late message waits for nothing (its predecessor, later still, goes after it)
    assert (["first", "second"], ["second", "first"]) == (asyncio.run(run(True)), asyncio.run(run(False)))
