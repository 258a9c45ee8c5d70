"""CSV and HTML rendering of results tables. Never imports torch."""
