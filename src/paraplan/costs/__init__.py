"""Time functions of micro-batch size, per layer: analytic (device model) or measured (profile)."""
