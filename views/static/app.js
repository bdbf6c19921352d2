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
