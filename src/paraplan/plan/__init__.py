"""The Plan: a leaf package (it imports only `errors` and `fileio`) that every other package uses.

Calling the package is the public API's planning function, `paraplan.plan("gpt2-xl", "local",
batch=8)` (paraplan/api.py; see `paraplan.make_callable` for why a package is callable).
"""

from paraplan import make_callable

make_callable(__name__)
