"""Real measurements on hardware we have: per-layer times and link costs (touches devices)."""
