// Static charts drawn from data the server put in the page (json_script): spot price history, spending.
(function () {
  "use strict";
  if (!window.uPlot) return;
  function width(el) { return Math.max(260, el.clientWidth || 600); }
  const spot = document.getElementById("spot-chart");
  const data = document.getElementById("spot-series");
  if (spot && data) {
    const s = JSON.parse(data.textContent);
    if (s.t.length) {
      const draw = () => {
        spot.innerHTML = "";
        new uPlot({ width: width(spot), height: 220, scales: { x: { time: true } }, legend: { show: false },
                    axes: [{ stroke: "#64748b" }, { stroke: "#64748b", size: 60, values: (u, v) => v.map((x) => "$" + x.toFixed(3)) }],
                    series: [{}, { label: "spot $/h", stroke: "#2563eb", width: 2, fill: "rgba(37,99,235,.08)" }] },
                  [s.t, s.price], spot);
      };
      draw();
      window.addEventListener("resize", draw);
    } else {
      spot.innerHTML = '<p class="muted">No spot prices recorded yet: the market prices each model every few seconds.</p>';
    }
  }
})();
