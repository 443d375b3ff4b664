"""Every adapter over one plainly opened store (issue 30, items 3 and 4): the LangGraph
saver, the Agents SDK session, the Claude Code import, the Claude Agent SDK store and the
ADK session service share
a `SessionStore(root)` opened with no options, each teaching it its types
(`SessionStore.learn`); the `eventstore` command then names every integration's events
with no flag (the `eventstore.event_types` entry points)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process

pytest.importorskip("langgraph")
pytest.importorskip("agents")
pytest.importorskip("claude_agent_sdk")
pytest.importorskip("google.adk")

from google.adk.events.event import Event as AdkEvent  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from typing_extensions import TypedDict  # noqa: E402

from eventstore import SessionStore  # noqa: E402
from eventstore.integrations.claude_agent_sdk import (  # noqa: E402
    EventStoreSessionStore,
    session_id_of,
)
from eventstore.integrations.claude_code import export_transcript, import_transcript  # noqa: E402
from eventstore.integrations.google_adk import EventStoreSessionService  # noqa: E402
from eventstore.integrations.google_adk import session_id_of as adk_session  # noqa: E402
from eventstore.integrations.langgraph import EventStoreSaver  # noqa: E402
from eventstore.integrations.openai_agents import EventStoreSession  # noqa: E402

CLAUDE_CODE = sorted((Path(__file__).parent.parent / "fixtures" / "claude_code").rglob("*.jsonl"))


class Doc(TypedDict):
    text: str


def _graph(saver: EventStoreSaver) -> Any:
    g = StateGraph(Doc)
    g.add_node("shout", lambda s: {"text": s["text"].upper()})
    g.add_edge(START, "shout")
    g.add_edge("shout", END)
    return g.compile(checkpointer=saver)


def _fill(store: SessionStore) -> dict[str, str]:
    """One session per adapter in `store`; their ids by adapter."""
    saver = EventStoreSaver(store)
    cfg: Any = {"configurable": {"thread_id": "t1"}}
    assert _graph(saver).invoke({"text": "hi"}, cfg) == {"text": "HI"}
    cc_file = next(p for p in CLAUDE_CODE if "projects" in p.parts)
    report = import_transcript(store, cc_file)
    (cc_sid,) = report.appended
    key: Any = {"project_key": "proj", "session_id": "s1"}

    async def agents_and_sdk() -> None:
        session = EventStoreSession("agents-1", store)
        await session.add_items([{"role": "user", "content": "hello"}])  # type: ignore[list-item]
        sdk = EventStoreSessionStore(store)
        await sdk.append(key, [{"type": "user", "uuid": "u1", "message": "hi"}])
        assert await sdk.load(key) == [{"type": "user", "uuid": "u1", "message": "hi"}]
        assert await session.get_items() == [{"role": "user", "content": "hello"}]
        adk = EventStoreSessionService(store)
        s = await adk.create_session(app_name="app", user_id="u", session_id="a1")
        delta = EventActions(state_delta={"app:k": 1, "user:k": 2, "k": 3})
        await adk.append_event(s, AdkEvent(author="user", actions=delta))
        got = await adk.get_session(app_name="app", user_id="u", session_id="a1")
        assert got == s and got.state == {"app:k": 1, "user:k": 2, "k": 3}
        await session.close()
        await sdk.close()
        await adk.close()

    asyncio.run(agents_and_sdk())
    assert b"".join(export_transcript(store, cc_sid)) == cc_file.read_bytes()
    saver.close()
    return {
        "langgraph": "langgraph-t1",
        "agents": "agents-1",
        "claude_code": cc_sid,
        "claude_sdk": session_id_of(key),
        "adk": adk_session("app", "u", "a1"),
    }


def test_one_plain_store_serves_every_adapter_and_the_cli_names_their_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    with SessionStore(root) as store:
        sids = _fill(store)
        # (the ADK app's and user's logs beside them)
        assert set(store.list_sessions()) == {*sids.values(), "adk-app.app", "adk-user.app.u"}
        assert all(store.verify(s).problems == [] for s in sids.values())
    code, out, err = cli_in_process(capsys, "verify", str(root), "--all", "--json")
    assert code == 0 and "unknown_type" not in out + err
    expected = {
        "langgraph": "langgraph_checkpoint",
        "agents": "agents_items_added",
        "claude_code": "claude_code_line",
        "claude_sdk": "claude_sdk_summary",
        "adk": "adk_state_delta",
    }
    for adapter, sid in sids.items():
        code, out, err = cli_in_process(capsys, "log", str(root), sid, "--json")
        assert code == 0, err
        types = {json.loads(line)["type"] for line in out.splitlines()}
        assert expected[adapter] in types and "unknown" not in out
        code, out, err = cli_in_process(capsys, "log", str(root), sid)
        assert code == 0 and "unknown type" not in out + err
        code, out, err = cli_in_process(capsys, "state", str(root), sid)
        assert code == 0 and "unknown" not in out + err
        page = tmp_path / f"{adapter}.html"
        code, out, err = cli_in_process(capsys, "report", str(root), sid, "-o", str(page))
        html = page.read_text()
        assert code == 0 and expected[adapter] in html and "unknown type" not in html
