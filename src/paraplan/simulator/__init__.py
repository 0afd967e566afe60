"""The one yardstick: a discrete-event simulator of task graphs built from Plans. Named
`simulator`, not `simulate`: `paraplan.simulate(...)` is the API's function."""
