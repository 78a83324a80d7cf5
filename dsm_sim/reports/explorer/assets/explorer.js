/* The run explorer: reads the inline JSON, scrubs through its precomputed instants.
   No library, nothing fetched: the report must open from a CI artefact or a mail. */
(function () {
  "use strict";
  // Parts of the static report (the violating trace) follow the script: start once all is parsed.
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
  function start() {
  var el = document.getElementById("dsm-explorer-data");
  var root = document.getElementById("explorer");
  if (!el || !root) { return; }
  var started = performance.now();
  var D = JSON.parse(el.textContent);
  var S = D.strings, O = D.ops, E = D.events, C = D.changes;
  var nOps = O.index.length, nSteps = D.instants.length, nKeys = D.keys.length;
  var LEFT = 130, WIDTH = 1000, LANE = 26, TOP = 24, MAX_SHAPES = 2500;

  function str(i) { return i < 0 || i === undefined || i === null ? null : S[i]; }
  function esc(v) {
    return String(v === null || v === undefined ? "-" : v).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }
  // Every instant is written as the run's clock showed it: epoch + seconds, to the millisecond
  // (to the second on a page whose clock reads whole seconds), as dsm_sim/reports/instants.py
  // writes the page's static tables; the date only when it is not the epoch's day.
  var EPOCH_MS = Date.parse(D.epoch), EPOCH_DAY = new Date(EPOCH_MS).toISOString().slice(0, 10);
  function wall(s) {
    if (s === null || s === undefined) { return "-"; }
    var iso = new Date(EPOCH_MS + Math.round(s * 1000)).toISOString();
    var text = iso.slice(11, D.digits ? 23 : 19);
    return iso.slice(0, 10) === EPOCH_DAY ? text : iso.slice(0, 10) + " " + text;
  }
  function upper(a, x) { var lo = 0, hi = a.length; while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] <= x) { lo = m + 1; } else { hi = m; } } return lo; }
  function lower(a, x) { var lo = 0, hi = a.length; while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < x) { lo = m + 1; } else { hi = m; } } return lo; }

  // --- precomputed lookups ----------------------------------------------------------------
  var instants = Float64Array.from(D.instants);
  var t0 = Float64Array.from(O.t0), t1 = Float64Array.from(O.t1);
  var maxDur = 0, i, k;
  for (i = 0; i < nOps; i++) { maxDur = Math.max(maxDur, t1[i] - t0[i]); }
  var row = {};  // op index -> column position
  for (i = 0; i < nOps; i++) { row[O.index[i]] = i; }
  var evT = Float64Array.from(E.t);
  var perKeyT = [], perKeyC = [];
  for (k = 0; k < nKeys; k++) { perKeyT.push([]); perKeyC.push([]); }
  for (i = 0; i < C.t.length; i++) { perKeyT[C.key[i]].push(C.t[i]); perKeyC[C.key[i]].push(i); }
  var changeT = Float64Array.from(C.t);
  var faultKinds = {};
  D.fault_kinds.forEach(function (name) { faultKinds[D.event_kinds.indexOf(name)] = true; });
  var edges = {};
  D.diagram.edges.forEach(function (e) { edges[e] = true; });

  // --- state ------------------------------------------------------------------------------
  var scrub = document.getElementById("ex-scrub");
  var step = 0;
  var pinnedKey = -1, selectedOp = -1, trace = null, playing = null;
  var shownChange = new Int32Array(nKeys).fill(-2);
  var recordRows = [], selectedRow = -1;

  function stepOfTime(t) { return Math.max(0, upper(instants, t + 1e-9) - 1); }
  function storeNow() { return D.step_store[step]; }
  function lastChange(key, t) {
    var j = upper(perKeyT[key], t + 1e-9) - 1;
    return j < 0 ? -1 : perKeyC[key][j];
  }
  function nodeOf(rec, now) {
    if (!rec) { return "[*]"; }
    var status = str(rec[0]);
    if (status === "processing" && rec[2] !== null && rec[2] < now) { return "ExpiredLock"; }
    return status.charAt(0).toUpperCase() + status.slice(1);
  }
  function recordCells(rec) {
    if (!rec) { return ["no record", "-", "-", "-"]; }
    return [str(rec[0]), rec[1], wall(rec[2]), str(rec[3]) === null ? "-" : str(rec[3])];
  }

  // --- records table: built once, cells rewritten only when an item's record changed --------
  var tbody = document.querySelector("#ex-records tbody");
  (function buildRecords() {
    var html = [];
    for (k = 0; k < nKeys; k++) {
      html.push('<tr tabindex="0" data-key="' + k + '"><td class="mono">' + esc(D.keys[k]) +
        "</td><td></td><td></td><td></td><td class=\"mono data\"></td><td></td></tr>");
    }
    tbody.innerHTML = html.join("");
    recordRows = Array.prototype.slice.call(tbody.rows);
  })();
  function renderRecords(t) {
    for (k = 0; k < nKeys; k++) {
      var c = lastChange(k, t);
      if (c === shownChange[k]) { continue; }
      shownChange[k] = c;
      var rec = c < 0 ? null : C.record[c];
      var cells = recordCells(rec), r = recordRows[k];
      r.cells[1].textContent = cells[0];
      r.cells[2].textContent = cells[1];
      r.cells[3].textContent = cells[2];
      r.cells[4].textContent = cells[3];
      r.cells[5].textContent = c < 0 ? "" : "#" + C.op[c] + " at " + wall(C.t[c]);
      r.dataset.status = cells[0];
    }
    var sel = currentKey(t);
    if (sel !== selectedRow) {
      if (selectedRow >= 0) { recordRows[selectedRow].classList.remove("sel"); }
      if (sel >= 0) { recordRows[sel].classList.add("sel"); }
      selectedRow = sel;
    }
  }

  // --- diagram ----------------------------------------------------------------------------
  function domName(n) { return n === "[*]" ? "None" : n; }
  function currentKey(t) {
    if (pinnedKey >= 0) { return pinnedKey; }
    var c = upper(changeT, t + 1e-9) - 1;
    if (c >= 0) { return C.key[c]; }
    return nKeys ? 0 : -1;
  }
  var nodeEls = {};
  D.diagram.nodes.forEach(function (n) { nodeEls[n] = document.getElementById("dg-n-" + domName(n)); });
  function renderDiagram(t) {
    var counts = {}, now = storeNow();
    for (k = 0; k < nKeys; k++) {
      var c = shownChange[k], n = nodeOf(c < 0 ? null : C.record[c], now);
      counts[n] = (counts[n] || 0) + 1;
    }
    var key = currentKey(t), c2 = key < 0 ? -1 : lastChange(key, t);
    var node = nodeOf(c2 < 0 ? null : C.record[c2], now);
    D.diagram.nodes.forEach(function (n) {
      var g = nodeEls[n];
      if (!g) { return; }
      g.classList.toggle("current", n === node);
      g.querySelector(".dg-count").textContent = counts[n] ? counts[n] + (counts[n] === 1 ? " item" : " items") : "";
    });
    var old = document.querySelectorAll("#ex-diagram .dg-edge.last");
    for (i = 0; i < old.length; i++) { old[i].classList.remove("last"); }
    var edgeText = document.getElementById("ex-dg-edge");
    document.getElementById("ex-dg-key").textContent = key < 0 ? "-" : D.keys[key];
    root.dataset.key = key < 0 ? "" : D.keys[key];
    root.dataset.state = node;
    if (c2 < 0) { edgeText.textContent = "No transition yet."; root.dataset.edge = ""; return; }
    // Python decided which changes the table forbids (model.py); the page only draws them.
    var hops = str(C.edge[c2]).split(">"), forbidden = !!C.forbidden[c2];
    for (i = 0; i + 1 < hops.length; i++) {
      var p = document.getElementById("dg-e-" + domName(hops[i]) + "-" + domName(hops[i + 1]));
      if (p && edges[hops[i] + ">" + hops[i + 1]]) { p.classList.add("last"); }
    }
    root.dataset.edge = str(C.edge[c2]);
    edgeText.className = forbidden ? "ex-edge forbidden" : "ex-edge";
    var by = " by op #" + C.op[c2] + " at " + wall(C.t[c2]);
    var end = hops[hops.length - 1], text;
    if (hops.length < 2) {
      text = "Last change: the " + label(end) + " record rewritten, status unchanged," + by;
    } else {
      text = "Last transition: " + hops.map(label).join(" \u2192 ") + by;
      if (end !== node) { text += " (kept as history; the item is " + label(node) + " again)"; }
    }
    edgeText.textContent = text + (forbidden ? " \u2014 NOT in the transition table" : "");
  }
  function label(n) { return n === "[*]" ? "no record" : n; }

  // --- lanes: only the window of instants around the cursor is drawn ------------------------
  // One column per instant, not per second: calls of 40 ms between charges of seconds
  // stay readable, and the columns are exactly the scrubber's steps.
  var lanesSvg = document.getElementById("ex-lanes");
  var s0 = new Int32Array(nOps), s1 = new Int32Array(nOps), maxSpan = 0;
  for (i = 0; i < nOps; i++) {
    s0[i] = stepOfTime(t0[i]); s1[i] = stepOfTime(t1[i]);
    maxSpan = Math.max(maxSpan, s1[i] - s0[i]);
  }
  var evS = new Int32Array(evT.length);
  for (i = 0; i < evT.length; i++) { evS[i] = stepOfTime(evT[i]); }
  var windowSteps = Math.min(nSteps, 48);
  function lanesSpan() {
    var from = Math.max(0, Math.min(step - (windowSteps >> 1), nSteps - windowSteps));
    return [from, Math.min(from + windowSteps, nSteps) - 1];
  }
  function renderLanes() {
    var from = lanesSpan()[0], to = from + windowSteps;
    var col = (WIDTH - LEFT - 10) / windowSteps;
    function x(s) { return LEFT + (s - from) * col; }
    var out = [];
    D.lanes.forEach(function (name, lane) {
      var y = TOP + lane * LANE;
      out.push('<line class="lane" x1="0" x2="' + WIDTH + '" y1="' + (y + LANE) + '" y2="' + (y + LANE) + '"/>' +
        '<text x="4" y="' + (y + LANE / 2 + 4) + '">' + esc(name) + "</text>");
    });
    // No time axis here: the columns are instants, not equal times.  The span they cover is
    // said once, and shaded on the page's time axis.
    out.push('<text class="span" x="' + LEFT + '" y="14">' + esc(wall(instants[from]) + " \u2013 " +
      wall(instants[Math.min(to, nSteps) - 1]) + ": " + (Math.min(to, nSteps) - from) +
      " instants, one column each") + "</text>");
    var first = lower(s0, from - maxSpan), drawn = 0;
    for (i = first; i < nOps && s0[i] < to && drawn < MAX_SHAPES; i++) {
      if (s1[i] < from) { continue; }
      var xa = Math.max(LEFT, x(s0[i]) + 1), xb = Math.min(WIDTH - 10, x(s1[i]) + col - 1);
      var idx = O.index[i];
      out.push('<rect tabindex="0" role="button" class="op ' + str(O.css[i]) + (idx === selectedOp ? " sel" : "") +
        '" data-op="' + idx + '" x="' + xa.toFixed(1) + '" y="' + (TOP + O.lane[i] * LANE + 5) +
        '" width="' + Math.max(3, xb - xa).toFixed(1) + '" height="' + (LANE - 10) + '"><title>#' + idx + " " +
        esc(D.op_names[O.op[i]]) + " " + esc(O.key[i] < 0 ? "" : D.keys[O.key[i]]) + "</title></rect>");
      drawn++;
    }
    for (i = lower(evS, from); i < evS.length && evS[i] < to; i++) {
      var ex = (x(evS[i]) + col / 2).toFixed(1), kind = D.event_kinds[E.kind[i]], fault = faultKinds[E.kind[i]];
      var ly = E.lane[i] < 0 ? TOP : TOP + E.lane[i] * LANE;
      var lh = E.lane[i] < 0 ? D.lanes.length * LANE : LANE;
      if (!fault && kind !== "side_effect") { continue; }
      out.push('<line class="ev ' + kind + '" x1="' + ex + '" x2="' + ex + '" y1="' + ly +
        '" y2="' + (ly + lh) + '"><title>' + esc(kind + " " + (str(E.detail[i]) || "")) + "</title></line>");
    }
    var cx = (x(step) + col / 2).toFixed(1);
    out.push('<line class="cursor" x1="' + cx + '" x2="' + cx + '" y1="14" y2="' + (TOP + D.lanes.length * LANE) + '"/>');
    lanesSvg.innerHTML = out.join("");
    lanesSvg.dataset.drawn = String(drawn);
  }

  // --- the time axis: one per page --------------------------------------------------------
  // A run report's swim lanes (#timeline) are the whole run on the run's clock: the cursor and
  // the window the lanes below show are drawn on them.  A page without them (the demo) gets the
  // explorer's own axis, labelled with the ticks the page data carries.
  var timeline = document.getElementById("timeline"), overview = document.getElementById("ex-overview");
  var SVG = overview.namespaceURI;
  var axisSvg, axisX, axisT, axisTop, axisBottom;
  if (timeline) {
    var tlLeft = +timeline.dataset.left, tlScale = +timeline.dataset.scale;
    axisSvg = timeline;
    axisX = function (t) { return tlLeft + t * tlScale; };
    axisT = function (x) { return (x - tlLeft) / tlScale; };
    axisTop = 17; axisBottom = timeline.viewBox.baseVal.height - 24;
    overview.style.display = "none";
    D.faults.forEach(function (f) {  // every fault, store errors too, marked on the axis itself
      var mark = document.createElementNS(SVG, "line"), fx = axisX(f[0]).toFixed(1), title = document.createElementNS(SVG, "title");
      mark.setAttribute("class", "fault " + f[1]);
      mark.setAttribute("x1", fx); mark.setAttribute("x2", fx);
      mark.setAttribute("y1", "17"); mark.setAttribute("y2", "25");
      title.textContent = f[1] + " at " + wall(f[0]) + " " + (str(f[2]) || "");
      mark.appendChild(title);
      timeline.appendChild(mark);
    });
  } else {
    axisSvg = overview;
    axisX = function (t) { return 40 + t / D.end * 920; };
    axisT = function (x) { return (x - 40) / 920 * D.end; };
    axisTop = 16; axisBottom = 44;
    var out = ['<rect class="track" x="40" y="22" width="920" height="14"/>'];
    D.axis.forEach(function (tick) {
      var tx = axisX(tick[0]).toFixed(1);
      out.push('<line class="tick" x1="' + tx + '" x2="' + tx + '" y1="18" y2="40"/><text class="tick" x="' + tx +
        '" y="12" text-anchor="middle">' + esc(tick[1]) + "</text>");
    });
    D.faults.forEach(function (f) {
      var fx = axisX(f[0]).toFixed(1);
      out.push('<line class="fault ' + f[1] + '" x1="' + fx + '" x2="' + fx +
        '" y1="18" y2="44"><title>' + esc(f[1] + " at " + wall(f[0]) + " " + (str(f[2]) || "")) + "</title></line>");
    });
    overview.innerHTML = out.join("");
  }
  var band = document.createElementNS(SVG, "rect"), cursor = document.createElementNS(SVG, "line");
  band.setAttribute("class", "ex-window");
  band.setAttribute("y", String(axisTop));
  band.setAttribute("height", String(axisBottom - axisTop));
  cursor.setAttribute("class", "cursor");
  cursor.setAttribute("id", "ex-ov-cursor");
  cursor.setAttribute("y1", String(axisTop));
  cursor.setAttribute("y2", String(axisBottom));
  axisSvg.appendChild(band);
  axisSvg.appendChild(cursor);
  axisSvg.addEventListener("click", function (ev) {
    var box = axisSvg.getBoundingClientRect(), width = axisSvg.viewBox.baseVal.width || box.width;
    goto(stepOfTime(axisT((ev.clientX - box.left) * width / box.width)));
  });
  function renderAxis() {
    var x = axisX(instants[step]).toFixed(1);
    cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
    var span = lanesSpan(), x0 = axisX(instants[span[0]]), x1 = axisX(instants[span[1]]);
    band.setAttribute("x", (x0 - 1).toFixed(1));
    band.setAttribute("width", Math.max(2, x1 - x0 + 2).toFixed(1));
  }

  // --- operation detail -------------------------------------------------------------------
  var detail = document.getElementById("ex-detail");
  function recordTable(rec) {
    if (!rec) { return "<em>no record</em>"; }
    return "<table><tr><th>status</th><td>" + esc(str(rec[0])) + "</td></tr><tr><th>token (attempt)</th><td>" +
      esc(rec[1]) + "</td></tr><tr><th>locked_until</th><td>" + wall(rec[2]) + "</td></tr><tr><th>data</th><td class=\"mono\">" +
      esc(str(rec[3])) + "</td></tr><tr><th>created / updated</th><td>" + wall(rec[4]) + " / " + wall(rec[5]) +
      "</td></tr><tr><th>retain_until</th><td>" + wall(rec[6]) + "</td></tr></table>";
  }
  function openOp(idx, focus) {
    var r = row[idx];
    if (r === undefined) { return; }
    selectedOp = idx;
    var d = O.detail[r], outcome = O.outcome[r] < 0 ? "pending" : D.outcomes[O.outcome[r]];
    var keyName = O.key[r] < 0 ? "(all keys)" : D.keys[O.key[r]];
    detail.innerHTML = '<h3 id="ex-op-title">Operation #' + idx + " " + esc(D.op_names[O.op[r]]) + "</h3>" +
      '<div class="ex-cols"><div><h4>Request</h4><table>' +
      "<tr><th>process</th><td>" + esc(D.lanes[O.lane[r]]) + "</td></tr>" +
      "<tr><th>item</th><td class=\"mono\">" + esc(keyName) + "</td></tr>" +
      "<tr><th>token</th><td>" + esc(d[0]) + "</td></tr>" +
      "<tr><th>target status</th><td>" + esc(str(d[1])) + "</td></tr>" +
      "<tr><th>data</th><td class=\"mono\">" + esc(str(d[5])) + "</td></tr>" +
      "<tr><th>execution</th><td>" + esc(str(d[6])) + "</td></tr>" +
      "<tr><th>invoked</th><td>" + wall(O.t0[r]) + "</td></tr></table></div>" +
      '<div><h4>Response</h4><table><tr><th>outcome</th><td id="ex-op-outcome">' + esc(outcome) + "</td></tr>" +
      "<tr><th>result</th><td>" + esc(d[3]) + "</td></tr>" +
      '<tr><th>error</th><td id="ex-op-error">' + esc(str(d[2])) + "</td></tr>" +
      "<tr><th>completed</th><td>" + wall(O.t1[r]) + (d[4] !== null && wall(d[4]) !== wall(O.t1[r]) ? " (store clock " + wall(d[4]) + ")" : "") + "</td></tr>" +
      (d[7].length ? "<tr><th>keys changed</th><td class=\"mono\">" + d[7].map(function (s) { return esc(str(s)); }).join("<br>") + "</td></tr>" : "") +
      "</table></div>" +
      (d[8] ? '<div id="ex-op-before"><h4>Record before</h4>' + recordTable(d[9]) + '</div><div id="ex-op-after"><h4>Record after</h4>' + recordTable(d[10]) + "</div>"
        : "<div><h4>Record</h4><p>Not read around this call.</p></div>") + "</div>";
    detail.dataset.op = String(idx);
    var rects = lanesSvg.querySelectorAll("rect.op.sel");
    for (i = 0; i < rects.length; i++) { rects[i].classList.remove("sel"); }
    var mine = lanesSvg.querySelector('rect.op[data-op="' + idx + '"]');
    if (mine) { mine.classList.add("sel"); }
    if (focus) { detail.focus(); }
  }

  // --- narration (walk-throughs) ----------------------------------------------------------
  var narration = document.getElementById("ex-narration");
  var chapterStarts = D.chapters.map(function (c) { return c.first_op; });
  if (D.chapters.length) { narration.hidden = false; }
  function renderNarration() {
    if (!D.chapters.length) { return; }
    var op = D.step_op[step], c = Math.max(0, upper(chapterStarts, op) - 1);
    var ch = D.chapters[c];
    if (narration.dataset.chapter === String(c)) { return; }
    narration.dataset.chapter = String(c);
    narration.innerHTML = "<h3>" + esc(ch.title) + "</h3><pre>" + esc(ch.lines.join("\n")) + "</pre>";
  }

  // --- moving ---------------------------------------------------------------------------
  function goto(s) {
    step = Math.max(0, Math.min(nSteps - 1, s | 0));
    scrub.value = String(step);
    render();
  }
  function render() {
    var t = instants[step], shown = wall(t), store = wall(storeNow());
    document.getElementById("ex-time").textContent = "instant " + (step + 1) + " of " + nSteps + ": " +
      shown + (store !== shown ? " (store clock " + store + ")" : "");
    root.dataset.step = String(step);
    scrub.setAttribute("aria-valuetext", shown);
    root.dataset.t = String(t);
    renderRecords(t);
    renderDiagram(t);
    renderLanes();
    renderNarration();
    renderAxis();
  }
  scrub.addEventListener("input", function () { goto(+scrub.value); });
  scrub.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && D.step_op[step] >= 0) { openOp(D.step_op[step], true); ev.preventDefault(); }
    if (ev.shiftKey && (ev.key === "ArrowLeft" || ev.key === "ArrowRight")) {
      goto(step + (ev.key === "ArrowRight" ? 10 : -10)); ev.preventDefault();
    }
  });
  document.getElementById("ex-prev").addEventListener("click", function () { goto(step - 1); });
  document.getElementById("ex-next").addEventListener("click", function () { goto(step + 1); });
  document.getElementById("ex-zoom-in").addEventListener("click", function () { windowSteps = Math.max(Math.min(nSteps, 8), windowSteps >> 1); render(); });
  document.getElementById("ex-zoom-out").addEventListener("click", function () { windowSteps = Math.min(nSteps, windowSteps * 2); render(); });
  lanesSvg.addEventListener("click", function (ev) {
    var op = ev.target.getAttribute && ev.target.getAttribute("data-op");
    if (op !== null && op !== undefined) { openOp(+op, false); }
  });
  lanesSvg.addEventListener("keydown", function (ev) {
    var op = ev.target.getAttribute && ev.target.getAttribute("data-op");
    if (ev.key === "Enter" && op !== null) { openOp(+op, true); ev.preventDefault(); }
  });
  tbody.addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr");
    if (tr) { pinnedKey = pinnedKey === +tr.dataset.key ? -1 : +tr.dataset.key; render(); }
  });
  tbody.addEventListener("keydown", function (ev) {
    var tr = ev.target.closest("tr");
    if (tr && ev.key === "Enter") { pinnedKey = +tr.dataset.key; render(); ev.preventDefault(); }
  });
  document.addEventListener("keydown", function (ev) {
    var tag = (ev.target.tagName || "").toLowerCase();
    if (tag === "input" || tag === "select" || tag === "textarea") { return; }
    if (ev.key === "ArrowRight" || ev.key === "ArrowLeft") {
      if (trace) { traceMove(ev.key === "ArrowRight" ? 1 : -1); } else { goto(step + (ev.key === "ArrowRight" ? 1 : -1) * (ev.shiftKey ? 10 : 1)); }
      ev.preventDefault();
    } else if (ev.key === "Home") { goto(0); ev.preventDefault(); } else if (ev.key === "End") { goto(nSteps - 1); ev.preventDefault(); } else if (ev.key === "Escape" && trace) { closeTrace(); }
  });

  // --- faults list: each row jumps to its instant -----------------------------------------
  var faultRows = document.querySelectorAll("#faults tr.fault");
  for (i = 0; i < faultRows.length; i++) {
    faultRows[i].tabIndex = 0;
    faultRows[i].addEventListener("click", function () { goto(stepOfTime(+this.dataset.t)); scrub.focus(); });
    faultRows[i].addEventListener("keydown", function (ev) { if (ev.key === "Enter") { goto(stepOfTime(+this.dataset.t)); scrub.focus(); } });
  }

  // --- the static violating trace: each operation row opens at its instant -----------------
  var traceRows = document.querySelectorAll("tr.bad[data-op]");
  function openRow(tr) {
    var r = row[+tr.dataset.op];
    if (r === undefined) { return; }
    goto(stepOfTime(t1[r]));
    openOp(+tr.dataset.op, true);
  }
  for (i = 0; i < traceRows.length; i++) {
    traceRows[i].tabIndex = 0;
    traceRows[i].style.cursor = "pointer";
    traceRows[i].addEventListener("click", function () { openRow(this); });
    traceRows[i].addEventListener("keydown", function (ev) { if (ev.key === "Enter") { openRow(this); } });
  }

  // --- violation traces, played step by step -------------------------------------------------
  var tracePanel = document.getElementById("ex-trace");
  function openTrace(v) {
    var viol = D.violations[v], steps = [];
    viol.ops.forEach(function (idx) { var r = row[idx]; if (r !== undefined) { steps.push({ t: t1[r], op: idx }); } });
    viol.events.forEach(function (idx) { var j = E.index.indexOf(idx); if (j >= 0) { steps.push({ t: evT[j], ev: j }); } });
    steps.sort(function (a, b) { return a.t - b.t; });
    if (!steps.length) { return; }
    trace = { v: v, steps: steps, at: 0 };
    tracePanel.hidden = false;
    document.getElementById("ex-trace-title").textContent = viol.invariant + ": " + viol.message;
    var k2 = D.keys.indexOf(viol.key);
    pinnedKey = k2;
    traceShow();
    tracePanel.focus();
    root.scrollIntoView();
  }
  function traceShow() {
    var s = trace.steps[trace.at];
    document.getElementById("ex-trace-pos").textContent = "step " + (trace.at + 1) + " of " + trace.steps.length;
    tracePanel.dataset.at = String(trace.at);
    goto(stepOfTime(s.t));
    var text;
    if (s.op !== undefined) {
      openOp(s.op, false);
      var r = row[s.op];
      text = "#" + s.op + " " + D.lanes[O.lane[r]] + " " + D.op_names[O.op[r]] + " token=" + O.detail[r][0] + " \u2192 " +
        (O.outcome[r] < 0 ? "pending" : D.outcomes[O.outcome[r]]) + (str(O.detail[r][2]) ? " " + str(O.detail[r][2]) : "");
    } else {
      text = "event " + D.event_kinds[E.kind[s.ev]] + " " + (str(E.detail[s.ev]) || "") + " token=" + E.token[s.ev];
    }
    document.getElementById("ex-trace-step").textContent = wall(s.t) + " " + text;
  }
  function traceMove(d) {
    if (!trace) { return; }
    trace.at = Math.max(0, Math.min(trace.steps.length - 1, trace.at + d));
    traceShow();
  }
  function closeTrace() {
    if (playing) { clearInterval(playing); playing = null; }
    trace = null; tracePanel.hidden = true; pinnedKey = -1; render();
  }
  document.getElementById("ex-trace-prev").addEventListener("click", function () { traceMove(-1); });
  document.getElementById("ex-trace-next").addEventListener("click", function () { traceMove(1); });
  document.getElementById("ex-trace-close").addEventListener("click", closeTrace);
  document.getElementById("ex-trace-play").addEventListener("click", function () {
    if (playing) { clearInterval(playing); playing = null; this.textContent = "play"; return; }
    var button = this;
    button.textContent = "pause";
    if (trace.at === trace.steps.length - 1) { trace.at = 0; traceShow(); }
    playing = setInterval(function () {
      if (!trace || trace.at >= trace.steps.length - 1) { clearInterval(playing); playing = null; button.textContent = "play"; return; }
      traceMove(1);
    }, 900);
  });
  var violationItems = document.querySelectorAll("[data-violation]");
  for (i = 0; i < violationItems.length; i++) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "ex-follow";
    b.textContent = "play trace";
    b.dataset.violation = violationItems[i].dataset.violation;
    b.addEventListener("click", function () { openTrace(+this.dataset.violation); });
    violationItems[i].appendChild(document.createTextNode(" "));
    violationItems[i].appendChild(b);
  }

  root.hidden = false;
  goto(0);
  window.dsmExplorer = {
    goto: goto,
    stepOfTime: stepOfTime,
    openOp: openOp,
    openTrace: openTrace,
    firstRenderMs: performance.now() - started,
    state: function () { return { step: step, t: instants[step], key: root.dataset.key, node: root.dataset.state, edge: root.dataset.edge }; }
  };
  }
})();
