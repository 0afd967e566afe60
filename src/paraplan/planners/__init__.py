"""The Plan type and, one module per method, the planners that produce it."""
