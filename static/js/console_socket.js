// The console websocket of the live pages: subscribe once open (unless `subscribe` is null), show its state in stateEl ("live", an error,
// "reconnecting…"), reconnect with jittered backoff. Every message also goes to onMessage. Returns {close()}: a
// page whose subject is over (an ended lease) stops listening and does not reconnect.
window.consoleSocket = function (subscribe, stateEl, onMessage) {
  "use strict";
  let retry = 500, ws = null, closed = false;
  function connect() {
    ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/console/");
    // Without a subscription the socket hears only the user's own market events (alerts, leases), which need none.
    ws.onopen = () => { retry = 500; if (subscribe) ws.send(JSON.stringify({ subscribe: subscribe })); else stateEl.textContent = "live"; };
    ws.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      if (msg.type === "subscribed") stateEl.textContent = "live";
      else if (msg.type === "error") stateEl.textContent = msg.message;
      onMessage(msg);
    };
    ws.onclose = () => {
      if (closed) return;
      stateEl.textContent = "reconnecting…";
      setTimeout(connect, retry + Math.random() * retry);
      retry = Math.min(retry * 2, 15000);
    };
  }
  connect();
  return { close: () => { closed = true; if (ws) ws.close(); } };
};
