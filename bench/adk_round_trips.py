"""`python -m bench.adk_round_trips`: the Redis round trips of the ADK adapter, counted
on the client (`bench.redis_trips`): one `create_session` on a cold store, then
`--events` `append_event` with a session-scoped state delta. The URL:
$EVENTSTORE_BENCH_REDIS_URL, then $EVENTSTORE_TEST_REDIS_URL; a fresh key prefix,
deleted afterwards."""

from __future__ import annotations

import argparse
import asyncio

from .redis_trips import counted, fresh_prefix, per_op, redis_url


async def _run(url: str, events: int) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    from eventstore.integrations.google_adk import EventStoreSessionService

    with fresh_prefix(url, "adktrips") as prefixed, counted() as sent:
        service = EventStoreSessionService(prefixed)
        sent.clear()  # (opening the store: a PING and the index marks)
        s = await service.create_session(app_name="bench", user_id="u", session_id="s")
        print("create_session (cold store):", dict(sent))
        sent.clear()
        for i in range(events):
            content = types.Content(role="user", parts=[types.Part(text=f"turn {i}")])
            actions = EventActions(state_delta={"turn": i})
            await service.append_event(s, Event(author="user", content=content, actions=actions))
        print(f"append_event x{events}:", per_op(sent, events))
        await service.close()


def main() -> None:
    """Print the counts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--url")
    args = parser.parse_args()
    asyncio.run(_run(redis_url(parser, args.url), args.events))


if __name__ == "__main__":
    main()
