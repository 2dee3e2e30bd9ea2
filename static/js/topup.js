// Top-up with Stripe.js: card entry in Stripe's card element; the wallet is credited when Stripe confirms.
(function () {
  "use strict";
  const form = document.getElementById("topup-form");
  if (!form || !window.Stripe) return;
  const stripe = window.Stripe(form.dataset.stripePk);
  const card = stripe.elements().create("card");
  card.mount("#card-element");
  const statusEl = document.getElementById("topup-status");
  const cardError = document.getElementById("card-error");
  const amount = form.querySelector("#id_amount");

  function fieldError(name, text) {
    const input = form.querySelector("#id_" + name);
    let el = document.getElementById("id_" + name + "_error");
    if (!text) { if (el) el.remove(); if (input) input.removeAttribute("aria-invalid"); return; }
    if (!el) {
      el = document.createElement("p"); el.className = "error"; el.id = "id_" + name + "_error"; el.setAttribute("role", "alert");
      input.closest(".field").appendChild(el);
    }
    el.textContent = text; input.setAttribute("aria-invalid", "true"); input.setAttribute("aria-describedby", el.id);
  }
  function showCardError(text) { cardError.hidden = !text; cardError.textContent = text || ""; }

  async function waitForCredit(before) {
    const box = document.getElementById("balance-box");
    for (let i = 0; i < 60; i++) {
      const r = await fetch(box.getAttribute("hx-get"), { headers: { "HX-Request": "true" } });
      box.innerHTML = await r.text();
      const now = Number(document.getElementById("balance").dataset.amount);
      if (now > before) return true;
      await new Promise((res) => setTimeout(res, 500));
    }
    return false;
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    fieldError("amount", ""); showCardError("");
    const before = Number(document.getElementById("balance").dataset.amount);
    const body = new FormData(form);
    body.append("idempotency_key", (crypto.randomUUID && crypto.randomUUID()) || String(Date.now()) + Math.random());
    if (form.dataset.fake) body.append("card", ((card.value || {}).card || {}).number || "");
    statusEl.textContent = "Paying…";
    const r = await fetch(form.action, { method: "POST", body, headers: { "X-Requested-With": "fetch" } });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) {
      const errs = data.errors || {};
      if (errs.amount) fieldError("amount", errs.amount.join(" "));
      const other = (errs.card || []).concat(errs.__all__ || []);
      if (other.length) showCardError(other.join(" "));
      statusEl.textContent = "";
      return;
    }
    if (data.status !== "succeeded") {
      // Real Stripe: the card element pays the intent. Local fake: only a 3-D Secure step is left.
      const result = form.dataset.fake ? await stripe.confirmCardPayment(data.client_secret)
                                       : await stripe.confirmCardPayment(data.client_secret, { payment_method: { card } });
      if (result.error) { showCardError(result.error.message || "The card was refused."); statusEl.textContent = ""; return; }
    }
    statusEl.textContent = "Waiting for Stripe to confirm…";
    statusEl.textContent = (await waitForCredit(before)) ? "Paid: the wallet is credited." : "Stripe has not confirmed yet; refresh in a moment.";
  });
})();
