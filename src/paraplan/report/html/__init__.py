"""`paraplan plan --planner auto --report DIR`: the comparison of every planner as one HTML page,
DIR/index.html, that opens anywhere and can be mailed on its own: figures are PNGs embedded as
base64 data URLs, the stylesheet is inline, nothing is fetched and no script runs.

What it shows: the verdict (the chosen plan, its gap to the lower bound, the runner-up), every
planner's row, the winner's and runner-up's timelines (the simulator's own Gantt drawing,
simulator/export.py), their memory per device, the per-layer strategies (Galvatron family) or
forward/backward ranges (Bi-Partition) where a plan has them, and every feasible plan against the
lower bound. Numbers come from the Comparison's rows (judged with the request's cost model,
memory budget included); plans are simulated again here only for their timelines.

The page and its sections are page.py, its figures (matplotlib PNGs, the simulator's Gantt)
figures.py, the numbers as the page writes them text.py.
"""

from paraplan.report.html.page import render, write_report
from paraplan.report.html.text import fmt_bytes, fmt_time

__all__ = ["fmt_bytes", "fmt_time", "render", "write_report"]
