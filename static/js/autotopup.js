// Save a card for auto top-up: a SetupIntent from the server, confirmed with Stripe.js's card element
// (confirmCardSetup); the server keeps the card once Stripe says it succeeded.
(function () {
  "use strict";
  const form = document.getElementById("card-setup-form");
  if (!form || !window.Stripe) return;
  const stripe = window.Stripe(form.dataset.stripePk);
  const card = stripe.elements().create("card");
  card.mount("#setup-card-element");
  const statusEl = document.getElementById("card-setup-status");
  const errorEl = document.getElementById("setup-card-error");
  const csrf = form.querySelector("[name=csrfmiddlewaretoken]").value;
  function showError(text) { errorEl.hidden = !text; errorEl.textContent = text || ""; statusEl.textContent = ""; }
  async function post(url) {
    const r = await fetch(url, { method: "POST", headers: { "X-CSRFToken": csrf, "X-Requested-With": "fetch" } });
    const data = await r.json().catch(() => ({}));
    return { ok: r.ok, data };
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    showError("");
    statusEl.textContent = "Saving…";
    const start = await post(form.dataset.start);
    if (!start.ok) { showError(((start.data.errors || {}).__all__ || ["Could not start saving the card."]).join(" ")); return; }
    const result = await stripe.confirmCardSetup(start.data.client_secret, { payment_method: { card } });
    if (result.error) { showError(result.error.message || "The card was refused."); return; }
    const done = await post(form.dataset.done);
    if (!done.ok) { showError(((done.data.errors || {}).__all__ || ["Stripe has not confirmed the card."]).join(" ")); return; }
    window.location.hash = "auto-topup";
    window.location.reload();
  });
})();
