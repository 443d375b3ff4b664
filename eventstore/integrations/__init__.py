"""Optional integrations with agent frameworks, each over the public `SessionStore` API.

Each submodule needs its framework installed (an extra of the `eventstore` package):
`eventstore.integrations.langgraph` (`[langgraph]`), `eventstore.integrations.openai_agents`
(`[openai-agents]`). Importing this package imports none of them.
"""
