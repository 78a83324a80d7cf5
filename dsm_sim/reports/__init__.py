"""Reports of chaos runs: a self-contained HTML page, JSON for machines, JUnit XML for CI."""

__all__: list[str] = []
