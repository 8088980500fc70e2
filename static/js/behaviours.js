// Behaviour charts (webapp/behaviours): figures from a JSON blob named by data-behaviour-figures; a
// click opens the explorer at that step with the behaviour's query; a live run's panel polls its
// JSON (data-live) and redraws. Names reach plotly escaped by the server (charts.py @escaped).
(function () {
  "use strict";

  var LIVE_MS = 5000;
  var CONFIG = {displaylogo: false, responsive: true};

  function draw(root) {
    root.querySelectorAll("[data-behaviour-figures]").forEach(function (section) {
      if (section.getAttribute("data-drawn") || typeof Plotly === "undefined") return;
      var blob = document.getElementById(section.getAttribute("data-behaviour-figures"));
      if (!blob) return;
      section.setAttribute("data-drawn", "1");
      var figures = JSON.parse(blob.textContent);
      section.querySelectorAll("[data-chart]").forEach(function (el) {
        var fig = figures[el.getAttribute("data-chart")];
        if (!fig) return;
        Plotly.newPlot(el, fig.data, fig.layout, CONFIG);
        var explorer = el.getAttribute("data-explorer");
        if (explorer) {
          el.on("plotly_click", function (ev) {
            var step = ev.points && ev.points.length ? Math.round(Number(ev.points[0].x)) : NaN;
            if (isFinite(step)) window.location.href = explorer + "&step_min=" + step + "&step_max=" + step;
          });
        }
        el.setAttribute("data-drawn", "1");
      });
      var live = section.getAttribute("data-live");
      if (live) poll(section, live);
    });
  }

  function poll(section, url) {
    window.setTimeout(function () {
      fetch(url, {credentials: "same-origin"}).then(function (r) { return r.ok ? r.json() : null; })
        .then(function (figures) {
          if (figures) {
            section.querySelectorAll("[data-chart]").forEach(function (el) {
              var fig = figures[el.getAttribute("data-chart")];
              if (fig) Plotly.react(el, fig.data, fig.layout, CONFIG);
            });
          }
          if (document.body.contains(section)) poll(section, url);
        }).catch(function () { poll(section, url); });
    }, LIVE_MS);
  }

  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:afterSettle", function (ev) { draw(ev.target || document); });
  // Plotly is deferred like this script: draw once it is there if the panel came first.
  window.addEventListener("load", function () { draw(document); });
})();
