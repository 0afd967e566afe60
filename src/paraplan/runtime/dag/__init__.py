"""Operator placements (FD-DPS 'dag' plans): the traced forward aten calls replayed per device."""
