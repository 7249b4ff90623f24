"""matplotlib, the way every chart of llmopt draws: Agg, imported only when a chart is drawn,
saved at one size. Shared by the report's charts and the stages' chart hooks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DOWN, UP, BASE, BEST, ALT = "#2e7d32", "#c62828", "#757575", "#1565c0", "#f9a825"


def plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt().close(fig)
    return path


def log2_axis(ax: Any) -> None:
    """A base-2 log x axis with plain numbers (512, 2048), not 2^9."""
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())


def xlabels(ax: Any, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=25 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center")


def legend(ax: Any, **kw: Any) -> None:
    """A legend only when something on the axes carries a label (no empty legend box)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, **kw)
