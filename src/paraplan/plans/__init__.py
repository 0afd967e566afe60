"""The Plan: a leaf package (it imports only `errors` and `fileio`) that every other package uses:
the frozen `Plan` (plan.py), its versioned JSON file (plan_file.py) and what each Bi-Partition worker
runs (worker_roles.py). Named `plans`, not `plan`: `paraplan.plan(...)` is the API's function."""
