"""GroPipe (../shared/papers/gropipe.md): AMPA and the grouped configuration search."""
