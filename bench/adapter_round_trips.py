"""`python -m bench.adapter_round_trips`: the Redis round trips of the Agents SDK session
and the Claude Agent SDK store, counted on the client (`bench.redis_trips`).

Agents SDK: `--ops` `add_items` of one item, then from a new store a whole `get_items()`
(it folds the conversation), `--ops` `pop_item` on that warm object, and one `pop_item`
of another new store (cold: read from the log's end). Claude Agent SDK: `--ops` `append`
of one entry to a main transcript, then the first batch again (a retry: every entry
held). The URL: --url, $EVENTSTORE_BENCH_REDIS_URL, then $EVENTSTORE_TEST_REDIS_URL;
a fresh key prefix each, deleted afterwards."""

from __future__ import annotations

import argparse
import asyncio

from .redis_trips import counted, fresh_prefix, per_op, redis_url


async def _agents(url: str, ops: int) -> None:
    from eventstore.integrations.openai_agents import EventStoreSession

    with fresh_prefix(url, "agentstrips") as prefixed, counted() as sent:
        s = EventStoreSession("chat", prefixed)
        await s.add_items([{"role": "user", "content": "warm up"}])  # (opening the store)
        sent.clear()
        for i in range(ops):
            await s.add_items([{"role": "user", "content": f"turn {i}"}])
        print(f"agents add_items x{ops}:", per_op(sent, ops))
        await s.close()
        s = EventStoreSession("chat", prefixed)
        await s.get_items()
        sent.clear()
        for _ in range(ops):
            assert await s.pop_item() is not None
        print(f"agents pop_item x{ops} (warm):", per_op(sent, ops))
        await s.close()
        s = EventStoreSession("chat", prefixed)
        await s.get_items(0)  # (opening the store, nothing folded)
        sent.clear()
        assert await s.pop_item() is not None
        print("agents pop_item (cold):", per_op(sent, 1))
        await s.close()


async def _claude(url: str, ops: int) -> None:
    from eventstore.integrations.claude_agent_sdk import EventStoreSessionStore

    key = {"project_key": "bench", "session_id": "s"}
    with fresh_prefix(url, "claudetrips") as prefixed, counted() as sent:
        store = EventStoreSessionStore(prefixed)
        await store.append(key, [{"type": "user", "uuid": "first"}])  # type: ignore[arg-type]
        sent.clear()
        for i in range(ops):
            await store.append(key, [{"type": "user", "uuid": f"u{i}"}])  # type: ignore[arg-type]
        print(f"claude append x{ops}:", per_op(sent, ops))
        sent.clear()
        await store.append(key, [{"type": "user", "uuid": "first"}])  # type: ignore[arg-type]
        print("claude append of a held entry (a retry):", per_op(sent, 1))
        await store.close()


def main() -> None:
    """Print the counts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=100)
    parser.add_argument("--url")
    args = parser.parse_args()
    url = redis_url(parser, args.url)
    asyncio.run(_agents(url, args.ops))
    asyncio.run(_claude(url, args.ops))


if __name__ == "__main__":
    main()
