"""The session core: per-session state, the fold loop, the write loop with idempotency,
and the cache policy. The operations (`eventstore.ops`) and the public API build on it."""
