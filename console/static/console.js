// stagehand console: the little JavaScript the pages use. Pages work without it (every action is a form, every
// list a link); with it, the live parts refresh themselves and selections are easier.
"use strict";
(function () {
  var period = parseInt(document.body.getAttribute("data-refresh") || "0", 10);

  // Live parts: every element with data-live (and an id) is replaced by its newer version, fetched from the same
  // URL, every period seconds; never while the user is selecting or typing in it, nor while the tab is hidden.
  // The fetched page is parsed as an inert document: nothing in it runs.
  function busy(el) {
    if (el.querySelector("input[type=checkbox]:checked")) return true;
    var a = document.activeElement;
    return a && a !== document.body && el.contains(a) && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(a.tagName);
  }
  function refresh() {
    var live = document.querySelectorAll("[data-live][id]");
    if (!live.length || document.hidden) return;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        live.forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh && !busy(el)) el.replaceWith(document.importNode(fresh, true));
        });
        var up = doc.getElementById("updated"), mine = document.getElementById("updated");
        if (up && mine) mine.replaceWith(document.importNode(up, true));
        wire(document);
      })
      .catch(function () {});
  }
  if (period > 0) setInterval(refresh, period * 1000);

  // Selections: a "select all" box per form, and buttons that need a selection enabled only with one.
  function wire(root) {
    root.querySelectorAll("form").forEach(function (form) {
      if (form.dataset.wired) return;
      form.dataset.wired = "1";
      var boxes = function () { return form.querySelectorAll("input[type=checkbox][name=sel], input[type=checkbox][name=parked]"); };
      var update = function () {
        var any = Array.prototype.some.call(boxes(), function (b) { return b.checked; });
        form.querySelectorAll("[data-needs-selection]").forEach(function (b) { b.disabled = !any; });
      };
      form.addEventListener("change", function (e) {
        if (e.target.hasAttribute("data-select-all")) {
          boxes().forEach(function (b) { b.checked = e.target.checked; });
        }
        update();
      });
      update();
    });
  }
  wire(document);
})();
