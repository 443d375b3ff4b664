"""`python -m bench.adk_round_trips`: the Redis round trips of the ADK adapter, counted
on the client (every command redis-py sends; commands inside a script are not round
trips): one `create_session` on a cold store, then `--events` `append_event` with a
session-scoped state delta. The URL: $EVENTSTORE_BENCH_REDIS_URL, then
$EVENTSTORE_TEST_REDIS_URL; a fresh key prefix, deleted afterwards."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import uuid
from typing import Any


async def _run(url: str, events: int) -> None:
    import redis
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    from eventstore.integrations.google_adk import EventStoreSessionService

    sent: collections.Counter[str] = collections.Counter()
    real = redis.Redis.execute_command

    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        sent[str(args[0]).upper()] += 1
        return real(self, *args, **kw)

    prefix = f"adktrips{uuid.uuid4().hex[:8]}"
    redis.Redis.execute_command = counted  # type: ignore[method-assign]
    try:
        service = EventStoreSessionService(f"{url}{'&' if '?' in url else '?'}prefix={prefix}")
        sent.clear()  # (opening the store: a PING and the index marks)
        s = await service.create_session(app_name="bench", user_id="u", session_id="s")
        print("create_session (cold store):", dict(sent))
        sent.clear()
        for i in range(events):
            content = types.Content(role="user", parts=[types.Part(text=f"turn {i}")])
            actions = EventActions(state_delta={"turn": i})
            await service.append_event(s, Event(author="user", content=content, actions=actions))
        print(f"append_event x{events}:", dict(sent), f"({sum(sent.values()) / events} each)")
        await service.close()
    finally:
        redis.Redis.execute_command = real  # type: ignore[method-assign]
        client = redis.Redis.from_url(url)
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)


def main() -> None:
    """Print the counts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument(
        "--url",
        default=os.environ.get("EVENTSTORE_BENCH_REDIS_URL")
        or os.environ.get("EVENTSTORE_TEST_REDIS_URL"),
    )
    args = parser.parse_args()
    if not args.url:
        parser.error("no Redis URL: --url, or set EVENTSTORE_BENCH_REDIS_URL")
    asyncio.run(_run(args.url, args.events))


if __name__ == "__main__":
    main()
