(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("twice-index").textContent);
  var RAW = null;
  var S = { twins: false, mixed: false, source: "", q: "", page: 0, sort: null, dir: 1,
            open: null, twin: 0, turn: null, tab: "episodes" };
  var COLORS = ["#2a5bd7", "#d9480f", "#2f9e58", "#8e44ad", "#c2255c", "#0b7285", "#e67700", "#5c677d",
                "#1864ab", "#a61e4d"];

  function detail(id) {
    if (RAW === null) { RAW = document.getElementById("twice-details").textContent; }
    var o = D.offsets[id];
    return JSON.parse(RAW.slice(o[0], o[1]));
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function add(parent) {
    for (var i = 1; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) { continue; }
      parent.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return parent;
  }
  function num(x, d) {
    if (x === null || x === undefined) { return "\u2013"; }
    if (typeof x !== "number") { return String(x); }
    return x.toFixed(d === undefined ? 3 : d);
  }
  function signed(x) {
    if (x === null || x === undefined) { return "\u2013"; }
    return (x > 0 ? "+" : "") + x.toFixed(3);
  }
  function button(text, onclick, cls) {
    var b = el("button", cls || "", text);
    b.type = "button";
    b.addEventListener("click", onclick);
    return b;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }
  function longText(text, cls, limit) {
    var box = el("div", cls);
    var pre = el("pre", "", text.length > limit ? text.slice(0, limit) + "\u2026" : text);
    box.appendChild(pre);
    if (text.length > limit) {
      var more = button("show all (" + text.length + " characters)", function (ev) {
        ev.stopPropagation();
        pre.textContent = text;
        more.remove();
      }, "more");
      box.appendChild(more);
    }
    return box;
  }

  // ------------------------------------------------------------------ skeleton
  var app = document.getElementById("app");
  app.textContent = "";
  add(app, el("h1", "", D.title));
  var sub = D.rows.length + " episodes \u00b7 " +
    D.sources.map(function (s) { return s.name + " (" + s.kind + ")"; }).join(", ");
  add(app, el("p", "sub", sub), el("p", "sub small mono", D.path));
  if (D.problems.length) {
    var det = el("details", "problems");
    add(det, el("summary", "", D.problems.length + " problem" + (D.problems.length > 1 ? "s" : "") +
      " reading the input (each damaged line or file is named; everything else is shown)"));
    var ul = el("ul");
    D.problems.slice(0, 200).forEach(function (p) { ul.appendChild(el("li", "", p)); });
    if (D.problems.length > 200) { ul.appendChild(el("li", "", "and " + (D.problems.length - 200) + " more")); }
    det.appendChild(ul);
    if (D.problems.length <= 5) { det.open = true; }
    app.appendChild(det);
  }
  var tabs = el("div", "tabs");
  var sections = {};
  var rendered = {};
  function tab(name, label, show) {
    if (!show) { return; }
    var sec = el("section");
    sec.id = "tab-" + name;
    sections[name] = sec;
    var b = button(label, function () { showTab(name); });
    b.setAttribute("data-tab", name);
    tabs.appendChild(b);
  }
  tab("episodes", "Episodes (" + D.rows.length + ")", true);
  tab("curves", "Learning curves (" + D.curves.length + ")", D.curves.length > 0);
  tab("audit", "Credit audit (" + D.scatters.length + ")", D.scatters.length > 0);
  app.appendChild(tabs);
  Object.keys(sections).forEach(function (k) { app.appendChild(sections[k]); });
  function showTab(name) {
    S.tab = name;
    Object.keys(sections).forEach(function (k) { sections[k].style.display = k === name ? "" : "none"; });
    Array.prototype.forEach.call(tabs.children, function (b) {
      b.className = b.getAttribute("data-tab") === name ? "active" : "";
    });
    if (!rendered[name]) {
      rendered[name] = true;
      if (name === "curves") { renderCurves(sections.curves); }
      if (name === "audit") { renderScatters(sections.audit); }
    }
  }

  // ------------------------------------------------------------------ episode list
  var list = sections.episodes;
  var filters = el("div", "filters");
  function check(label, key) {
    var lab = el("label");
    var box = el("input");
    box.type = "checkbox";
    box.setAttribute("data-filter", key);
    box.addEventListener("change", function () { S[key] = box.checked; S.page = 0; renderList(); });
    add(lab, box, " " + label);
    return lab;
  }
  add(filters, check("has twins", "twins"), check("mixed group", "mixed"));
  if (D.sources.length > 1) {
    var sel = el("select");
    add(sel, el("option", "", "all sources"));
    sel.options[0].value = "";
    D.sources.forEach(function (s) { var o = el("option", "", s.name); o.value = s.name; sel.appendChild(o); });
    sel.addEventListener("change", function () { S.source = sel.value; S.page = 0; renderList(); });
    filters.appendChild(sel);
  }
  var search = el("input");
  search.type = "search";
  search.placeholder = "search task or question";
  search.addEventListener("input", function () { S.q = search.value; S.page = 0; renderList(); });
  filters.appendChild(search);
  var count = el("span", "dim");
  filters.appendChild(count);
  list.appendChild(filters);
  // [id, source, task, question, return, turns, method, twins, mixed, batch, group]
  var COLS = [["#", 0, true], ["source", 1, false], ["task", 2, false], ["question", 3, false], ["return", 4, true],
              ["turns", 5, true], ["method", 6, false], ["twins", 7, true], ["batch", 9, true], ["group", 10, true]];
  if (D.sources.length < 2) { COLS = COLS.filter(function (c) { return c[1] !== 1; }); }
  var table = el("table", "list");
  var thead = el("thead"), htr = el("tr");
  COLS.forEach(function (c) {
    var th = el("th", "", c[0]);
    th.addEventListener("click", function () {
      if (S.sort === c[1]) { S.dir = -S.dir; } else { S.sort = c[1]; S.dir = 1; }
      renderList();
    });
    htr.appendChild(th);
  });
  thead.appendChild(htr);
  var tbody = el("tbody");
  add(table, thead, tbody);
  list.appendChild(table);
  var pager = el("div", "pager");
  list.appendChild(pager);
  var detailBox = el("div");
  detailBox.id = "detail";
  detailBox.style.display = "none";
  list.appendChild(detailBox);

  function filtered() {
    var out = [], q = S.q.toLowerCase();
    for (var i = 0; i < D.rows.length; i++) {
      var r = D.rows[i];
      if (S.twins && !(r[7] > 0)) { continue; }
      if (S.mixed && !r[8]) { continue; }
      if (S.source && r[1] !== S.source) { continue; }
      if (q && (r[2] + " " + r[3]).toLowerCase().indexOf(q) < 0) { continue; }
      out.push(r);
    }
    if (S.sort !== null) {
      var k = S.sort, d = S.dir;
      out.sort(function (a, b) {
        var x = a[k], y = b[k];
        if (x === y) { return a[0] - b[0]; }
        if (x === null) { return 1; }
        if (y === null) { return -1; }
        return (x < y ? -1 : 1) * d;
      });
    }
    return out;
  }
  function renderList() {
    var rows = filtered();
    var per = D.pageSize, pages = Math.max(1, Math.ceil(rows.length / per));
    S.page = Math.max(0, Math.min(S.page, pages - 1));
    tbody.textContent = "";
    rows.slice(S.page * per, S.page * per + per).forEach(function (r) {
      var tr = el("tr");
      tr.setAttribute("data-id", String(r[0]));
      if (r[0] === S.open) { tr.className = "open"; }
      COLS.forEach(function (c) {
        var v = r[c[1]];
        var text = c[1] === 4 ? num(v, 3) : (c[1] === 7 ? (v > 0 ? String(v) : "") : (v === null ? "" : String(v)));
        var td = el("td", c[2] ? "num" : "", text);
        if (c[1] === 7 && r[8]) { td.title = "mixed group"; }
        tr.appendChild(td);
      });
      tr.addEventListener("click", function () { openEpisode(r[0]); });
      tbody.appendChild(tr);
    });
    count.textContent = rows.length + " of " + D.rows.length + " episodes";
    pager.textContent = "";
    add(pager,
      button("\u2039 previous", function () { S.page -= 1; renderList(); }),
      el("span", "dim", "page " + (S.page + 1) + " of " + pages),
      button("next \u203a", function () { S.page += 1; renderList(); }));
    pager.children[0].disabled = S.page === 0;
    pager.children[2].disabled = S.page >= pages - 1;
  }

  // ------------------------------------------------------------------ one episode
  function openEpisode(id, opts) {
    opts = opts || {};
    var d = detail(id);
    S.open = id;
    S.twin = 0;
    if (opts.turn !== undefined && opts.turn !== null) {
      for (var i = 0; i < d.twins.length; i++) { if (d.twins[i].t === opts.turn) { S.twin = i; break; } }
    }
    var tw = d.twins[S.twin];
    if (opts.turn !== undefined && opts.turn !== null) { S.turn = opts.turn; }
    else { S.turn = defaultTurn(d, tw); }
    if (S.tab !== "episodes") { showTab("episodes"); }
    renderDetail(d);
    Array.prototype.forEach.call(tbody.children, function (tr) {
      tr.className = tr.getAttribute("data-id") === String(id) ? "open" : "";
    });
    if (!opts.noScroll) { detailBox.scrollIntoView({ block: "start" }); }
  }
  function defaultTurn(d, tw) {
    if (!tw) { return 0; }
    var after = tw.t + 1;
    if (after < d.turns.length && after - tw.t < tw.turns.length) { return after; }
    return tw.t;
  }
  function twinTurn(tw, u) {
    if (!tw || u < tw.t) { return null; }
    return tw.turns[u - tw.t] || null;
  }
  function turnCell(t) {
    var box = el("div");
    add(box, longText(t.text, "act", 1200));
    if (t.obs) { add(box, longText(t.obs, "obs", 600)); }
    var meta = "reward " + num(t.r, 3) + (t.inv ? " \u00b7 invalid action" : "");
    add(box, el("div", "small dim", meta));
    return box;
  }
  function kv(box, k, v) { add(box, el("span", "k", k), el("span", "mono", v)); }

  function renderDetail(d) {
    var tw = d.twins[S.twin] || null;
    detailBox.style.display = "";
    detailBox.textContent = "";
    add(detailBox, el("h2", "", "Episode " + d.id + ": " + d.task));
    if (d.question) { add(detailBox, el("p", "", d.question)); }
    var meta = [d.env, "source " + d.source, "batch " + d.batch, "group " + d.group, "return U = " + num(d.U, 3),
                d.end, d.method];
    Object.keys(d.measures || {}).forEach(function (k) { meta.push(k + " " + num(d.measures[k], 3)); });
    add(detailBox, el("p", "sub small", meta.join(" \u00b7 ")), el("p", "sub small mono", d.where));
    if (d.why) { add(detailBox, el("div", "why", "Shown alone: " + d.why + ".")); }
    if (d.twins.length) {
      var bar = el("div", "twins");
      add(bar, el("span", "dim", d.twins.length + " twin" + (d.twins.length > 1 ? "s" : "") + ":"));
      d.twins.forEach(function (w, i) {
        var label = "turn " + w.t + " \u00b7 branch " + w.k + (w.pair ? " \u00b7 pair " + w.pair : "") +
          (w.self ? " \u00b7 self" : "") + " \u00b7 D = " + signed(w.D);
        var b = button(label, function () { S.twin = i; S.turn = defaultTurn(d, w); renderDetail(d); },
          i === S.twin ? "active" : "");
        b.setAttribute("data-twin", String(i));
        bar.appendChild(b);
      });
      detailBox.appendChild(bar);
    }
    if (tw) {
      var sumBox = el("div", "kv small");
      kv(sumBox, "branch", "turn " + tw.t + ", alternative sampled on branch " + tw.k + (tw.coupled ?
        "; later turns read the factual keys (coupled twin)" : "; later turns read fresh noise (independent)"));
      kv(sumBox, "outcomes", "U = " + num(tw.U, 3) + ", U' = " + num(tw.U2, 3) + ", D = U - U' = " + signed(tw.D));
      kv(sumBox, "evidence", "same evidence: " + (tw.same_ev ? "yes" : "no") + ", coin S = " +
        (tw.S === null || tw.S === undefined ? "none drawn" : (tw.S ? "1" : "0")));
      kv(sumBox, "record", tw.where);
      detailBox.appendChild(sumBox);
      if (tw.note) { add(detailBox, el("div", "note", tw.note + ".")); }
    }
    var table = el("table", "aligned");
    var hr = el("tr");
    add(hr, el("th", "", "turn"), el("th", "", "factual"),
      el("th", "", tw ? "twin (branch " + tw.k + " at turn " + tw.t + ")" : "twin"),
      el("th", "", "credit \u00b7 coins"));
    add(table, add(el("thead"), hr));
    var body = el("tbody");
    if (d.prompt) {
      var pr = el("tr");
      add(pr, el("td", "turn", "start"), add(el("td"), longText(d.prompt, "obs", 300)),
        el("td", "dim small", tw ? "the same first observation" : ""), el("td"));
      body.appendChild(pr);
    }
    var n = d.turns.length;
    if (tw) { n = Math.max(n, tw.t + tw.turns.length); }
    var shared = [];
    if (tw && tw.t > 0) {
      var fold = el("tr", "fold");
      var cell = el("td", "dim small", "turns 0\u2013" + (tw.t - 1) + " are shared with the factual episode ");
      cell.colSpan = 4;
      add(cell, button("show them", function () {
        shared.forEach(function (r) { r.style.display = ""; });
        fold.remove();
      }, "more"));
      fold.appendChild(cell);
      body.appendChild(fold);
    }
    for (var u = 0; u < n; u++) {
      var row = turnRow(d, tw, u);
      if (tw && u < tw.t && S.turn >= tw.t) { row.style.display = "none"; shared.push(row); }
      body.appendChild(row);
    }
    if (!shared.length && body.querySelector("tr.fold")) { body.querySelector("tr.fold").remove(); }
    var tokRow = el("tr", "tokens-row");
    var tokCell = el("td");
    tokCell.colSpan = 4;
    var tokBox = el("div");
    tokBox.id = "tokens";
    tokCell.appendChild(tokBox);
    tokRow.appendChild(tokCell);
    var sel = body.querySelector("tr.row[data-turn=\"" + S.turn + "\"]");
    body.insertBefore(tokRow, sel ? sel.nextSibling : null);
    table.appendChild(body);
    detailBox.appendChild(table);
    renderTokens(d, tw);
  }
  function turnRow(d, tw, u) {
    var tr = el("tr", "row");
    tr.setAttribute("data-turn", String(u));
    if (tw && u === tw.t) { tr.className += " branch"; }
    if (u === S.turn) { tr.className += " sel"; }
    var tcell = el("td", "turn", String(u));
    if (tw && u === tw.t) { add(tcell, el("span", "badge", "branch")); }
    var f = d.turns[u];
    var fcell = el("td");
    if (f) { fcell.appendChild(turnCell(f)); }
    else { fcell.appendChild(el("span", "dim", "(the factual episode is over)")); }
    var wcell = el("td");
    if (tw) {
      var w = twinTurn(tw, u);
      if (u < tw.t) { wcell.appendChild(el("span", "dim small", "shared with the factual episode")); }
      else if (w) { wcell.appendChild(turnCell(w)); }
      else if (tw.self) { wcell.appendChild(el("span", "dim small", "self-twin: the factual episode itself")); }
      else {
        wcell.appendChild(el("span", "dim small", tw.S === false ? "(not continued: S = 0)" : "(the twin is over)"));
      }
    }
    var ncell = el("td", "nums");
    var box = el("div", "kv");
    if (f && f.credit) {
      var names = Object.keys(f.credit);
      if (names.indexOf("A*") >= 0) { names = ["A*"].concat(names.filter(function (k) { return k !== "A*"; })); }
      names.forEach(function (k) { kv(box, k, signed(f.credit[k])); });
    }
    if (f && f.coins) {
      kv(box, "q", num(f.coins.q, 3));
      kv(box, "B", f.coins.B ? "1" : "0");
      kv(box, "A_hat", signed(f.coins.A_hat));
    }
    if (tw && u === tw.t) {
      kv(box, "S", tw.S === null || tw.S === undefined ? "none" : (tw.S ? "1" : "0"));
      kv(box, "U", num(tw.U, 3));
      kv(box, "U'", num(tw.U2, 3));
      kv(box, "D", signed(tw.D));
    }
    ncell.appendChild(box);
    add(tr, tcell, fcell, wcell, ncell);
    tr.addEventListener("click", function () {
      S.turn = u;
      Array.prototype.forEach.call(tr.parentNode.children, function (x) {
        x.className = x.className.replace(/ ?\bsel\b/g, "");
      });
      tr.className += " sel";
      var tokRow = document.getElementById("tokens").parentNode.parentNode;
      tr.parentNode.insertBefore(tokRow, tr.nextSibling);
      renderTokens(d, tw);
    });
    return tr;
  }

  // ------------------------------------------------------------------ token view
  function keyText(t, j) {
    return t.key[0] + "," + t.tk[4 * j] + "," + t.tk[4 * j + 1] + "," + t.tk[4 * j + 2] + "," + t.tk[4 * j + 3];
  }
  function keyMap(t) {
    var m = {};
    if (!t || !t.ids || !t.tk) { return m; }
    for (var j = 0; j < t.ids.length; j++) { m[keyText(t, j)] = t.ids[j]; }
    return m;
  }
  function marks(t, other) {
    var m = keyMap(other), out = [];
    if (!t || !t.ids) { return out; }
    for (var j = 0; j < t.ids.length; j++) { out.push(!!t.tk && m[keyText(t, j)] === t.ids[j]); }
    return out;
  }
  function linesOf(t, same) {
    var lines = [], cur = null;
    for (var j = 0; j < t.ids.length; j++) {
      var line = t.tk ? t.tk[4 * j + 2] : 0;
      if (!cur || cur.line !== line) { cur = { line: line, toks: [] }; lines.push(cur); }
      cur.toks.push(j);
    }
    lines.forEach(function (l) { l.same = l.toks.length > 0 && l.toks.every(function (j) { return same[j]; }); });
    return lines;
  }
  function resyncLine(lines) {
    var seenDiff = false;
    for (var i = 0; i < lines.length; i++) {
      if (!lines[i].same) { seenDiff = true; }
      else if (seenDiff) { return lines[i].line; }
    }
    return null;
  }
  function visible(s) { return s.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5"); }
  function tokenColumn(title, t, same, resync) {
    var col = el("div");
    add(col, el("h3", "", title));
    if (!t) { add(col, el("p", "dim", "no turn here")); return col; }
    if (!t.ids) { add(col, el("p", "dim", "no tokens recorded for this turn (a bare trajectory record)")); return col; }
    if (!t.tk) { add(col, el("p", "dim small", "noise keys not recorded for these tokens (an older record)")); }
    var lines = linesOf(t, same);
    lines.forEach(function (l) {
      var row = el("div", "tline" + (l.line === resync ? " resync" : ""));
      row.setAttribute("data-line", String(l.line));
      var lab = el("span", "lab", t.tk ? "line " + l.line : "tokens");
      if (l.line === resync) { add(lab, el("span", "badge ok", "re-synchronised")); }
      row.appendChild(lab);
      l.toks.forEach(function (j) {
        var chip = el("span", "tok" + (same[j] ? " same" : ""));
        var text = t.tt ? visible(t.tt[j]) : "#" + t.ids[j];
        add(chip, el("span", "t", text));
        if (t.tk) {
          add(chip, el("span", "k", t.tk.slice(4 * j, 4 * j + 4).join(",")));
          chip.title = "noise key (turn " + t.tk[4 * j] + ", branch " + t.tk[4 * j + 1] + ", line " + t.tk[4 * j + 2] +
            ", pos " + t.tk[4 * j + 3] + ") of episode seed " + t.key[0] + " \u00b7 token id " + t.ids[j] +
            (same[j] ? " \u00b7 the other episode emits the same token under the same key" : "");
        } else {
          chip.title = "token id " + t.ids[j];
        }
        row.appendChild(chip);
      });
      col.appendChild(row);
    });
    return col;
  }
  function renderTokens(d, tw) {
    var box = document.getElementById("tokens");
    box.textContent = "";
    var u = S.turn;
    var f = d.turns[u] || null, w = twinTurn(tw, u);
    add(box, el("h3", "", "Tokens of turn " + u + " and their noise keys (turn, branch, line, pos)"));
    var sf = marks(f, w), sw = marks(w, f);
    var lf = f && f.ids ? linesOf(f, sf) : [], lw = w && w.ids ? linesOf(w, sw) : [];
    var rf = resyncLine(lf), rw = resyncLine(lw);
    var msg;
    if (!tw) { msg = "The factual turn's tokens, each with the key its noise was read at."; }
    else if (u < tw.t) { msg = "Before the branch the twin is the factual episode."; }
    else if (u === tw.t) { msg = "Turn " + u + " is the branch: the twin sampled it on branch " + tw.k +
      ", the factual episode on branch 0, so no key is shared here."; }
    else if (!tw.coupled) {
      msg = "An independent counterfactual reads fresh noise after the branch: no key is shared.";
    }
    else if (!w) { msg = "The twin has no turn " + u + "."; }
    else if (rw !== null || rf !== null) { msg = "The twin re-synchronised at line " + (rf !== null ? rf : rw) +
      " of turn " + u + ": from there on it emits the factual token under the same key (green)."; }
    else if (sf.length && sf.every(Boolean)) {
      msg = "Same keys, same tokens: the twin's turn " + u + " is the factual one.";
    }
    else if (sf.some(Boolean)) { msg = "Tokens marked green are emitted by both under the same key."; }
    else { msg = "The twin reads the factual keys here, but no token matches: the contexts differ."; }
    var p = el("p", "small", msg);
    p.id = "token-summary";
    box.appendChild(p);
    var legend = el("div", "legend");
    var sw1 = el("span", "sw");
    sw1.style.background = "var(--same)";
    sw1.style.border = "1px solid var(--same-edge)";
    add(legend, add(el("span"), sw1, "same token under the same key in both"),
      el("span", "dim", "under each token: turn, branch, line, pos"));
    box.appendChild(legend);
    var grid = el("div", "tokens" + (tw && u >= tw.t ? "" : " one"));
    grid.appendChild(tokenColumn("factual", f, sf, tw && u > tw.t ? rf : null));
    if (tw && u >= tw.t) { grid.appendChild(tokenColumn("twin", w, sw, u > tw.t ? rw : null)); }
    box.appendChild(grid);
  }

  // ------------------------------------------------------------------ learning curves
  function extent(values) {
    var lo = Infinity, hi = -Infinity;
    values.forEach(function (v) {
      if (v !== null && v !== undefined && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    });
    if (lo === Infinity) { return [0, 1]; }
    if (lo === hi) { return [lo - 0.5, hi + 0.5]; }
    var pad = (hi - lo) * 0.06;
    return [lo - pad, hi + pad];
  }
  function ticks(lo, hi, n, whole) {
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
    [1, 2, 5, 10].some(function (m) { if ((hi - lo) / (step * m) <= n) { step *= m; return true; } return false; });
    if (whole) { step = Math.max(1, Math.round(step)); }
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) { out.push(Math.abs(v) < 1e-12 ? 0 : v); }
    return out;
  }
  function has(v) { return v !== null && v !== undefined; }
  function label(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : parseFloat(v.toPrecision(3)).toString(); }
  function renderCurves(sec) {
    D.curves.forEach(function (c) {
      add(sec, el("h3", "", c.title));
      var W = 720, H = 320, L = 52, R = 16, T = 12, B = 36;
      var xs = [], ys = [];
      c.series.forEach(function (s) { xs = xs.concat(s.x); ys = ys.concat(s.y, s.lo, s.hi); });
      var xr = extent(xs), yr = extent(ys);
      if (xs.length) {
        xr = [Math.min.apply(null, xs), Math.max.apply(null, xs)];
        if (xr[0] === xr[1]) { xr = [xr[0] - 1, xr[1] + 1]; }
      }
      var X = function (v) { return L + (v - xr[0]) / (xr[1] - xr[0]) * (W - L - R); };
      var Y = function (v) { return H - B - (v - yr[0]) / (yr[1] - yr[0]) * (H - T - B); };
      var s = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, "class": "chart" });
      ticks(yr[0], yr[1], 5).forEach(function (v) {
        s.appendChild(svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: "#eceef2" }));
        var t = svg("text", { x: L - 6, y: Y(v) + 4, "text-anchor": "end" });
        t.textContent = label(v);
        s.appendChild(t);
      });
      ticks(xr[0], xr[1], 8, true).forEach(function (v) {
        var t = svg("text", { x: X(v), y: H - B + 16, "text-anchor": "middle" });
        t.textContent = label(v);
        s.appendChild(t);
      });
      s.appendChild(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#9aa1ad" }));
      s.appendChild(svg("line", { x1: L, x2: L, y1: T, y2: H - B, stroke: "#9aa1ad" }));
      var xl = svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" });
      xl.textContent = c.x;
      s.appendChild(xl);
      var mid = (T + H - B) / 2;
      var yl = svg("text", { x: 12, y: mid, "text-anchor": "middle", transform: "rotate(-90 12 " + mid + ")" });
      yl.textContent = c.y;
      s.appendChild(yl);
      var legend = el("div", "legend");
      c.series.forEach(function (sr, i) {
        var col = COLORS[i % COLORS.length];
        var seg = [];
        var flush = function () {
          if (seg.length > 1) {
            var pts = seg.map(function (k) { return X(sr.x[k]) + "," + Y(sr.hi[k]); })
              .concat(seg.slice().reverse().map(function (k) { return X(sr.x[k]) + "," + Y(sr.lo[k]); }));
            s.appendChild(svg("polygon", { points: pts.join(" "), fill: col, "fill-opacity": 0.15, stroke: "none" }));
          }
          seg = [];
        };
        for (var k = 0; k < sr.x.length; k++) {
          if (sr.lo[k] !== null && sr.hi[k] !== null && sr.lo[k] !== undefined) { seg.push(k); } else { flush(); }
        }
        flush();
        var d = "", started = false;
        for (k = 0; k < sr.x.length; k++) {
          if (sr.y[k] === null) { started = false; continue; }
          d += (started ? "L" : "M") + X(sr.x[k]).toFixed(1) + "," + Y(sr.y[k]).toFixed(1);
          started = true;
        }
        s.appendChild(svg("path", { d: d || "M0,0", fill: "none", stroke: col, "stroke-width": 2 }));
        for (k = 0; k < sr.x.length; k++) {
          if (sr.y[k] === null) { continue; }
          var dot = svg("circle", { cx: X(sr.x[k]), cy: Y(sr.y[k]), r: 2.6, fill: col });
          var tip = svg("title", {});
          tip.textContent = sr.name + ": " + c.x + " " + sr.x[k] + ", " + c.y + " " + num(sr.y[k], 3) +
            (has(sr.lo[k]) ? " [" + num(sr.lo[k], 3) + ", " + num(sr.hi[k], 3) + "]" : "");
          dot.appendChild(tip);
          s.appendChild(dot);
        }
        var sw = el("span", "sw");
        sw.style.background = col;
        add(legend, add(el("span"), sw, sr.name + (sr.lo.some(has) ? "" : " (no interval)")));
      });
      add(sec, legend, s);
    });
  }

  // ------------------------------------------------------------------ audit scatters
  var SCATTER = [];
  function renderScatters(sec) {
    D.scatters.forEach(function (sc, si) {
      add(sec, el("h3", "", sc.title));
      add(sec, el("p", "small dim", "Each point is an audited decision: its true advantage A* (x) against a method's " +
        "credit for it (y). Blue: same sign as A*; red: opposite sign; grey: zero credit. Wrong sign: the share of " +
        "opposite signs among decisions with |A*| >= " + D.threshold + " (zero credit is never wrong). Click a point " +
        "to open that decision's factual episode and twin."));
      if (sc.note) { add(sec, el("div", "why", sc.note)); }
      var grid = el("div", "grid");
      var names = Object.keys(sc.methods);
      var all = [];
      names.forEach(function (m) { sc.methods[m].forEach(function (p) { all.push(p[0]); }); });
      var xr = extent(all);
      SCATTER[si] = {};
      names.forEach(function (m) { grid.appendChild(scatterPanel(sc, si, m, xr)); });
      if (!names.length) { add(sec, el("p", "dim", "no decisions")); }
      sec.appendChild(grid);
    });
    var status = el("p", "small");
    status.id = "scatter-status";
    sec.appendChild(status);
  }
  function scatterPanel(sc, si, m, xr) {
    var pts = sc.methods[m];
    var W = 300, H = 240, L = 40, R = 8, T = 8, B = 28;
    var panel = el("div", "panel");
    var wrong = 0, scored = 0;
    pts.forEach(function (p) {
      if (Math.abs(p[0]) >= D.threshold) { scored += 1; if (p[1] * p[0] < 0) { wrong += 1; } }
    });
    var head = el("div", "small", m + " \u00b7 " + pts.length + " decisions \u00b7 wrong sign " +
      (scored ? (100 * wrong / scored).toFixed(1) + "%" : "\u2013"));
    head.title = "credit of the opposite sign to A*, among the " + scored + " decisions with |A*| >= " + D.threshold;
    add(panel, head);
    var yr = extent(pts.map(function (p) { return p[1]; }).concat([0]));
    var X = function (v) { return L + (v - xr[0]) / (xr[1] - xr[0]) * (W - L - R); };
    var Y = function (v) { return H - B - (v - yr[0]) / (yr[1] - yr[0]) * (H - T - B); };
    var canvas = el("canvas");
    canvas.setAttribute("data-method", m);
    var dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr;
    canvas.height = H * dpr;
    canvas.style.width = W + "px";
    canvas.style.height = H + "px";
    var g = canvas.getContext("2d");
    g.scale(dpr, dpr);
    g.strokeStyle = "#9aa1ad";
    g.strokeRect(L, T, W - L - R, H - T - B);
    g.strokeStyle = "#d0d4db";
    g.beginPath();
    g.moveTo(X(0), T); g.lineTo(X(0), H - B);
    g.moveTo(L, Y(0)); g.lineTo(W - R, Y(0));
    g.stroke();
    g.fillStyle = "#4b5563";
    g.font = "10px system-ui, sans-serif";
    g.textAlign = "center";
    ticks(xr[0], xr[1], 4).forEach(function (v) { g.fillText(label(v), X(v), H - B + 12); });
    g.fillText("A*", (L + W - R) / 2, H - 4);
    g.textAlign = "right";
    ticks(yr[0], yr[1], 4).forEach(function (v) { g.fillText(label(v), L - 4, Y(v) + 3); });
    var xy = [];
    pts.forEach(function (p) {
      var x = X(p[0]), y = Y(p[1]);
      xy.push([x, y]);
      g.fillStyle = p[1] === 0 ? "rgba(120,120,120,.55)" :
        (p[1] * p[0] < 0 ? "rgba(201,52,52,.6)" : "rgba(42,91,215,.55)");
      g.beginPath();
      g.arc(x, y, 2.4, 0, 2 * Math.PI);
      g.fill();
    });
    SCATTER[si][m] = { canvas: canvas, xy: xy };
    function nearest(ev) {
      var r = canvas.getBoundingClientRect();
      var mx = ev.clientX - r.left, my = ev.clientY - r.top, best = -1, bd = 49;
      for (var i = 0; i < xy.length; i++) {
        var dx = xy[i][0] - mx, dy = xy[i][1] - my, dd = dx * dx + dy * dy;
        if (dd < bd) { bd = dd; best = i; }
      }
      return best;
    }
    canvas.addEventListener("mousemove", function (ev) {
      var i = nearest(ev);
      canvas.title = i < 0 ? "" : m + ": A* " + num(pts[i][0], 3) + ", credit " + num(pts[i][1], 3) +
        (pts[i][2] === null ? "" : " (episode " + pts[i][2] + ", turn " + pts[i][3] + ")");
    });
    canvas.addEventListener("click", function (ev) {
      var i = nearest(ev);
      var status = document.getElementById("scatter-status");
      if (i < 0) { return; }
      if (pts[i][2] === null) {
        status.textContent = "This point has no episode record (the audit folder holds no episodes file).";
        return;
      }
      openEpisode(pts[i][2], { turn: pts[i][3] });
    });
    panel.appendChild(canvas);
    return panel;
  }

  // ------------------------------------------------------------------ start
  window.twiceView = {
    open: function (id, turn) { openEpisode(id, { turn: turn, noScroll: true }); },
    state: S,
    showTab: showTab,
    point: function (si, m, i) {
      var s = SCATTER[si] && SCATTER[si][m];
      if (!s) { return null; }
      var r = s.canvas.getBoundingClientRect();
      return { x: r.left + s.xy[i][0], y: r.top + s.xy[i][1] };
    }
  };
  showTab("episodes");
  renderList();
  window.twiceReadyAt = performance.now();
  document.documentElement.setAttribute("data-ready", "1");
})();
