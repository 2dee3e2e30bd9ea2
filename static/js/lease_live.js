// A lease's page: live charts of its GPU, its container's output as it arrives, cost ticking each second,
// interruption notices with a countdown, copy buttons for the connection facts.
(function () {
  "use strict";
  const root = document.getElementById("charts");
  if (!root) return;
  const leaseId = root.dataset.lease;
  const stateEl = document.getElementById("live-state");
  const WINDOW = 120;
  const metrics = {
    util: (g) => g.util, mem: (g) => (g.mem_used_mib == null ? null : g.mem_used_mib / 1024),
    temp: (g) => g.temp_c, power: (g) => g.power_w,
  };
  const times = [];
  const series = { util: [], mem: [], temp: [], power: [] };
  const charts = {};
  // An ended lease's page draws what its GPU did while it ran (charts.js, from the page); only an open lease's
  // page watches it live.
  let live = root.dataset.live === "1";

  function build() {
    if (!window.uPlot || !live) return;
    for (const el of root.querySelectorAll(".chart")) {
      const m = el.dataset.metric;
      charts[m] = consoleCharts.timeChart(el, { series: [{ label: m }], window: WINDOW }, [times, series[m]]);
    }
  }
  build();
  window.addEventListener("resize", build);

  function onMetrics(msg) {
    if (!live) return;
    const g = msg.gpus.find((x) => x.uuid === root.dataset.gpu) || msg.gpus[0];
    if (!g) return;
    times.push(msg.ts);
    for (const m in metrics) series[m].push(metrics[m](g));
    while (times.length && times[0] < msg.ts - WINDOW) { times.shift(); for (const m in metrics) series[m].shift(); }
    for (const m in metrics) if (charts[m]) charts[m].setData([times, series[m]]);
    root.dataset.samples = String(times.length);
  }

  function money(v, places) { return "$" + v.toFixed(places); }
  function tick() {
    const cost = document.getElementById("lease-cost");
    if (cost && cost.dataset.running === "1" && cost.dataset.accruedUntil) {
      const secs = Math.max(0, Math.floor(Date.now() / 1000 - Number(cost.dataset.accruedUntil)));
      const v = Number(cost.dataset.accrued) + Number(cost.dataset.price) * secs / 3600;
      cost.textContent = money(v, 4);
    }
    for (const el of document.querySelectorAll(".countdown[data-deadline]")) {
      const left = Math.max(0, Math.round(Number(el.dataset.deadline) - Date.now() / 1000));
      el.textContent = Math.floor(left / 60) + " min " + String(left % 60).padStart(2, "0") + " s";
    }
  }
  setInterval(tick, 1000);
  tick();

  function showNotice(ev) {
    if (document.getElementById("interruption-notice")) return;
    const box = document.createElement("div");
    box.className = "card alert"; box.id = "interruption-notice"; box.setAttribute("role", "alert");
    const deadline = Date.parse(ev.deadline) / 1000;
    box.innerHTML = "<strong>Interruption notice:</strong> " + (ev.kind || "interrupted") +
      ". This spot lease stops in <span class=\"countdown\" data-deadline=\"" + deadline + "\"></span>.";
    const facts = document.getElementById("lease-facts");
    facts.parentNode.insertBefore(box, facts);
    tick();
  }

  // The container's output: chunks appended as they arrive, the oldest dropped past what the server keeps too.
  const log = document.getElementById("log-tail");
  function appendLog(data) {
    if (!log) return;
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    const keep = Number(log.dataset.keep) || 65536;
    let text = log.textContent + data;
    if (text.length > keep) text = text.slice(text.length - keep);
    log.textContent = text;
    if (atBottom) log.scrollTop = log.scrollHeight;
  }
  if (log) log.scrollTop = log.scrollHeight;

  // Copy buttons (the SSH command, URLs): the facts fragment is swapped, so listen on the document.
  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("button.copy[data-copy]");
    if (!button) return;
    const source = document.querySelector(button.dataset.copy);
    if (!source) return;
    const text = source.textContent.trim();
    const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => {});
    else {
      const area = document.createElement("textarea");
      area.value = text; document.body.appendChild(area); area.select();
      try { document.execCommand("copy"); done(); } finally { area.remove(); }
    }
  });

  // While the lease is in passage (carved, its container started, torn down), re-read its facts every 2 s.
  const changed = () => document.body.dispatchEvent(new Event("lease-changed"));
  setInterval(() => {
    if (document.querySelector("#lease-state.provisioning, #lease-state.ending")) changed();
  }, 2000);

  // The lease ended while the page was open: its facts say so (swapped in by htmx); the charts stop there.
  document.body.addEventListener("htmx:afterSwap", () => {
    const box = document.getElementById("lease-state-box");
    if (live && box && box.dataset.open !== "1") {
      live = false;
      stateEl.textContent = "stopped: the lease has ended";
      if (socket) socket.close();
    }
  });

  const socket = live ? window.consoleSocket({ lease: leaseId }, stateEl, (msg) => {
    // Subscribed: anything missed before; refused: the lease may have ended before the page subscribed.
    if (msg.type === "subscribed" || msg.type === "error") changed();
    else if (msg.type === "metrics") onMetrics(msg);
    else if (msg.type === "market" && msg.event && msg.event.lease === leaseId) {
      if (msg.event.type === "lease_log") { appendLog(msg.event.data); return; }
      if (msg.event.type === "interruption") showNotice(msg.event);
      changed();
    }
  }) : null;
})();
