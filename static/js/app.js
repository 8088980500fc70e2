// Page behaviour: plotly charts from an embedded JSON blob, chart clicks -> explorer at that step,
// and keyboard navigation (j/k/Enter/g) in the explorer and on the transcript page. No inline handlers
// receive model text: everything here reads data attributes and JSON parsed by the browser.
(function () {
  "use strict";

  var LIVE_MS = 3000;  // a live run's dashboard asks for new steps this often (a small JSON answer)
  var PLOT_CONFIG = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"]};

  function drawOne(section, el) {
    var fig = section._figures[el.getAttribute("data-chart")];
    if (!fig || el.getAttribute("data-drawn")) return;
    el.setAttribute("data-drawn", "1");
    Plotly.newPlot(el, fig.data, fig.layout, PLOT_CONFIG);
    var explorer = section.getAttribute("data-explorer");
    el.on("plotly_click", function (ev) {
      if (!ev.points || !ev.points.length) return;
      var step = Math.round(Number(ev.points[0].x));
      if (!isFinite(step)) return;
      window.location.href = explorer + "?step_min=" + step + "&step_max=" + step;
    });
  }

  // Charts in view are drawn at once; the ones below the fold when they come near (each plotly figure
  // costs tens of ms: drawing thirty of them up front kept the dashboard busy for seconds).
  function drawCharts(root) {
    var section = root.querySelector("[data-figures]");
    if (!section || typeof Plotly === "undefined") return;
    var blob = document.getElementById(section.getAttribute("data-figures"));
    if (!blob) return;
    section._figures = JSON.parse(blob.textContent);
    var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { observer.unobserve(e.target); drawOne(section, e.target); }
      });
    }, {rootMargin: "300px 0px"}) : null;
    section._observer = observer;
    var now = [];
    section.querySelectorAll("[data-chart]").forEach(function (el) {
      if (!observer || el.getBoundingClientRect().top < window.innerHeight) now.push(el);
      else observer.observe(el);
    });
    // One chart per frame: the page paints and answers input between charts instead of after all of them.
    (function next() {
      var el = now.shift();
      if (!el) return;
      drawOne(section, el);
      window.requestAnimationFrame(next);
    })();
    live(section);
  }

  function addMetricChart(section, id) {
    var grid = section.querySelector("#metric-charts");
    if (!grid || id.indexOf("metric:") !== 0) return null;
    var el = document.createElement("div");
    el.className = "chart";
    el.setAttribute("data-chart", id);
    grid.appendChild(el);
    if (section._observer) section._observer.observe(el); else drawOne(section, el);
    return el;
  }

  function updateCharts(section, figures) {
    if (!section.querySelector('[data-chart="reward"]') && figures.reward && figures.reward.data[2].x.length) {
      window.location.reload();  // the first rollouts of a run: the page has no chart layout yet
      return;
    }
    section._figures = figures;
    Object.keys(figures).forEach(function (id) {
      var el = null;
      section.querySelectorAll("[data-chart]").forEach(function (c) { if (c.getAttribute("data-chart") === id) el = c; });
      if (!el) el = addMetricChart(section, id);
      if (el && el.getAttribute("data-drawn")) Plotly.react(el, figures[id].data, figures[id].layout, PLOT_CONFIG);
    });
  }

  // While a run is live: poll its small JSON endpoint; figures come back only when a step was stored.
  function live(section) {
    var url = section.getAttribute("data-live");
    if (!url) return;
    var version = section.getAttribute("data-live-version") || "";
    function schedule() { window.setTimeout(poll, LIVE_MS); }
    function poll() {
      fetch(url + "?version=" + encodeURIComponent(version), {credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (!body) { schedule(); return; }
          version = body.version;
          section.setAttribute("data-live-version", version);
          if (body.figures) updateCharts(section, body.figures);
          if (body.finished) section.removeAttribute("data-live"); else schedule();
        })
        .catch(schedule);
    }
    schedule();
  }

  // The progress poll announces the end of a run: refresh what the end changes (diagnostics, actions).
  document.addEventListener("run-finished", function () {
    if (typeof htmx === "undefined") return;
    document.querySelectorAll("[data-refresh-on-finish]").forEach(function (el) {
      htmx.ajax("GET", window.location.pathname, {target: "#" + el.id, select: "#" + el.id, swap: "outerHTML"});
    });
  });

  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("#rollout-table tbody tr[data-href]"));
  }

  function select(index) {
    var all = rows();
    if (!all.length) return;
    index = Math.max(0, Math.min(index, all.length - 1));
    all.forEach(function (r) { r.classList.remove("selected"); r.removeAttribute("aria-selected"); });
    all[index].classList.add("selected");
    all[index].setAttribute("aria-selected", "true");
    all[index].scrollIntoView({block: "nearest"});
  }

  function selectedIndex() {
    return rows().findIndex(function (r) { return r.classList.contains("selected"); });
  }

  function typing(ev) {
    var t = ev.target;
    return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(ev)) return;
    var table = document.getElementById("rollout-table");
    if (table) {
      var i = selectedIndex();
      if (ev.key === "j") { select(i + 1); ev.preventDefault(); return; }
      if (ev.key === "k") { select(i < 0 ? 0 : i - 1); ev.preventDefault(); return; }
      if (ev.key === "Enter" && i >= 0) { window.location.href = rows()[i].getAttribute("data-href"); return; }
      if (ev.key === "g" && i >= 0) { window.location.href = rows()[i].getAttribute("data-group-href"); return; }
      if (ev.key === "/") {
        var s = document.getElementById("explorer-search");
        if (s) { s.focus(); ev.preventDefault(); }
        return;
      }
    }
    // Links that declare a single-key shortcut (e.g. "e": explore rollouts from the dashboard).
    var hot = /^[a-z]$/.test(ev.key) && document.querySelector('a[data-hotkey="' + ev.key + '"]');
    if (hot) { window.location.href = hot.getAttribute("href"); ev.preventDefault(); return; }
    // Transcript page: j/k walk the explorer order the user came from.
    var link = ev.key === "j" ? document.getElementById("next-rollout")
      : ev.key === "k" ? document.getElementById("prev-rollout") : null;
    if (link) { window.location.href = link.getAttribute("href"); ev.preventDefault(); }
  });

  // Clicking a row (outside its links) selects it, so the keyboard continues from there.
  document.addEventListener("click", function (ev) {
    var tr = ev.target.closest && ev.target.closest("#rollout-table tbody tr[data-href]");
    if (tr && !ev.target.closest("a")) select(rows().indexOf(tr));
  });

  document.addEventListener("DOMContentLoaded", function () { drawCharts(document); });
  // A swapped explorer table starts with no selection (j selects its first row). A column-header click
  // changes the sort outside the filter form: copy it back so "Apply" keeps the sort the user sees.
  document.addEventListener("htmx:afterSwap", function () {
    window.scrollTo({top: 0});
    var table = document.getElementById("rollout-table");
    var form = document.getElementById("explorer-filters");
    if (!table || !form) return;
    form.elements.sort.value = table.getAttribute("data-sort");
    form.elements.order.value = table.getAttribute("data-order");
  });
})();
