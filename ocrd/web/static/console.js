// ocrd console: refresh the live parts of a page without reloading it. Nothing else;
// every page works without JavaScript.
"use strict";
(function () {
  const live = document.querySelector("[data-refresh]");
  if (!live) return;
  const url = live.dataset.refresh;
  const every = Number(live.dataset.every) || 2000;
  async function refresh() {
    try {
      const res = await fetch(url, {credentials: "same-origin", cache: "no-store"});
      if (res.ok) {
        // server-rendered and escaped by the console's templates
        live.innerHTML = await res.text();
        live.dataset.updated = String(Date.now());
      }
    } catch (e) {
      // the daemon restarting: try again at the next tick
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
