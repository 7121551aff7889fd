"""mksim's web explorer: a multi-page Dash app (``mksim explore``).

``explorer.data`` extracts plain data from mksim and the committed validation results,
``explorer.figures`` draws it (pure functions), ``explorer.pages`` holds one module per page and
``explorer.app.create_app`` assembles them. Dash is imported only by the app and the pages.
"""
