"""One-off research scripts; run as `python -m research.scripts.<name>` from the repository root."""
