"""How a transcript message reads on a terminal: its text, tool calls and tool results.

Owns the human form of a `Message` for the `eventstore transcript` view. A plain message
is its `content`; a rich one lists its blocks in order, each marked so a reader can tell
a call from its result at a glance:

    ls the repo  → Bash#t1 {"command":"ls"}  ← t1: README.md setup.py  [thinking] …

Pure string work: no I/O, no terminal queries (the caller decides the width).
"""

from __future__ import annotations

import msgspec

from eventstore.records import (
    ContentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    text_of,
)

__all__ = ["describe_block", "describe_message"]

_json = msgspec.json.Encoder(order="sorted")

#: The markers: a call goes out (→), a result comes back (←).
CALL = "→"
RESULT = "←"


def describe_block(block: ContentBlock) -> str:
    """One content block as readable text (see the module docstring for the markers)."""
    if type(block) is TextBlock:
        return block.text
    if type(block) is ToolUseBlock:
        return f"{CALL} {block.name}#{block.id} {_json.encode(block.input).decode()}"
    if type(block) is ToolResultBlock:
        error = " (error)" if block.is_error else ""
        if isinstance(block.content, str):
            body = block.content
        else:
            body = "  ".join(describe_block(b) for b in block.content)
        return f"{RESULT} {block.tool_use_id}{error}: {body}"
    if type(block) is ThinkingBlock:
        return f"[thinking] {block.thinking}"
    if type(block) is ImageBlock:
        kind = block.media_type or "image"
        return f"[{kind} {block.source}]"
    raise TypeError(f"not a content block: {type(block).__name__}")


def describe_message(message: Message) -> str:
    """A message as text: `content`, then its blocks in order.

    Text blocks are left out when `content` is exactly their text (`text_of`), as
    importers write it, so nothing is shown twice. `name` (a tool's or participant's)
    leads as `name:`.
    """
    parts: list[str] = []
    if message.name:
        parts.append(f"{message.name}:")
    if message.content:
        parts.append(message.content)
    repeated = bool(message.content) and message.content == text_of(message.blocks)
    for block in message.blocks:
        if repeated and type(block) is TextBlock:
            continue
        parts.append(describe_block(block))
    return "  ".join(parts)
