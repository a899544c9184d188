"""Small rules every lesson figure follows: an axis that counts (draft position, k, layer, expert) has
whole-number ticks only, and a legend with more than a few entries sits beside the plot, not on its data."""
from __future__ import annotations

from matplotlib.ticker import MaxNLocator


def integer_axis(ax, which: str = "x") -> None:
    """Ticks at whole numbers only on `which` ("x", "y" or "xy") of `ax`."""
    for w in which:
        getattr(ax, f"{w}axis").set_major_locator(MaxNLocator(integer=True))


def legend_beside(ax, fontsize: int = 7, max_inside: int = 3) -> None:
    """The legend of `ax`: inside at the best place when it has at most `max_inside` entries, else to the
    right of the axes, where it cannot cover a point (call fig.tight_layout() after)."""
    n = len(ax.get_legend_handles_labels()[1])
    if n <= max_inside:
        ax.legend(fontsize=fontsize, loc="best")
    else:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
