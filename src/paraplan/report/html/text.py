"""Text as the HTML report writes it: escaped, times and sizes in the unit that reads best."""

from __future__ import annotations

import html


def escape(x) -> str:
    return html.escape(str(x), quote=True)


def fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "—"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:  # 4 digits: 15.96 of 16 GiB must not read as full
            return f"{b / size:.4g} {unit}"
    return f"{b:.0f} B"
