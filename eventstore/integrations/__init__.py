"""Optional integrations with agent frameworks and harnesses, each over the public
`SessionStore` API.

Each submodule needs its framework installed (an extra of the `eventstore` package):
`eventstore.integrations.langgraph` (`[langgraph]`), `eventstore.integrations.openai_agents`
(`[openai-agents]`); `eventstore.integrations.claude_code` (Claude Code's JSONL
transcripts) needs nothing more. Importing this package imports none of them.
"""
