"""Remedies: turn a finding plus the facts into a corrected command (see docs/DESIGN.md)."""
