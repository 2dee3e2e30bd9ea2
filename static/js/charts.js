// Every chart of the console: uPlot time charts with one x axis rule, in UTC and 24-hour time like the rest of the
// console. The x range is never left to the data alone: one point (or none) would make uPlot span years. Live charts
// show the last `window` seconds; a history shows its own period (`span`), at least `minSpan` seconds wide.
//
// Static charts are declared in the page: <div class="chart" data-series="ID" ...> with the data in a json_script
// element ID ({"t": [...], "<key>": [...], "span": [from, to]}); each `data-key` names the series drawn
// (data-keys="util mem": several). Live pages (lease_live.js, node_live.js) call consoleCharts.timeChart.
window.consoleCharts = (function () {
  "use strict";
  const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  const pad = (n) => String(n).padStart(2, "0");

  // Tick labels: HH:MM (HH:MM:SS under a minute apart), the date under the first tick and where the day changes.
  function timeLabels(splits, incr) {
    let lastDay = null;
    return splits.map((ts) => {
      if (ts == null) return "";
      const d = new Date(ts * 1000);
      const day = d.getUTCFullYear() * 400 + d.getUTCMonth() * 32 + d.getUTCDate();
      let text = incr >= 86400 ? "" : pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) +
        (incr < 60 ? ":" + pad(d.getUTCSeconds()) : "");
      if (day !== lastDay) text += (text ? "\n" : "") + MONTHS[d.getUTCMonth()] + " " + d.getUTCDate();
      lastDay = day;
      return text;
    });
  }

  // [min, max] of the x axis: the caller's span (or the data's), widened to at least minSpan around its end.
  function xRange(opts, dataMin, dataMax) {
    let lo, hi;
    if (opts.window) {
      hi = dataMax != null ? dataMax : Date.now() / 1000;
      lo = hi - opts.window;
    } else if (opts.span) {
      lo = opts.span[0]; hi = opts.span[1];
    } else {
      lo = dataMin; hi = dataMax;
    }
    if (lo == null || hi == null) { hi = Date.now() / 1000; lo = hi - (opts.minSpan || 60); }
    const min = opts.minSpan || 60;
    if (hi - lo < min) { const mid = (hi + lo) / 2; lo = mid - min / 2; hi = mid + min / 2; }
    return [lo, hi];
  }

  function width(el) { return Math.max(240, el.clientWidth || 300); }

  // el: the chart's box; opts: {series: [{label, stroke}], window | span, minSpan, height, yValues, stepped}.
  function timeChart(el, opts, data) {
    if (el._chart) el._chart.destroy();
    el.innerHTML = "";
    const series = [{}].concat(opts.series.map((s) => ({
      label: s.label, stroke: s.stroke || "#2563eb", width: s.width || 1.5, fill: s.fill, spanGaps: false,
      points: { show: (u, si, i0, i1) => i1 - i0 < 2 }, // a lone point is drawn, a line is not dotted
      paths: opts.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
    })));
    const u = new uPlot({
      width: width(el), height: opts.height || 170, legend: { show: false },
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
      // From the data itself: uPlot widens one point's [t, t] by a day in its own units before asking, which with
      // seconds is a thousand days.
      scales: { x: { time: true, range: (u, lo, hi) => {
        const xs = (u.data && u.data[0]) || [];
        return xs.length ? xRange(opts, xs[0], xs[xs.length - 1]) : xRange(opts, null, null);
      } } },
      axes: [
        { stroke: "#64748b", values: (u, splits, ax, space, incr) => {
          const labels = timeLabels(splits, incr);
          el.dataset.ticks = labels.join("|").replace(/\n/g, " ");
          return labels;
        } },
        // As wide as its longest label (a phone's narrow chart cut "15.435" to "5.435" at a fixed 48 px).
        { stroke: "#64748b", values: opts.yValues, size: (u, values) => Math.max(opts.ySize || 48,
          12 + 7 * Math.max(0, ...(values || []).map((v) => String(v).length))) },
      ],
      series: series,
      hooks: { setScale: [(u, key) => {
        if (key !== "x") return;
        el.dataset.xMin = String(Math.round(u.scales.x.min));
        el.dataset.xMax = String(Math.round(u.scales.x.max));
      }] },
    }, data, el);
    el._chart = u;
    return u;
  }

  // Static charts declared in the page.
  function drawDeclared() {
    for (const el of document.querySelectorAll(".chart[data-series]")) {
      const source = document.getElementById(el.dataset.series);
      if (!source) continue;
      const s = JSON.parse(source.textContent);
      const keys = (el.dataset.keys || "").split(" ").filter(Boolean);
      if (!s.t.length) {
        el.innerHTML = '<p class="muted">' + (el.dataset.empty || "Nothing recorded yet.") + "</p>";
        continue;
      }
      const money = el.dataset.money === "1";
      const draw = () => timeChart(el, {
        series: keys.map((k) => ({ label: k, stroke: "#2563eb", width: 2, fill: money ? "rgba(37,99,235,.08)" : undefined })),
        span: s.span, minSpan: Number(el.dataset.minSpan || 60), height: Number(el.dataset.height || 170),
        stepped: el.dataset.stepped === "1", ySize: money ? 60 : 48,
        yValues: money ? (u, v) => v.map((x) => "$" + x.toFixed(3)) : undefined,
      }, [s.t].concat(keys.map((k) => s[k])));
      draw();
      window.addEventListener("resize", draw);
    }
  }
  if (window.uPlot) {
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawDeclared);
    else drawDeclared();
  }

  return { timeChart: timeChart, timeLabels: timeLabels, xRange: xRange };
})();
