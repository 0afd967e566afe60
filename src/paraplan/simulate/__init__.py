"""The one yardstick: a discrete-event simulator of task graphs built from Plans.

Calling the package is the public API's `paraplan.simulate(plan_or_path)` (paraplan/api.py; see
`paraplan.make_callable` for why a package is callable).
"""

from paraplan import make_callable

make_callable(__name__)
