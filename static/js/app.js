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

  // Charts in view are drawn at once, in one go (measured: a frame between each, so the page painted
  // between charts, made the screen complete later); only then are the ones below the fold watched, and
  // drawn one per frame as they come near. Each plotly figure costs tens of ms: drawing thirty up front,
  // or the ones just below the fold alongside those in view, kept the dashboard busy for seconds.
  function drawCharts(root) {
    var section = root.querySelector("[data-figures]");
    if (!section || typeof Plotly === "undefined") return;
    var blob = document.getElementById(section.getAttribute("data-figures"));
    if (!blob) return;
    section._figures = JSON.parse(blob.textContent);
    var later = [], queue = [], pumping = false;
    section.querySelectorAll("[data-chart]").forEach(function (el) {
      if (el.getBoundingClientRect().top < window.innerHeight) drawOne(section, el);
      else later.push(el);
    });
    function pump() {
      var el = queue.shift();
      if (el) { drawOne(section, el); window.requestAnimationFrame(pump); } else pumping = false;
    }
    function draw(el) {
      queue.push(el);
      if (!pumping) { pumping = true; window.requestAnimationFrame(pump); }
    }
    var observer = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        if (e.isIntersecting) { observer.unobserve(e.target); draw(e.target); }
      });
    }, {rootMargin: "300px 0px"}) : null;
    section._observe = function (el) { if (observer) observer.observe(el); else draw(el); };
    // Watching starts on the next frame, once the charts in view are on screen.
    window.requestAnimationFrame(function () { later.forEach(section._observe); });
    live(section);
  }

  function addMetricChart(section, id) {
    var grid = section.querySelector("#metric-charts");
    if (!grid || id.indexOf("metric:") !== 0) return null;
    var el = document.createElement("div");
    el.className = "chart";
    el.setAttribute("data-chart", id);
    grid.appendChild(el);
    section._observe(el);
    return el;
  }

  // The header of a live run follows it: the status badge and the group and rollout counts.
  function updateHeader(body) {
    var badge = document.querySelector("#run-status .status");
    if (badge && body.badge) {
      badge.className = "status status-" + body.badge;
      badge.textContent = body.badge;
    }
    [["run-groups", body.n_groups], ["run-rollouts", body.n_rollouts]].forEach(function (pair) {
      var el = document.getElementById(pair[0]);
      if (el && typeof pair[1] === "number") el.textContent = String(pair[1]);
    });
  }

  function updateCharts(section, figures) {
    if (!section.querySelector('[data-chart="reward"]') && figures.reward && figures.reward.data[2].x.length) {
      window.location.reload();  // the first rollouts of a run: the page has no chart layout yet
      return;
    }
    section._figures = figures;
    Object.keys(figures).forEach(function (id) {
      var el = chartEl(section, id) || addMetricChart(section, id);
      if (el && el.getAttribute("data-drawn")) Plotly.react(el, figures[id].data, figures[id].layout, PLOT_CONFIG);
    });
  }

  // The first step the page may lack: the lowest last step over every trace (a metric the trainer logs
  // later than the rollouts must not be skipped). Null when the page has no points yet.
  function lastCommonStep(section) {
    var since = null;
    Object.keys(section._figures).forEach(function (id) {
      section._figures[id].data.forEach(function (t) {
        var last = t.x.length ? t.x[t.x.length - 1] : null;
        if (last !== null && (since === null || last < since)) since = last;
      });
    });
    return since;
  }

  // New points from step `since` on: each trace drops what it holds from that step (the server sends it
  // again, complete) and is extended. A drawn chart through Plotly.extendTraces; one not drawn yet
  // (below the fold) in its figure, drawn whole when it comes into view. False when a chart is missing.
  function extendCharts(section, points, since) {
    var ids = Object.keys(points), missing = false;
    ids.forEach(function (id) {
      var fig = section._figures[id], el = chartEl(section, id);
      if (!fig || !el) { if (points[id].x.some(function (x) { return x.length; })) missing = true; return; }
      var idx = [], xs = [], ys = [];
      fig.data.forEach(function (t, i) {
        var keep = t.x.length;
        while (keep && t.x[keep - 1] >= since) keep--;
        t.x.length = keep;  // in place: a drawn chart's traces are these very objects
        t.y.length = keep;
        idx.push(i); xs.push(points[id].x[i] || []); ys.push(points[id].y[i] || []);
      });
      if (el.getAttribute("data-drawn")) Plotly.extendTraces(el, {x: xs, y: ys}, idx);
      else fig.data.forEach(function (t, i) { t.x = t.x.concat(xs[i]); t.y = t.y.concat(ys[i]); });
    });
    return !missing;
  }

  function chartEl(section, id) {
    var found = null;
    section.querySelectorAll("[data-chart]").forEach(function (c) { if (c.getAttribute("data-chart") === id) found = c; });
    return found;
  }

  // While a run is live: poll its small JSON endpoint. Something new since the version the page holds
  // comes back as the points from the page's last step on; whole figures only when the page lacks a
  // chart (a metric first logged after it loaded). The last answer (run ended) stops the polling.
  function live(section) {
    var url = section.getAttribute("data-live");
    if (!url) return;
    var version = section.getAttribute("data-live-version") || "", whole = false;
    function schedule() { window.setTimeout(poll, LIVE_MS); }
    function poll() {
      var since = whole ? null : lastCommonStep(section);
      var q = "?version=" + encodeURIComponent(version) + (since === null ? "" : "&since=" + since);
      fetch(url + q, {credentials: "same-origin"})
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (body) {
          if (!body) { schedule(); return; }
          updateHeader(body);
          // A page of one-step results (an eval) draws no per-step charts: only its header follows.
          if (section.hasAttribute("data-static-charts")) { body.figures = body.points = null; }
          whole = false;
          if (body.figures) updateCharts(section, body.figures);
          if (body.points && !extendCharts(section, body.points, body.since)) {
            whole = true;  // ask again for whole figures, from the version before this answer
            window.setTimeout(poll, 0);
            return;
          }
          version = body.version;
          section.setAttribute("data-live-version", version);
          if (body.finished) section.removeAttribute("data-live"); else schedule();
        })
        .catch(schedule);
    }
    schedule();
  }

  // A progress block swapped in by its poll: a folded log the reader opened stays open, and the
  // "Run N queued." note of the launch says what became of the run.
  var logOpen = null;
  document.addEventListener("htmx:beforeSwap", function (ev) {
    var log = ev.detail.target && ev.detail.target.querySelector && ev.detail.target.querySelector("details.run-log");
    logOpen = log ? log.open : null;
  });
  document.addEventListener("htmx:afterSwap", function (ev) {
    var log = ev.detail.target && ev.detail.target.querySelector && ev.detail.target.querySelector("details.run-log");
    if (log && logOpen !== null) log.open = logOpen;
    var block = document.querySelector(".progress-block[data-status]");
    if (block) updateFlash(block.getAttribute("data-status"));
  });

  function updateFlash(status) {
    document.querySelectorAll(".messages li.run-flash").forEach(function (li) {
      var m = /run-flash-(\d+)/.exec(li.className);
      if (!m || status === "queued") return;
      li.textContent = "Run " + m[1] + (status === "running" ? " is running." : " " + status + ".");
      if (status !== "running") li.className = li.className.replace(/\bsuccess\b/, "") + " ended";
    });
  }

  // The progress poll announces the end of a run: refresh what the end changes (diagnostics, actions).
  document.addEventListener("run-finished", function () {
    if (typeof htmx === "undefined") return;
    document.querySelectorAll("[data-refresh-on-finish]").forEach(function (el) {
      // Each refresh is its own source: htmx drops a second request from one source while the
      // first is in flight (the dashboard refreshes both its results and its diagnostics).
      htmx.ajax("GET", window.location.pathname, {source: el, target: "#" + el.id, select: "#" + el.id, swap: "outerHTML"});
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
  // Only a swap of the explorer's table scrolls to the top: a live page's progress poll must not move
  // the reader (it did, every 3 s, on a running run's dashboard).
  document.addEventListener("htmx:afterSwap", function (ev) {
    if (!ev.detail.target || ev.detail.target.id !== "explorer-table") return;
    window.scrollTo({top: 0});
    var table = document.getElementById("rollout-table");
    var form = document.getElementById("explorer-filters");
    if (!table || !form) return;
    form.elements.sort.value = table.getAttribute("data-sort");
    form.elements.order.value = table.getAttribute("data-order");
  });
})();
