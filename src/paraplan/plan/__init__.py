"""The Plan: a leaf package (it imports only `errors` and `fileio`) that every other package uses."""
