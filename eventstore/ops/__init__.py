"""The operations over the session core, written once for every engine: history, verify,
compaction, follow, paging, repair, export, lifecycle, migrate and the legacy import."""
