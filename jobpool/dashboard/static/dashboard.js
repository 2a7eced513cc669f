// Keeps each page live without reloading it: every element with data-live fetches that URL (a fragment
// rendered by the server, already escaped) every data-interval ms and puts it in place when it changed.
// No other script runs on the dashboard (its Content-Security-Policy allows this file only).
"use strict";

function follow(el) {
  const src = el.dataset.live;
  const every = Number(el.dataset.interval) || 1000;
  const state = document.getElementById("live-state");
  let last = el.innerHTML;
  let busy = false;
  async function refresh() {
    // A person typing in a form inside the region would lose the text: wait until they are done.
    if (busy || document.hidden || el.contains(document.activeElement)) return;
    busy = true;
    try {
      const reply = await fetch(src, {credentials: "same-origin", cache: "no-store"});
      if (!reply.ok) throw new Error("HTTP " + reply.status);
      const html = await reply.text();
      if (html !== last) {
        el.innerHTML = html;
        last = html;
      }
      el.classList.remove("stale");
      if (state) state.textContent = "· updated " + new Date().toLocaleTimeString();
    } catch (err) {
      el.classList.add("stale");
      if (state) state.textContent = "· not updated: " + err.message;
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, every);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(follow);
});
