// The alerts page, live: every console socket hears its user's market events; on an alert firing or resolving the
// page fetches itself again and swaps in the new lists and the bell, so a team lead can leave it open.
(function () {
  "use strict";
  const sections = document.getElementById("alert-sections");
  const stateEl = document.getElementById("alerts-live");
  if (!sections || !stateEl || !window.consoleSocket) return;
  let pending = false;
  function refresh() {
    if (pending) return;
    pending = true;
    fetch(location.href, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then((r) => r.text())
      .then((html) => {
        const doc = new DOMParser().parseFromString(html, "text/html");
        const fresh = doc.getElementById("alert-sections"), bell = doc.getElementById("alert-bell");
        const current = document.getElementById("alert-sections");  // the one the last refresh put in
        if (fresh && current) current.replaceWith(fresh);
        const mine = document.getElementById("alert-bell");
        if (bell && mine) mine.replaceWith(bell);
      })
      .finally(() => { pending = false; });
  }
  window.consoleSocket(null, stateEl, (msg) => {
    if (msg.type === "market" && msg.event && /^alert_/.test(msg.event.type || "")) refresh();
  });
}());
