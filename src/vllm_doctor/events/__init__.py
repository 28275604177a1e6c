"""See docs/DESIGN.md."""
