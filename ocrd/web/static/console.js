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
    // children: matched by id where they have one, else by position among the rest
    const byId = new Map();
    for (const c of old.childNodes) if (c.id) byId.set(c.id, c);
    let cursor = old.firstChild;
    for (const f of Array.from(fresh.childNodes)) {
      let match = f.id ? byId.get(f.id) : null;
      if (!match && !f.id && cursor && !cursor.id && cursor.nodeName === f.nodeName) match = cursor;
      if (match) {
        // nodes without an id before the match are gone: remove them rather than move
        // the match (moving a node takes the focus from anything inside it)
        while (cursor && cursor !== match && !cursor.id) {
          const next = cursor.nextSibling;
          cursor.remove();
          cursor = next;
        }
        if (match !== cursor) old.insertBefore(match, cursor);
        else cursor = cursor.nextSibling;
        morph(match, f);
      } else {
        old.insertBefore(f, cursor);
      }
    }
    while (cursor) {
      const next = cursor.nextSibling;
      cursor.remove();
      cursor = next;
    }
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
