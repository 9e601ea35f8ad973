"""Game days: incidents reproduced end to end against the built-in engine (docs/gameday.md)."""
