// The book's chart runtime, bundled with Vega (batchlab.viz.offline_bundle): how a chart is drawn, reflowed for a
// narrow column, and how its sliders name the value they select. Plain ES5 in the page's global scope.

// A copy of a Vega-Lite spec laid out for a column `width` px wide: side-by-side panels stacked (hconcat and
// facet columns become rows), views no wider than the column less room for axes, legends under the plot in as
// many columns as fit. spec.usermeta.narrow may set {width: px of the widest view, margin: px kept for axes}.
window.batchlabNarrow = function (spec, width) {
  var s = JSON.parse(JSON.stringify(spec));
  var hints = (s.usermeta && s.usermeta.narrow) || {};
  var view = hints.width || Math.max(160, Math.floor(width - (hints.margin || 90)));
  var legendColumns = Math.max(1, Math.floor(view / 150));
  var channels = ["color", "fill", "stroke", "shape", "size", "opacity", "strokeDash"];
  var sides = {right: 1, left: 1, "top-right": 1, "top-left": 1, "bottom-right": 1, "bottom-left": 1};
  function legendBelow(legend) {
    if (!legend || typeof legend !== "object") { return; }
    if (!legend.orient || sides[legend.orient] || legend.orient === "top") { legend.orient = "bottom"; }
    if (legend.orient === "bottom" && legend.columns === undefined) { legend.columns = legendColumns; }
  }
  function walk(v) {
    if (!v || typeof v !== "object") { return; }
    if (Array.isArray(v)) { v.forEach(walk); return; }
    if (v.hconcat) { v.vconcat = v.hconcat; delete v.hconcat; }
    if (v.concat && v.columns) { v.columns = 1; }
    if (v.facet && typeof v.facet === "object") {
      if (v.columns) { v.columns = 1; }
      if (v.facet.column && !v.facet.row) { v.facet.row = v.facet.column; delete v.facet.column; }
    }
    var e = v.encoding;
    if (e) {
      if (e.column && !e.row) { e.row = e.column; delete e.column; }
      if (e.facet && v.columns) { v.columns = 1; }
      channels.forEach(function (c) { if (e[c]) { legendBelow(e[c].legend); } });
    }
    if (typeof v.width === "number" && v.width > view) { v.width = view; }
    ["vconcat", "concat", "layer", "spec"].forEach(function (k) { walk(v[k]); });
  }
  walk(s);
  s.config = s.config || {};
  s.config.legend = Object.assign({}, s.config.legend, {orient: "bottom", columns: legendColumns});
  return s;
};

// Sliders over a grid encoded as log2 or an index show the reader's value ("2,048") instead of the number they
// move through: spec.usermeta.sliderLabels = {param: {min, step, labels}} (batchlab.viz.grid_param).
window.batchlabLabelSliders = function (el, spec) {
  var all = (spec.usermeta && spec.usermeta.sliderLabels) || {};
  el.querySelectorAll(".vega-bind input[type=range]").forEach(function (input) {
    var l = all[input.name];
    var shown = input.nextElementSibling;
    if (!l || !shown) { return; }
    shown.classList.add("batchlab-slider-value");
    var show = function () {
      var i = Math.round((parseFloat(input.value) - l.min) / l.step);
      shown.textContent = l.labels[i] !== undefined ? l.labels[i] : input.value;
    };
    input.batchlabShowValue = show;  // batchlabDisableControls puts the label back when the slider comes back
    input.addEventListener("input", show);
    input.addEventListener("change", show);
    show();
  });
};

// A control that does nothing in some state is disabled there: spec.usermeta.disabledBy = {param: signal}, the
// signal a boolean parameter of the chart whose expression says when (batchlab.viz.disable_when). While disabled,
// a labelled slider reads spec.usermeta.disabledShown[param] (what the chart uses instead), if given.
window.batchlabDisableControls = function (el, spec, view) {
  var by = (spec.usermeta && spec.usermeta.disabledBy) || {};
  var instead = (spec.usermeta && spec.usermeta.disabledShown) || {};
  Object.keys(by).forEach(function (param) {
    var inputs = el.querySelectorAll('.vega-bind [name="' + param + '"]');
    var apply = function (_name, off) {
      inputs.forEach(function (input) {
        input.disabled = !!off;
        var bind = input.closest(".vega-bind");
        if (bind) { bind.classList.toggle("batchlab-disabled", !!off); }
        var shown = input.nextElementSibling;
        if (instead[param] === undefined || !shown || !shown.classList.contains("batchlab-slider-value")) { return; }
        if (off) { shown.textContent = instead[param]; } else if (input.batchlabShowValue) { input.batchlabShowValue(); }
      });
    };
    view.addSignalListener(by[param], apply);
    apply(null, view.signal(by[param]));
  });
};

