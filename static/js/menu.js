// The menu on a phone: at 640 px and narrower the main navigation folds behind a Menu button. Without JavaScript
// the class below is never set and the navigation simply shows (console.css), so every page stays reachable.
(function () {
  "use strict";
  document.documentElement.classList.replace("no-js", "js");
  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("#menu-button");
    if (!button) return;
    const open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", String(open));
    document.getElementById("main-nav").classList.toggle("open", open);
  });
})();
