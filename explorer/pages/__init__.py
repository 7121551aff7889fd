"""One module per explorer page: its ``layout`` and, beside it, its callbacks (ids prefixed by page)."""
