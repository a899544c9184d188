"""The notebooks' interactive panels: a row of controls over a function that returns a table, and the
table below them, recomputed whenever a control moves. The logic is the table function (tested headless,
like every lesson function); a panel only shows it. Sliders report on release (continuous_update=False),
so one move runs one computation."""
from __future__ import annotations

import pandas as pd


def quantity_table(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    """A panel's answer: (quantity, value as formatted text, unit) rows, indexed by quantity."""
    return pd.DataFrame(rows, columns=["quantity", "value", "unit"]).set_index("quantity").rename_axis(None)


def show_panel(controls: dict, table, *, title: str = "") -> None:
    """Display `controls` ({parameter name: ipywidget}) above table(**values) (a table, or a Figure) and keep
    them in step.

    Every label is shown in full (no "temperat..."); what `table` raises shows as a traceback in the panel."""
    import ipywidgets as w
    from IPython.display import display

    out = w.Output()

    def show(*_):
        with out:
            out.clear_output(wait=True)
            shown = table(**{name: c.value for name, c in controls.items()})
            display(shown)
            if hasattr(shown, "savefig"):            # a matplotlib Figure: shown once, not again by the backend
                import matplotlib.pyplot as plt
                plt.close(shown)

    for c in controls.values():
        c.style.description_width = "initial"
        if hasattr(c, "continuous_update"):
            c.continuous_update = False
        c.observe(show, names="value")
    head = [w.HTML(f"<b>{title}</b>")] if title else []
    display(w.VBox([*head, w.HBox(list(controls.values()), layout=w.Layout(flex_flow="row wrap")), out]))
    show()


def tables_html(*tables: pd.DataFrame):
    """Several tables as one displayable block, one under the other (a panel whose answer is more than one table)."""
    from IPython.display import HTML
    return HTML("".join(t.to_html() for t in tables))
