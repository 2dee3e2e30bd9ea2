// Live charts of a node's GPUs over the console websocket; one uPlot chart per metric, one line per GPU.
(function () {
  "use strict";
  const root = document.getElementById("charts");
  if (!root || !window.uPlot) return;
  const nodeId = root.dataset.node;
  const stateEl = document.getElementById("live-state");
  const WINDOW = 120; // seconds kept on screen
  const palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
                   "#4b5563", "#65a30d", "#7c3aed", "#0d9488"];
  // A reading the GPU cannot give arrives as null (e.g. whole-GPU utilisation in MIG mode): a gap.
  const num = (v, f) => (v === null || v === undefined ? null : f(v));
  const metrics = {
    util: (g) => num(g.util, (v) => v),
    mem: (g) => num(g.mem_used_mib, (v) => v / 1024),
    temp: (g) => num(g.temp_c, (v) => v),
    power: (g) => num(g.power_w, (v) => v),
  };
  const show = (v, unit) => (v === null || v === undefined ? "—" : Math.round(v) + unit);
  const charts = {};
  let gpuOrder = []; // uuids in series order
  const times = [];
  const series = {}; // metric -> array per gpu of values

  function colourKeys() {
    gpuOrder.forEach((u, i) => {
      const key = document.querySelector('tr[data-gpu="' + u + '"] .swatch');
      if (key) key.style.background = palette[i % palette.length];
    });
  }
  document.body.addEventListener("htmx:afterSwap", colourKeys); // the GPU table is re-rendered on changes

  function build() {
    colourKeys();
    for (const el of root.querySelectorAll(".chart")) {
      const metric = el.dataset.metric;
      // One colour key for all four charts sits in the GPU table (no legend here).
      charts[metric] = consoleCharts.timeChart(el, {
        series: gpuOrder.map((u, i) => ({ label: "gpu" + i, stroke: palette[i % palette.length] })), window: WINDOW,
      }, [times].concat(series[metric]));
    }
  }

  function onMetrics(msg) {
    const uuids = msg.gpus.map((g) => g.uuid);
    if (uuids.join() !== gpuOrder.join()) {
      gpuOrder = uuids;
      times.length = 0;
      for (const m in metrics) series[m] = gpuOrder.map(() => []);
      build();
    }
    times.push(msg.ts);
    msg.gpus.forEach((g, i) => { for (const m in metrics) series[m][i].push(metrics[m](g)); });
    while (times.length && times[0] < msg.ts - WINDOW) {
      times.shift();
      for (const m in metrics) series[m].forEach((arr) => arr.shift());
    }
    for (const m in metrics) charts[m].setData([times].concat(series[m]));
    for (const g of msg.gpus) {
      const row = document.querySelector('tr[data-gpu="' + g.uuid + '"]');
      if (!row) continue;
      row.querySelector('[data-field="util"]').textContent = show(g.util, "%");
      row.querySelector('[data-field="mem"]').textContent = show(g.mem_used_mib, "") + " / " + show(g.mem_total_mib, " MiB");
      row.querySelector('[data-field="temp"]').textContent = show(g.temp_c, " °C");
      row.querySelector('[data-field="power"]').textContent = show(g.power_w, " W");
    }
    root.dataset.samples = String(times.length);
  }

  window.consoleSocket({ node: nodeId }, stateEl, (msg) => {
    // Whatever changed between rendering the page and subscribing: fetch the table (and status) once.
    if (msg.type === "subscribed") document.body.dispatchEvent(new Event("fleet-changed"));
    else if (msg.type === "metrics") onMetrics(msg);
    else if (msg.type === "changed") {
      if (msg.change && msg.change.status) {
        const pill = document.getElementById("node-status");
        pill.textContent = msg.change.status; pill.className = "pill " + msg.change.status;
      }
      document.body.dispatchEvent(new Event("fleet-changed"));
    }
  });
  window.addEventListener("resize", () => { if (gpuOrder.length) build(); });
})();
