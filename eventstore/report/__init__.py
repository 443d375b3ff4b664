"""The session report: one self-contained HTML page per session, and the live server."""
