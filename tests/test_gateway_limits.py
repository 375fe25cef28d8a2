"""Pacing: the leaky bucket (Telegram's per-bot limit, as python-telegram-bot's AIORateLimiter) lets a burst go
at once, then one call per period / limit, and never more than limit + the drained calls in any stretch."""

from __future__ import annotations

import asyncio
import time

from services.gateway.limits import Bucket, Window


async def _times(limiter, calls: int) -> list[float]:
    start = time.monotonic()
    out = []
    for _ in range(calls):
        await limiter.wait()
        out.append(time.monotonic() - start)
    return out


def test_bucket_bursts_then_drains_evenly_unlike_a_sliding_window():
    limit, period = 10, 0.5  # one call every 50 ms once the burst is spent
    times = asyncio.run(_times(Bucket(limit, period), limit + 5))
    assert times[limit - 1] < 0.03  # the burst goes at once
    gaps = [b - a for a, b in zip(times[limit - 1:], times[limit:])]
    assert all(0.04 <= g <= 0.08 for g in gaps), gaps  # then one per period / limit, not a whole period's wait
    # at most limit + rate * t calls by time t (the bucket's bound)
    assert all(n + 1 <= limit + t * limit / period + 1 for n, t in enumerate(times))  # 1: timer slack
    window = asyncio.run(_times(Window(limit, period), limit + 1))  # the sliding window holds a whole period
    assert window[limit] >= period - 0.01


def test_bucket_callers_go_in_arrival_order():
    async def go():
        bucket, order = Bucket(2, 0.2), []

        async def one(k):
            await bucket.wait()
            order.append(k)

        tasks = []
        for k in range(6):
            tasks.append(asyncio.create_task(one(k)))
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*tasks), 3.0)
        return order

    assert list(range(6)) == asyncio.run(go())


def test_bucket_refills_after_idle():
    async def go():
        bucket = Bucket(5, 0.25)
        await _times(bucket, 5)
        assert bucket.delay() > 0
        await asyncio.sleep(0.3)
        return await _times(bucket, 5)

    assert asyncio.run(go())[-1] < 0.03  # a full burst again after a period of quiet


def test_telegram_paces_bot_and_groups_with_buckets_and_keys_apart():
    from services.gateway.telegram.outbound import Sender

    sender = Sender(api=None, log=None)
    assert isinstance(sender.bot, Bucket) and (sender.bot.limit, sender.bot.rate) == (30, 30.0)
    group = sender.per_group["-100"]
    assert isinstance(group, Bucket) and group is sender.per_group["-100"] and group is not sender.per_group["-200"]
    assert abs(group.rate - 20 / 60.0) < 1e-9