// vega-tooltip puts a tooltip beside the pointer and, where it would run off the right edge, flips it to the
// left, with no clamp: on a 400 px screen a wide tooltip then starts past the left edge and hides its titles.
// Keep every tooltip on the screen and no wider than it (one watcher per page, on the one tooltip element).
window.batchlabKeepTooltipsOnScreen = function () {
  if (window.batchlabTooltipWatch) { return; }
  var margin = 4;
  var clamp = function (tip) {
    var width = document.documentElement.clientWidth || window.innerWidth;
    var widest = (width - 2 * margin) + "px";
    if (tip.style.maxWidth !== widest) { tip.style.maxWidth = widest; }
    var box = tip.getBoundingClientRect();
    if (!box.width) { return; }
    var left = Math.min(Math.max(box.left, margin), Math.max(margin, width - margin - box.width));
    if (Math.abs(left - box.left) > 0.5) { tip.style.left = (parseFloat(tip.style.left) || 0) + left - box.left + "px"; }
  };
  var onTip = null;
  var find = function () {
    var tip = document.getElementById("vg-tooltip-element");
    if (!tip || tip === onTip) { return; }
    onTip = tip;  // vega-tooltip moves it by its style: clamp after each move (a clamp that changes nothing stops)
    new MutationObserver(function () { clamp(tip); }).observe(tip, {attributes: true, attributeFilter: ["style", "class"]});
    clamp(tip);
  };
  window.batchlabTooltipWatch = new MutationObserver(find);
  window.batchlabTooltipWatch.observe(document.body, {childList: true});
  find();
};

// Draw `spec` into `el`; when it is wider than its column, draw the narrow layout instead, and switch back and
// forth as the window is resized. The chart carries data-batchlab-drawn once its final layout is on the page.
window.batchlabDraw = function (el, spec, opts) {
  var state = {layout: null, wideWidth: null, result: null, busy: false};
  var column = function () { return el.clientWidth || (el.parentElement && el.parentElement.clientWidth) || 0; };
  var embed = function (s, layout) {
    if (state.result) { state.result.finalize(); }
    el.removeAttribute("data-batchlab-drawn");
    return window.vegaEmbed(el, s, opts).then(function (result) {
      state.result = result;
      state.layout = layout;
      el.setAttribute("data-batchlab-layout", layout);
      window.batchlabLabelSliders(el, spec);
      window.batchlabKeepTooltipsOnScreen();
      window.batchlabDisableControls(el, spec, result.view);
      return result;
    });
  };
  var naturalWidth = function () {
    var svg = el.querySelector("svg.marks, canvas.marks");
    return svg ? parseFloat(svg.getAttribute("width")) || svg.getBoundingClientRect().width : 0;
  };
  var fit = function () {
    if (state.busy) { return Promise.resolve(); }
    var width = column();
    var want = state.wideWidth !== null && state.wideWidth > width + 1 ? "narrow" : "wide";
    if (want === state.layout) { el.setAttribute("data-batchlab-drawn", "1"); return Promise.resolve(); }
    state.busy = true;
    var s = want === "narrow" ? window.batchlabNarrow(spec, width) : spec;
    return embed(s, want).then(function () {
      if (want === "wide") { state.wideWidth = naturalWidth(); }
      state.busy = false;
      if (want === "wide" && state.wideWidth > width + 1) { return fit(); }
      el.setAttribute("data-batchlab-drawn", "1");
    });
  };
  fit().catch(function (err) { state.busy = false; console.error("vega: " + err); });
  var timer = null;
  window.addEventListener("resize", function () {
    clearTimeout(timer);
    timer = setTimeout(function () { fit().catch(function (err) { console.error("vega: " + err); }); }, 150);
  });
};
