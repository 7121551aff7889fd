import os

# Rich prints tables at a fixed width when not on a terminal; keep colour codes out.
os.environ.setdefault("NO_COLOR", "1")
