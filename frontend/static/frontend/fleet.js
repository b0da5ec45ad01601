// The fleet page (admin/fleet/fleet.html): says when a refresh fails, and draws the
// allocation ratio with uPlot. htmx (loaded before this file) does the refreshing.
(function () {
  "use strict";

  const CHART_REFRESH_MS = 30000;
  const status = () => document.getElementById("fleet-status");

  function say(text, kind) {
    const el = status();
    if (!el) return;
    if (!text) { el.hidden = true; el.textContent = ""; return; }
    el.className = "fleet-status" + (kind === "info" ? " fleet-info" : "");
    el.hidden = false;
    el.textContent = text;
  }

  function lastUpdated() {
    const el = document.getElementById("fleet-overview");
    const at = el && el.dataset.updated ? new Date(el.dataset.updated) : null;
    return at ? at.toISOString().slice(11, 19) + " UTC" : "the first load";
  }

  // --- the live parts (htmx) -------------------------------------------------------------

  document.addEventListener("htmx:afterRequest", function (evt) {
    if (evt.target.id !== "fleet-poller") return;
    const xhr = evt.detail.xhr;
    const every = evt.target.dataset.refreshS || "5";
    if (xhr && xhr.status >= 200 && xhr.status < 300 && xhr.responseURL.indexOf("/login/") !== -1) {
      // admin_view sends an expired session to the login page; htmx follows the redirect.
      say("Your session has ended, so the figures below stopped updating. Sign in again: reload this page.");
      return;
    }
    if (evt.detail.successful) { say(""); return; }
    const why = xhr && xhr.status
      ? "the server answered " + xhr.status + (xhr.statusText ? " " + xhr.statusText : "")
      : "the server could not be reached";
    say("Could not refresh the fleet: " + why + ". The figures below are from " + lastUpdated() +
        "; trying again every " + every + " s.");
  });

  // --- the allocation chart (uPlot) ------------------------------------------------------

  let plot = null;

  function box() { return document.getElementById("fleet-allocation"); }

  function placeholder(text, state) {
    const el = box();
    if (plot) { plot.destroy(); plot = null; }
    el.replaceChildren();
    const p = document.createElement("p");
    p.className = "fleet-empty";
    p.dataset.state = state;
    p.textContent = text;
    el.appendChild(p);
    el.setAttribute("aria-busy", state === "loading" ? "true" : "false");
  }

  function size() {
    const w = Math.max(200, box().clientWidth);
    return { width: w, height: w < 500 ? 200 : 260 };
  }

  function draw(data) {
    const el = box();
    const known = data.ratio.filter(function (v) { return v !== null; });
    if (known.length === 0) {
      placeholder("No GPUs in this window, so there is no allocation to show.", "empty");
      return;
    }
    const series = [data.times, data.ratio.map(function (v) { return v === null ? null : v * 100; })];
    el.setAttribute("aria-busy", "false");
    el.dataset.state = "ready";
    el.dataset.points = String(known.length);
    if (plot) { plot.setData(series); return; }
    el.replaceChildren();
    const opts = Object.assign(size(), {
      series: [
        {},
        { label: "Booked", stroke: "#1d91c0", fill: "rgba(29,145,192,0.15)", width: 2,
          // a young fleet has few points; dots keep them visible where a line would not be
          points: { show: known.length < 30, size: 6 },
          value: function (u, v) { return v == null ? "—" : v.toFixed(1) + " %"; } },
      ],
      scales: { y: { range: [0, 100] } },
      axes: [{}, { size: 56, values: function (u, vals) { return vals.map(function (v) { return v + " %"; }); } }],
    });
    plot = new uPlot(opts, series, el);
  }

  function load() {
    const el = box();
    if (!el) return;
    const url = el.dataset.url + "?window=" + encodeURIComponent(el.dataset.window);
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (resp) {
        if (resp.redirected && resp.url.indexOf("/login/") !== -1) {
          throw new Error("your session has ended; reload the page to sign in again");
        }
        if (!resp.ok) throw new Error("the server answered " + resp.status);
        return resp.json();
      })
      .then(draw)
      .catch(function (err) {
        const msg = "Could not load the allocation history: " + (err && err.message ? err.message : err) +
                    ". Trying again in 30 s.";
        if (plot) { say(msg, "info"); } else { placeholder(msg, "error"); }
      });
  }

  function choose(btn) {
    document.querySelectorAll(".fleet-window").forEach(function (b) {
      const on = b === btn;
      b.classList.toggle("selected", on);
      b.setAttribute("aria-pressed", on ? "true" : "false");
    });
    box().dataset.window = btn.dataset.window;
    placeholder("Loading the allocation history…", "loading");
    load();
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!box()) return;
    document.querySelectorAll(".fleet-window").forEach(function (b) {
      b.addEventListener("click", function () { choose(b); });
    });
    load();
    setInterval(load, CHART_REFRESH_MS);
    let pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () { if (plot) plot.setSize(size()); }, 150);
    });
  });
})();
