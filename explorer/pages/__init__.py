"""One module per explorer page: its ``layout`` and, beside it, its callbacks (ids prefixed by page)."""

from explorer import import_dash

import_dash()  # before any page imports Dash
