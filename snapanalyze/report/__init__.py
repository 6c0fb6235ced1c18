"""Rendering: analysis results → text tables and JSON documents (no analysis happens here)."""
