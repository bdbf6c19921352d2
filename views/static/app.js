// idemlab's only script besides htmx. A plain (non-htmx) form disables its
// submit button while the request is in flight, so a double-click sends one
// request. A double-click that still gets through carries the same hidden
// idempotency_key and is answered by the server as a replay: the UI is a
// convenience, the server is the guarantee.
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (form.hasAttribute("hx-post") || form.dataset.allowDouble !== undefined) return;
  var buttons = form.querySelectorAll("button[type=submit], button:not([type])");
  setTimeout(function () {
    buttons.forEach(function (b) { b.disabled = true; b.setAttribute("aria-busy", "true"); });
  }, 0);
});

// A <details> with an id keeps the state its reader gave it across htmx
// refreshes: the self-refreshing panels (an operation, the recovery page)
// swap in fresh HTML every second, which would otherwise close an open SQL
// block or settings panel under the reader's eyes.
var detailsOpen = {};
document.addEventListener("toggle", function (event) {
  var d = event.target;
  if (d.tagName === "DETAILS" && d.id) detailsOpen[d.id] = d.open;
}, true);
document.addEventListener("htmx:afterSwap", function () {
  document.querySelectorAll("details[id]").forEach(function (d) {
    if (d.id in detailsOpen && d.open !== detailsOpen[d.id]) d.open = detailsOpen[d.id];
  });
});

// A countdown ("recovery may claim this in 12 s") counts down between the
// panel's refreshes: data-countdown is the seconds left when the server
// rendered it, data-countdown-text the sentence with %s for the time.
function startCountdowns() {
  document.querySelectorAll("[data-countdown]").forEach(function (el) {
    if (el.dataset.countdownEnds) return;
    el.dataset.countdownEnds = String(Date.now() + Number(el.dataset.countdown) * 1000);
  });
}
function tickCountdowns() {
  document.querySelectorAll("[data-countdown-ends]").forEach(function (el) {
    var left = Math.max(0, Math.ceil((Number(el.dataset.countdownEnds) - Date.now()) / 1000));
    var text = el.dataset.countdownText || "%s";
    el.textContent = left > 0 ? text.replace("%s", left + " s") : text.replace("in %s", "now").replace("%s", "now");
  });
}
document.addEventListener("DOMContentLoaded", startCountdowns);
document.addEventListener("htmx:afterSwap", startCountdowns);
setInterval(tickCountdowns, 250);
