// The token view on the transcript page (#token-view): a rollout's tokens coloured by one quantity,
// masked tokens hatched, turn headers, a hover/focus card with every value of a token, and a plotly
// strip chart of the quantity along the rollout. The tokens are fetched only when the panel opens.
//
// Long rollouts: tokens are drawn in chunks (CHUNK tokens, a new chunk at each turn) inside a
// scroller of fixed height; a chunk gets its spans only while it is near the scroller's view, and
// gives them back when it leaves (keeping its measured height), so 32,000 tokens cost a few hundred
// spans. Token text is model output: it is only ever set with textContent.
(function () {
  "use strict";

  var CHUNK = 200;          // tokens per chunk (a turn also starts one)
  var MARGIN = "600px 0px"; // chunks this close to the scroller's view are drawn
  var COLOURS = {            // quantity -> [r, g, b] of its strongest colour
    sampler: [234, 88, 12], trainer: [234, 88, 12], mismatch: [220, 38, 38],
    entropy: [124, 58, 237], pos: [5, 150, 105], neg: [220, 38, 38]
  };
  var MAX_ALPHA = 0.72;      // the darkest fill still leaves the text readable
  var MASKED_ALPHA = 0.35;   // a masked token's fill, relative

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "—";
    if (v === 0) return "0";
    var a = Math.abs(v);
    return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : String(Number(v.toPrecision(4)));
  }

  function View(root) {
    this.root = root;
    this.body = root.querySelector(".tv-body");
    this.toggle = root.querySelector(".tv-toggle");
    this.scroller = root.querySelector(".tv-scroll");
    this.strip = root.querySelector(".tv-strip");
    this.card = root.querySelector(".tv-card");
    this.status = root.querySelector(".tv-status");
    this.active = -1;
    this.hover = -1;
    this.data = null;
    var self = this;
    this.toggle.addEventListener("click", function () { self.setOpen(self.body.hidden); });
    root.querySelectorAll('input[name="tv-quantity"]').forEach(function (input) {
      input.addEventListener("change", function () { if (input.checked) self.setQuantity(input.value); });
    });
    if (root.hasAttribute("data-open")) this.setOpen(true);
  }

  View.prototype.setOpen = function (open) {
    this.body.hidden = !open;
    this.toggle.setAttribute("aria-expanded", open ? "true" : "false");
    this.toggle.textContent = open ? "Hide tokens" : "Show tokens";
    // The next transcript page (j/k) opens the panel on the server side too: no shift on load.
    document.cookie = "tokens_open=" + (open ? "1" : "0") + "; path=/; SameSite=Lax";
    if (open && !this.data && !this.loading) this.load();
  };

  View.prototype.load = function () {
    var self = this;
    this.loading = true;
    this.status.textContent = "Loading " + this.root.getAttribute("data-n") + " tokens…";
    fetch(this.root.getAttribute("data-src"), {credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (data) { self.loading = false; self.build(data); })
      .catch(function (err) { self.loading = false; self.status.textContent = "The tokens could not be loaded (" + err.message + ")."; });
  };

  View.prototype.build = function (data) {
    this.data = data;
    var self = this;
    this.quantities = {};
    data.quantities.forEach(function (q) { self.quantities[q.key] = q; });
    this.root.querySelectorAll('input[name="tv-quantity"]').forEach(function (input) {
      var q = self.quantities[input.value];
      input.disabled = !(q && q.available);
      input.parentNode.title = input.disabled ? "not recorded for this rollout" : "";
    });
    this.values = {};
    this.status.textContent = data.n + " tokens" + (data.turns.length > 1 ? " · " + data.turns.length + " turns" : "") +
      (data.loss_mask ? " · " + data.loss_mask.filter(function (m) { return !m; }).length + " masked" : " · no loss mask recorded");
    this.chunks = this.makeChunks(data);
    this.scroller.textContent = "";
    this.measure();
    this.chunks.forEach(function (c, k) {
      var div = el("div", "tv-chunk");
      div.setAttribute("data-chunk", k);
      div.style.height = c.h + "px";
      c.el = div;
      self.scroller.appendChild(div);
    });
    this.observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) {
        var c = self.chunks[Number(e.target.getAttribute("data-chunk"))];
        if (e.isIntersecting) self.draw(c); else self.undraw(c);
      });
    }, {root: this.scroller, rootMargin: MARGIN});
    this.chunks.forEach(function (c) { self.observer.observe(c.el); });
    this.bindKeys();
    var checked = this.root.querySelector('input[name="tv-quantity"]:checked');
    var key = checked && !checked.disabled ? checked.value : data.default;
    if (key) {
      this.root.querySelector('input[name="tv-quantity"][value="' + key + '"]').checked = true;
      this.setQuantity(key);
    }
    this.root.setAttribute("data-loaded", "1");
  };

  // Chunks of at most CHUNK tokens; each turn starts a new one, headed by its role.
  View.prototype.makeChunks = function (data) {
    var starts = {}, out = [], i = 0;
    data.turns.forEach(function (t) { starts[t.start] = t; });
    while (i < data.n) {
      var end = Math.min(i + CHUNK, data.n);
      for (var j = i + 1; j < end; j++) if (starts[j]) { end = j; break; }
      out.push({start: i, end: end, turn: starts[i] || null, drawn: false, h: 0});
      i = end;
    }
    return out;
  };

  // A chunk's height before it is drawn, from the width of a character: close enough that the
  // scroll bar is right; the drawn height replaces it (scroll anchoring keeps the view still).
  View.prototype.measure = function () {
    var probe = el("span", "tok", "0000000000");
    this.scroller.appendChild(probe);
    var cw = probe.getBoundingClientRect().width / 10 || 8;
    var lh = parseFloat(getComputedStyle(this.scroller).lineHeight) || 20;
    this.scroller.removeChild(probe);
    var cols = Math.max(10, Math.floor((this.scroller.clientWidth - 24) / cw));
    var text = this.data.text;
    this.chunks.forEach(function (c) {
      var lines = 1, col = 0;
      for (var i = c.start; i < c.end; i++) {
        var t = text[i];
        for (var k = 0; k < t.length; k++) {
          if (t.charCodeAt(k) === 10 || ++col > cols) { lines++; col = 0; }
        }
      }
      c.h = Math.ceil(lines * lh + (c.turn ? lh + 8 : 0));
    });
  };

  View.prototype.draw = function (c) {
    if (c.drawn) return;
    var d = this.data, frag = document.createDocumentFragment(), mask = d.loss_mask;
    if (c.turn) {
      var head = el("div", "tv-turn", "turn " + c.turn.turn + " · " + (c.turn.role || "?") + (c.turn.name ? " · " + c.turn.name : ""));
      frag.appendChild(head);
    }
    for (var i = c.start; i < c.end; i++) {
      var span = el("span", "tok" + (mask && !mask[i] ? " masked" : "") + (i === this.active ? " active" : ""),
        d.text[i] === "" ? "∅" : d.text[i].replace(/\n/g, "↵\n"));
      span.id = "tok-" + i;
      span.setAttribute("role", "option");
      span.setAttribute("data-i", i);
      span.style.backgroundColor = this.colour(i);
      frag.appendChild(span);
    }
    c.el.style.height = "";
    c.el.appendChild(frag);
    c.drawn = true;
    c.el.setAttribute("data-drawn", "1");
    c.h = c.el.offsetHeight;
  };

  View.prototype.undraw = function (c) {
    if (!c.drawn || (this.active >= c.start && this.active < c.end)) return;
    c.h = c.el.offsetHeight || c.h;
    c.el.style.height = c.h + "px";
    c.el.textContent = "";
    c.drawn = false;
    c.el.removeAttribute("data-drawn");
  };

  View.prototype.chunkOf = function (i) {
    var lo = 0, hi = this.chunks.length - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (this.chunks[mid].start <= i) lo = mid; else hi = mid - 1;
    }
    return this.chunks[lo];
  };

  View.prototype.valuesOf = function (key) {
    if (this.values[key]) return this.values[key];
    var a = this.data.arrays, mask = this.data.loss_mask, n = this.data.n, out = new Array(n);
    for (var i = 0; i < n; i++) {
      var s = a.sampler_logprobs ? a.sampler_logprobs[i] : null, t = a.trainer_logprobs ? a.trainer_logprobs[i] : null;
      if (key === "sampler") out[i] = s;
      else if (key === "trainer") out[i] = t;
      else if (key === "mismatch") out[i] = s === null || t === null ? null : Math.abs(t - s);
      else if (key === "entropy") out[i] = a.entropy[i];
      else if (key === "advantage") out[i] = a.advantages[i] === null ? null : a.advantages[i] * (mask ? mask[i] : 1);
    }
    this.values[key] = out;
    return out;
  };

  View.prototype.colour = function (i) {
    var key = this.quantity;
    if (!key) return "";
    var v = this.valuesOf(key)[i], r = this.quantities[key].range;
    if (v === null || v === undefined || !r) return "";
    var c, f;
    if (key === "sampler" || key === "trainer") { c = COLOURS[key]; f = (r[1] - v) / (r[1] - r[0]); }
    else if (key === "advantage") { c = v >= 0 ? COLOURS.pos : COLOURS.neg; f = Math.abs(v) / r[1]; }
    else { c = COLOURS[key]; f = v / r[1]; }
    f = Math.max(0, Math.min(1, f));
    // Out of the loss: the value is shown, faintly (the statistics and the update ignore it).
    if (this.data.loss_mask && !this.data.loss_mask[i]) f *= MASKED_ALPHA;
    return "rgba(" + c[0] + "," + c[1] + "," + c[2] + "," + (f * MAX_ALPHA).toFixed(3) + ")";
  };

  View.prototype.setQuantity = function (key) {
    this.quantity = key;
    this.root.setAttribute("data-quantity", key);
    var self = this;
    this.chunks.forEach(function (c) {
      if (!c.drawn) return;
      for (var i = c.start; i < c.end; i++) document.getElementById("tok-" + i).style.backgroundColor = self.colour(i);
    });
    this.legend(key);
    this.drawStrip(key);
    if (this.active >= 0) this.showCard(this.active);
  };

  View.prototype.legend = function (key) {
    var q = this.quantities[key], r = q.range, scale = this.root.querySelector(".tv-scale");
    var lo = this.root.querySelector(".tv-lo"), hi = this.root.querySelector(".tv-hi");
    var c = COLOURS[key] || COLOURS.pos, strong = "rgba(" + c.join(",") + "," + MAX_ALPHA + ")";
    var weak = "rgba(" + c.join(",") + ",0)";
    if (key === "advantage") {
      var n = "rgba(" + COLOURS.neg.join(",") + "," + MAX_ALPHA + ")";
      scale.style.backgroundImage = "linear-gradient(to right, " + n + ", rgba(255,255,255,0), " + strong + ")";
    } else if (key === "sampler" || key === "trainer") {
      scale.style.backgroundImage = "linear-gradient(to right, " + strong + ", " + weak + ")";
    } else {
      scale.style.backgroundImage = "linear-gradient(to right, " + weak + ", " + strong + ")";
    }
    lo.textContent = fmt(r[0]);
    hi.textContent = fmt(r[1]) + (q.unit ? " " + q.unit : "");
    this.root.querySelector(".tv-label").textContent = q.label;
  };

  // plotly.js (3 MB) is fetched only when a panel opens: a transcript page never loads it otherwise.
  View.prototype.drawStrip = function (key) {
    var fig = this.data.figures[key], self = this;
    if (!fig) return;
    if (typeof Plotly === "undefined") {
      if (!this.plotlyLoading) {
        this.plotlyLoading = true;
        var script = document.createElement("script");
        script.src = this.root.getAttribute("data-plotly");
        script.onload = function () { self.drawStrip(self.quantity); };
        document.head.appendChild(script);
      }
      return;
    }
    var config = {displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"]};
    if (!this.stripDrawn) {
      Plotly.newPlot(this.strip, fig.data, fig.layout, config);
      this.strip.on("plotly_click", function (ev) {
        if (!ev.points || !ev.points.length) return;
        self.setActive(Math.round(Number(ev.points[0].x)));
        self.scroller.focus({preventScroll: true});
      });
      this.stripDrawn = true;
      this.root.setAttribute("data-strip", "1");
    } else {
      Plotly.react(this.strip, fig.data, fig.layout, config);
    }
  };

  View.prototype.setActive = function (i) {
    var n = this.data.n;
    i = Math.max(0, Math.min(n - 1, i));
    var old = document.getElementById("tok-" + this.active);
    if (old) old.classList.remove("active");
    this.active = i;
    this.draw(this.chunkOf(i));
    var span = document.getElementById("tok-" + i);
    span.classList.add("active");
    this.scroller.setAttribute("aria-activedescendant", span.id);
    this.root.setAttribute("data-active", i);
    var s = this.scroller, r = span.getBoundingClientRect(), box = s.getBoundingClientRect();
    var top = r.top - box.top - s.clientTop + s.scrollTop;  // the token's place in the scrolled text
    if (top < s.scrollTop) s.scrollTop = top - 8;
    else if (top + r.height > s.scrollTop + s.clientHeight) s.scrollTop = top + r.height - s.clientHeight + 8;
    this.showCard(i);
  };

  View.prototype.cardRows = function (i) {
    var d = this.data, a = d.arrays, rows = [];
    var turn = d.turn ? d.turn[i] : null, role = "";
    if (turn !== null) d.turns.forEach(function (t) { if (t.turn === turn) role = t.role; });
    var s = a.sampler_logprobs ? a.sampler_logprobs[i] : undefined, t = a.trainer_logprobs ? a.trainer_logprobs[i] : undefined;
    rows.push(["token", "#" + i + " · id " + d.ids[i]]);
    rows.push(["text", JSON.stringify(d.text[i])]);
    if (turn !== null) rows.push(["turn", turn + (role ? " · " + role : "")]);
    if (s !== undefined) rows.push(["sampler log-prob", fmt(s)]);
    if (t !== undefined) rows.push(["trainer log-prob", fmt(t)]);
    if (s !== undefined && t !== undefined) {
      var delta = s === null || t === null ? null : t - s;
      rows.push(["delta (trainer − sampler)", fmt(delta)]);
      rows.push(["importance ratio", delta === null ? "—" : fmt(Math.exp(delta))]);
    }
    if (a.ref_logprobs) rows.push(["reference log-prob", fmt(a.ref_logprobs[i])]);
    if (a.entropy) rows.push(["entropy", fmt(a.entropy[i])]);
    if (a.advantages) rows.push(["advantage", fmt(a.advantages[i])]);
    rows.push(["loss mask", d.loss_mask ? (d.loss_mask[i] ? "1 · in the loss" : "0 · masked, not trained on") : "not recorded"]);
    return rows;
  };

  View.prototype.showCard = function (i) {
    var span = document.getElementById("tok-" + i);
    if (!span) { this.card.hidden = true; return; }
    var dl = el("dl", "kv");
    this.cardRows(i).forEach(function (r) {
      dl.appendChild(el("dt", "", r[0]));
      dl.appendChild(el("dd", r[0] === "text" ? "mono" : "num", r[1]));
    });
    this.card.textContent = "";
    this.card.appendChild(dl);
    this.card.setAttribute("data-token", i);
    this.card.hidden = false;
    var box = this.body.getBoundingClientRect(), r = span.getBoundingClientRect();
    var sbox = this.scroller.getBoundingClientRect();
    var w = this.card.offsetWidth, h = this.card.offsetHeight;
    var left = Math.max(0, Math.min(r.left - box.left, box.width - w));
    var top = r.bottom - box.top + 6;
    if (r.bottom + 6 + h > sbox.bottom) top = r.top - box.top - h - 6;  // above the token
    this.card.style.left = left + "px";
    this.card.style.top = Math.max(0, top) + "px";
  };

  // The token on the next (dir 1) or previous (-1) visual line nearest the active token's left
  // edge. A token wrapped over two lines counts by its first line's top.
  View.prototype.lineMove = function (dir) {
    var cur = document.getElementById("tok-" + this.active);
    if (!cur) return this.active + dir;
    var here = cur.getClientRects()[0], top = here.top, x = here.left, best = null, line = null;
    for (var k = 1, i = this.active + dir; k < 4000 && i >= 0 && i < this.data.n; k++, i += dir) {
      this.draw(this.chunkOf(i));
      var box = document.getElementById("tok-" + i).getClientRects()[0];
      if (!box) continue;
      if (dir > 0 ? box.top <= top + 1 : box.top >= top - 1) continue;
      if (line === null) line = box.top;
      if (Math.abs(box.top - line) > 1) break;
      if (dir > 0 ? box.left <= x + 1 || best === null : true) best = i;
      if (dir < 0 && box.left <= x + 1) break;
    }
    return best === null ? this.active + dir : best;
  };

  View.prototype.turnMove = function (dir) {
    var starts = this.data.turns.map(function (t) { return t.start; }), a = this.active;
    if (dir > 0) { for (var k = 0; k < starts.length; k++) if (starts[k] > a) return starts[k]; return this.data.n - 1; }
    for (var j = starts.length - 1; j >= 0; j--) if (starts[j] < a) return starts[j];
    return 0;
  };

  View.prototype.bindKeys = function () {
    var self = this, s = this.scroller;
    s.addEventListener("focus", function () {
      if (self.active < 0) self.setActive(self.firstVisible()); else self.showCard(self.active);
    });
    s.addEventListener("blur", function () { if (self.hover < 0) self.card.hidden = true; });
    s.addEventListener("keydown", function (ev) {
      if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
      var moves = {
        ArrowRight: function () { return self.active + 1; }, ArrowLeft: function () { return self.active - 1; },
        ArrowDown: function () { return self.lineMove(1); }, ArrowUp: function () { return self.lineMove(-1); },
        PageDown: function () { return self.active + CHUNK; }, PageUp: function () { return self.active - CHUNK; },
        Home: function () { return 0; }, End: function () { return self.data.n - 1; },
        "]": function () { return self.turnMove(1); }, "[": function () { return self.turnMove(-1); }
      };
      if (ev.key === "Escape") { self.card.hidden = true; return; }
      if (!moves[ev.key]) return;
      ev.preventDefault();
      ev.stopPropagation();  // j/k and other page shortcuts stay with the page
      self.setActive(moves[ev.key]());
    });
    s.addEventListener("mouseover", function (ev) {
      var t = ev.target;
      if (!t.classList || !t.classList.contains("tok")) return;
      self.hover = Number(t.getAttribute("data-i"));
      self.showCard(self.hover);
    });
    s.addEventListener("mouseleave", function () {
      self.hover = -1;
      if (document.activeElement === s && self.active >= 0) self.showCard(self.active); else self.card.hidden = true;
    });
    s.addEventListener("click", function (ev) {
      var t = ev.target;
      if (!t.classList || !t.classList.contains("tok")) return;
      self.setActive(Number(t.getAttribute("data-i")));
      s.focus({preventScroll: true});
    });
  };

  View.prototype.firstVisible = function () {
    var top = this.scroller.getBoundingClientRect().top, spans = this.scroller.querySelectorAll(".tok");
    for (var k = 0; k < spans.length; k++) if (spans[k].getBoundingClientRect().bottom > top) return Number(spans[k].getAttribute("data-i"));
    return 0;
  };

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("token-view");
    if (root && root.querySelector(".tv-body")) root._view = new View(root);
  });
})();
