// The order form: show the fields of the chosen mode, and pick a reserved window on the calendar.
(function () {
  "use strict";
  const form = document.getElementById("order-form");
  if (!form) return;
  function showMode() {
    const checked = form.querySelector('input[name="mode"]:checked');
    const mode = checked ? checked.value : "on_demand";
    for (const fs of form.querySelectorAll("fieldset[data-modes], [data-modes-inline]")) {
      fs.hidden = !(fs.dataset.modes || fs.dataset.modesInline).split(" ").includes(mode);
    }
    // "Nothing: the slice only" needs none of the workload's fields.
    const run = form.querySelector("#id_workload");
    for (const box of form.querySelectorAll("[data-workload]")) box.hidden = run && run.value === "none";
  }
  form.addEventListener("change", showMode);
  showMode();
  let pickedStart = null;
  document.addEventListener("click", (ev) => {
    const slot = ev.target.closest(".calendar .slot.free");
    if (!slot) return;
    const start = form.querySelector("#id_window_start"), end = form.querySelector("#id_window_end");
    if (!pickedStart || slot.dataset.start <= pickedStart) {
      pickedStart = slot.dataset.start;
      start.value = slot.dataset.start; end.value = slot.dataset.end;
    } else {
      end.value = slot.dataset.end; pickedStart = null;
    }
    // Shown at once; the preview's refresh (the change below) draws the same window from the server's side.
    document.querySelectorAll(".calendar .slot.chosen").forEach((s) => s.classList.remove("chosen"));
    for (const s of document.querySelectorAll(".calendar .slot.free")) {
      if (s.dataset.start >= start.value && s.dataset.end <= end.value) s.classList.add("chosen");
    }
    end.dispatchEvent(new Event("change", { bubbles: true }));
  });
})();
