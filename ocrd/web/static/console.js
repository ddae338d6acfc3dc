// ocrd console: refresh the live parts of a page in place, without reloading it and
// without moving keyboard focus: only the nodes whose content changed are touched.
// Nothing else; every page works without JavaScript.
"use strict";
(function () {
  const live = document.querySelector("[data-refresh]");
  if (!live) return;
  const url = live.dataset.refresh;
  const every = Number(live.dataset.every) || 2000;

  // Make `old` look like `fresh`, keeping every node that stays the same (and so the
  // focused one, and a screen reader's place).
  function morph(old, fresh) {
    if (old.nodeType !== fresh.nodeType || old.nodeName !== fresh.nodeName) {
      old.replaceWith(fresh);
      return;
    }
    if (old.nodeType === Node.TEXT_NODE || old.nodeType === Node.COMMENT_NODE) {
      if (old.nodeValue !== fresh.nodeValue) old.nodeValue = fresh.nodeValue;
      return;
    }
    if (old.nodeType !== Node.ELEMENT_NODE) return;
    for (const attr of Array.from(old.attributes)) {
      if (!fresh.hasAttribute(attr.name)) old.removeAttribute(attr.name);
    }
    for (const attr of Array.from(fresh.attributes)) {
      if (old.getAttribute(attr.name) !== attr.value) old.setAttribute(attr.name, attr.value);
    }
    if (old.nodeName === "PROGRESS") old.value = fresh.value;
    const a = Array.from(old.childNodes);
    const b = Array.from(fresh.childNodes);
    for (let i = 0; i < b.length; i++) {
      if (i < a.length) morph(a[i], b[i]);
      else old.appendChild(b[i]);
    }
    for (let i = b.length; i < a.length; i++) a[i].remove();
  }

  async function refresh() {
    try {
      const res = await fetch(url, {credentials: "same-origin", cache: "no-store"});
      if (res.ok) {
        // server-rendered and escaped by the console's templates
        const fresh = document.createElement(live.nodeName);
        fresh.innerHTML = await res.text();
        for (const attr of Array.from(live.attributes)) fresh.setAttribute(attr.name, attr.value);
        morph(live, fresh);
        live.dataset.updated = String(Date.now());
      }
    } catch (e) {
      // the daemon restarting: try again at the next tick
    }
    setTimeout(refresh, every);
  }
  setTimeout(refresh, every);
})();
