"""The results' plots, drawn from the held-out curves the records hold (each evaluation's seconds and accuracy).

A record without curves (one converted from a text that kept only the times to targets) has no plot, so no
image stands without the data that draws it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

Curve = list[list[float]]


def arm_curves(runs: list[dict[str, Any]]) -> list[Curve] | None:
    """Each run's curve, or None unless every run has one."""
    curves = [r.get("evaluations") for r in runs]
    return curves if curves and all(curves) else None  # type: ignore[return-value]


def decoupling_plot(record: dict[str, Any]) -> str | None:
    """The plot of a decoupling record's main pair, where its runs hold their curves."""
    pair = record["pairs"][0]
    if all(arm_curves(record["arms"][pair[side]]["runs"]) for side in ("async", "sync")):
        return f"decoupling-{record['task']}-{record['minutes']:g}min.png"
    return None


def decoupling_figure(record: dict[str, Any]) -> tuple[str, dict[str, list[Curve]]]:
    pair = record["pairs"][0]
    arms = {pair[side]: arm_curves(record["arms"][pair[side]]["runs"]) or [] for side in ("async", "sync")}
    return f"async vs sync TB, {record['task']}, {record['minutes']:g} min, separate cores", arms


def draw(title: str, arms: dict[str, list[Curve]]) -> bytes:
    """Each arm's curves against wall-clock time, every seed faint, the mean over seeds on top; PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (label, curves) in enumerate(arms.items()):
        color = f"C{i}"
        grid = np.linspace(0, max(p[0] for c in curves for p in c), 60)
        for c in curves:
            ax.plot([p[0] for p in c], [p[1] for p in c], color=color, alpha=0.25 if len(curves) > 1 else 1.0)
        if len(curves) > 1:
            mean = np.mean([np.interp(grid, [p[0] for p in c], [p[1] for p in c]) for c in curves], axis=0)
            ax.plot(grid, mean, color=color, linewidth=2.2, label=f"{label} (mean of {len(curves)})")
        else:
            ax.lines[-1].set_label(label)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return out.getvalue()


def write(path: Path, title: str, arms: dict[str, list[Curve]]) -> bool:
    """Draw the plot; write it only where it differs from the file. True if written."""
    png = draw(title, arms)
    if path.exists() and path.read_bytes() == png:
        return False
    path.write_bytes(png)
    return True
