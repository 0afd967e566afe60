"""The one yardstick: a discrete-event simulator of task graphs built from Plans."""
