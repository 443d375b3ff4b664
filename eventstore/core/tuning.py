"""`Tuning`: the sizes the session core reads, caches and hashes by. The defaults are
what the benchmarks chose; tests set small ones to reach every path with small logs."""

from __future__ import annotations

import msgspec

from eventstore.errors import InvalidArgumentError

__all__ = ["DEFAULT_TUNING", "Tuning"]


class Tuning(msgspec.Struct, frozen=True):
    """Sizes in bytes, given to `SessionStore(..., tuning=Tuning(...))`.

    - `read_piece`: how much log a load reads and folds at a time (bounds what a cold
      load of a long log holds besides the state it builds).
    - `hash_aside`: from this many bytes in a piece, a checked prefix is hashed on a
      side thread beside the decoding (below it, starting the thread costs more).
    - `cache_after_fold`: a fold that read at least this much log saves its fold cache.
    - `cache_on_close`: close saves the fold caches of logs at least this long (below,
      a cold fold costs about what reading a cache does, and close stays fsync-free).
    - `cache_while_writing`: a writer whose appends grew the log by this much (or by
      eight times the state's size, if more) since a state's fold cache was saved saves it
      again, so a load in another process folds little even if this one never closes
      (0: only on close). The transcript's cache is saved on close (its complete
      frames, 512 messages each, as the writer's appends complete them).
    - `kept_from_creation`: bytes of log a store folds, as it appends them, into the
      transcripts of sessions it created and never loaded (their caches are saved on
      close); past it, it lets them go.
    """

    read_piece: int = 1 << 20
    hash_aside: int = 768 << 10
    cache_after_fold: int = 1 << 20
    cache_on_close: int = 64 << 10
    cache_while_writing: int = 1 << 20
    kept_from_creation: int = 64 << 20

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            value = getattr(self, name)
            least = 1 if name == "read_piece" else 0
            if type(value) is not int or value < least:
                raise InvalidArgumentError(
                    f"Tuning.{name} must be an int >= {least}, got {value!r}"
                )


DEFAULT_TUNING = Tuning()
"""The tuning of a store given none, looked up as each store opens: a test may replace it
(e.g. `monkeypatch.setattr(eventstore.core.tuning, "DEFAULT_TUNING", Tuning(read_piece=
4096))`) to reach every path of a load with small logs, in stores it does not open itself."""
