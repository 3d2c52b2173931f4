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
    if (el.querySelector("figure.chart .tip:not([hidden])")) return true; // a chart's values are being read
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

  // Charts: hovering a chart shows the time and the values of the nearest point (every point's time and values are
  // in the figure's data-points; the drawing itself needs no script).
  function hover(e) {
    var fig = e.target.closest("figure.chart");
    if (!fig) return;
    var svg = fig.querySelector("svg.plot"), tip = fig.querySelector(".tip"), cur = fig.querySelector(".cursor");
    if (!svg || !tip || !svg.contains(e.target)) return;
    var pts;
    try { pts = JSON.parse(fig.getAttribute("data-points") || "[]"); } catch (err) { return; }
    if (!pts || !pts.length) return;
    var box = svg.getBoundingClientRect();
    var x = (e.clientX - box.left) / box.width * 300, best = pts[0];
    pts.forEach(function (p) { if (Math.abs(p.x - x) < Math.abs(best.x - x)) best = p; });
    var names = (svg.getAttribute("data-names") || "").split("|");
    tip.textContent = "";
    var head = document.createElement("b");
    head.textContent = best.t;
    tip.appendChild(head);
    best.v.forEach(function (v, i) {
      var row = document.createElement("div");
      row.className = "tip-row";
      row.textContent = (names.length > 1 ? names[i] + ": " : "") + v;
      tip.appendChild(row);
    });
    cur.setAttribute("x1", best.x);
    cur.setAttribute("x2", best.x);
    tip.hidden = false;
    var left = svg.offsetLeft + best.x / 300 * box.width + 8;
    if (left + tip.offsetWidth > fig.clientWidth) left = Math.max(0, left - tip.offsetWidth - 16);
    tip.style.left = left + "px";
  }
  function unhover(e) {
    var fig = e.target.closest && e.target.closest("figure.chart");
    if (!fig || fig.contains(e.relatedTarget)) return;
    var tip = fig.querySelector(".tip"), cur = fig.querySelector(".cursor");
    if (tip) tip.hidden = true;
    if (cur) { cur.setAttribute("x1", -10); cur.setAttribute("x2", -10); }
  }
  document.addEventListener("mousemove", hover);
  document.addEventListener("mouseout", unhover);
})();
