"""Live controls for the notebooks' "explore" cells: ipywidgets that rerun an experiment and redraw its chart.

These need a running kernel, so the static book drops their output (cells tagged ``remove-output``); the
book's own interactivity comes from Altair parameters over precomputed grids (see :mod:`batchlab.viz`).
"""
from __future__ import annotations

import inspect

import ipywidgets as ipw
from IPython.display import display

from . import viz


def control(name: str, spec, value=None):
    """A widget for one argument, starting at ``value`` (default: the lowest value or first option).

    ``(low, high, step)`` of ints gives an IntSlider, with any float a FloatSlider; a list or tuple of other
    values a Dropdown; a bool a Checkbox; an existing widget is used as it is. Sliders send their value when
    the mouse is released, so a slow simulation does not rerun for every pixel of a drag.
    """
    if isinstance(spec, ipw.ValueWidget):
        return spec
    if isinstance(spec, bool):
        return ipw.Checkbox(value=spec if value is None else value, description=name)
    if isinstance(spec, tuple) and len(spec) == 3 and all(isinstance(v, (int, float)) for v in spec):
        low, high, step = spec
        cls = ipw.IntSlider if all(isinstance(v, int) for v in spec) else ipw.FloatSlider
        return cls(value=low if value is None else value, min=low, max=high, step=step, description=name,
                   continuous_update=False)
    if isinstance(spec, (list, tuple)) and spec:
        return ipw.Dropdown(options=list(spec), value=spec[0] if value is None else value, description=name)
    raise ValueError(f"control {name!r}: expected (low, high, step), a list of options, a bool or a widget, "
                     f"got {spec!r}")


def explore(fn, **controls):
    """Show one control per keyword and ``fn(**values)`` below them, redrawn whenever a control changes.

    Parameters
    ----------
    fn : callable
        Takes the keywords of ``controls`` and returns something displayable (an Altair chart, a DataFrame).
    **controls
        Argument name -> specification, see :func:`control`. A control starts at ``fn``'s default for that
        argument, if it has one.

    Returns
    -------
    ipywidgets.VBox
        The controls above an Output widget; the last expression of a cell, so Jupyter shows it.

    Examples
    --------
    The decode step time (ms) of 1 to 512 sequences at 1,024 tokens of context, under a slider:

    >>> cost = bl.CostModel(bl.get_hardware("h100-sxm"), bl.get_model("llama-3-8b"))  # doctest: +SKIP
    >>> explore(lambda batch: f"{cost.decode_step_time(batch, 1024) * 1e3:.2f} ms",
    ...         batch=(1, 512, 1))  # doctest: +SKIP
    """
    viz.ensure_library()  # not through the Output widget: see viz.ensure_library
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
    widgets = {name: control(name, spec, defaults.get(name)) for name, spec in controls.items()}
    out = ipw.Output()

    def redraw(_change=None):
        with out:
            out.clear_output(wait=True)
            display(fn(**{name: w.value for name, w in widgets.items()}))

    for w in widgets.values():
        w.observe(redraw, names="value")
    redraw()
    return ipw.VBox([ipw.HBox(list(widgets.values())), out])
