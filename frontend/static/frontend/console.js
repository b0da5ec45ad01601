/* gpucloud console: the little JavaScript the pages need. Everything works without it
   except the live charts; htmx does the polling. */
(function () {
  "use strict";
  const PALETTE = ["#3a5bd9", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d", "#5c940d"];

  // ---- connection state: a failed poll says so in plain words, and clears when one succeeds
  document.addEventListener("htmx:sendError", () => document.body.classList.add("offline"));
  document.addEventListener("htmx:responseError", (e) => {
    if (e.detail.xhr && e.detail.xhr.status === 401) signedOut();
    else document.body.classList.add("offline");
  });
  document.addEventListener("htmx:afterRequest", (e) => {
    if (e.detail.successful) document.body.classList.remove("offline");
  });

  // ---- the session ended (the server answers a page's own requests with 401, never with the
  // sign-in page): one banner, every poll stops, and a form is kept rather than lost
  function signedOut() {
    if (document.body.classList.contains("signed-out")) return;
    document.body.classList.add("signed-out");
    const banner = document.getElementById("signed-out");
    if (banner) banner.scrollIntoView({ block: "nearest" });
  }
  document.addEventListener("htmx:beforeRequest", (e) => {
    if (!document.body.classList.contains("signed-out")) return;
    e.preventDefault();  // a poll after sign-out would only be refused again
    document.body.dataset.cancelledRequests = String(Number(document.body.dataset.cancelledRequests || 0) + 1);
  });

  const KEPT = "gpucloud.kept:";
  function formKey(form) { return KEPT + location.pathname + "#" + (form.id || form.getAttribute("action") || ""); }
  function keepForm(form) {
    const fields = [];
    for (const el of form.elements) {
      if (!el.name || el.disabled || el.name === "csrfmiddlewaretoken" || el.type === "password" ||
          el.type === "file" || el.type === "submit" || el.type === "button") continue;
      if ((el.type === "checkbox" || el.type === "radio") && !el.checked) continue;
      fields.push([el.name, el.type, el.value]);
    }
    try { sessionStorage.setItem(formKey(form), JSON.stringify(fields)); } catch (err) { /* private mode */ }
  }
  function restoreForms(root) {
    root.querySelectorAll("form[method=post], form[method=POST]").forEach((form) => {
      let fields = null;
      try { fields = JSON.parse(sessionStorage.getItem(formKey(form)) || "null"); } catch (err) { return; }
      if (!fields) return;
      sessionStorage.removeItem(formKey(form));
      for (const [name, type, value] of fields) {
        const els = Array.from(form.elements).filter((el) => el.name === name);
        for (const el of els) {
          if (type === "checkbox" || type === "radio") { if (el.value === value) el.checked = true; }
          else if (el.type !== "checkbox" && el.type !== "radio") el.value = value;
        }
      }
      form.querySelectorAll("input, select, textarea").forEach((el) => el.dispatchEvent(new Event("change", { bubbles: true })));
      const note = document.createElement("p");
      note.className = "notice info kept-notice";
      note.setAttribute("role", "status");
      note.textContent = "Restored what you typed before you were signed out: check it, then submit again.";
      form.prepend(note);
    });
  }
  // Before a form is posted, ask whether the session is still there (one GET); if not, keep what
  // was typed for the page the sign-in brings the person back to, and show the banner instead.
  document.addEventListener("submit", (e) => {
    const form = e.target;
    const probe = document.body.dataset.sessionUrl;
    if (!probe || !(form instanceof HTMLFormElement) || (form.method || "").toLowerCase() !== "post") return;
    if (form.dataset.sessionChecked === "1") { delete form.dataset.sessionChecked; return; }
    e.preventDefault();
    e.stopImmediatePropagation();  // htmx's own submit handler waits for the answer too
    const submitter = e.submitter || null;
    const go = () => {
      form.dataset.sessionChecked = "1";
      // htmx may have swapped the button meanwhile (the launch page's cost box holds it): the
      // one of the same id in the form now, else the form's default button
      let by = submitter && submitter.isConnected && submitter.form === form ? submitter : null;
      if (!by && submitter && submitter.id) {
        const again = document.getElementById(submitter.id);
        if (again && again.form === form) by = again;
      }
      form.requestSubmit(by);
    };
    if (document.body.classList.contains("signed-out")) { keepForm(form); return; }
    fetch(probe, { credentials: "same-origin", cache: "no-store" })
      .then((r) => { if (r.status === 401) { keepForm(form); signedOut(); } else go(); })
      .catch(go);  // the server is unreachable: let the browser try, and say what it says
  }, true);

  // ---- launch page: a template fills in image, ports and command
  function setupTemplates(root) {
    const data = root.querySelector("#image-templates");
    if (!data) return;
    const templates = JSON.parse(data.textContent);
    root.querySelectorAll("input[name=template]").forEach((radio) => {
      radio.addEventListener("change", () => {
        const t = templates[radio.value];
        if (!t) return;
        const form = radio.form;
        if (radio.value !== "custom") {
          form.elements.image.value = t.image;
          form.elements.ports.value = t.ports;
          form.elements.command.value = t.command;
        } else {
          form.elements.image.value = "";
          form.elements.image.focus();
        }
      });
    });
  }

  // ---- launch page: job-only fields show for jobs, the max price for spot
  function setupLaunchToggles(root) {
    const form = root.querySelector("#launch-form");
    if (!form) return;
    const show = (id, on) => { const el = form.querySelector(id); if (el) el.hidden = !on; };
    const sync = () => {
      const job = form.querySelector("input[name=kind]:checked");
      const isJob = job && job.value === "job";
      show("#field-max_retries", isJob); show("#field-timeout_s", isJob);
      show("#field-auto_stop_idle_minutes", !isJob);
      const spot = form.querySelector("input[name=spot]");
      show("#field-max_price", spot && spot.checked);
    };
    form.addEventListener("change", sync);
    sync();
    // the volume picker offers the volumes in the chosen region (the one picked stays: the
    // server says why it cannot be used, rather than the browser dropping it unseen)
    const region = form.querySelector("#id_region"), volume = form.querySelector("#id_volume");
    if (region && volume) {
      const pick = () => {
        for (const o of volume.options) {
          const away = !!o.dataset.region && o.dataset.region !== region.value && !o.selected;
          o.hidden = away; o.disabled = away;
        }
      };
      region.addEventListener("change", pick);
      volume.addEventListener("change", pick);
      pick();
    }
  }

  // ---- charts (uPlot)
  function width(el) { return Math.max(260, el.clientWidth || 600); }
  const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400];

  function makeChart(el, title, unit, labels, range) {
    const opts = {
      title: title, width: width(el), height: 220,
      scales: { x: { time: true }, y: range ? { range: range } : { auto: true } },
      // whole seconds at least: in a run's first seconds uPlot would otherwise tick every 0.2 s
      axes: [{ incrs: TIME_INCRS }, { values: (u, vals) => vals.map((v) => v + unit), size: 60 }],
      series: [{}].concat(labels.map((l, i) => ({ label: l, stroke: PALETTE[i % PALETTE.length], width: 1.5,
        spanGaps: true, value: (u, v) => (v == null ? "–" : v + unit) }))),
      legend: { live: false },
    };
    return new uPlot(opts, [[]].concat(labels.map(() => [])), el);
  }

  function setupGpuCharts(root) {
    root.querySelectorAll("[data-gpu-chart]").forEach((box) => {
      if (box.dataset.ready) return;
      box.dataset.ready = "1";
      const utilEl = box.querySelector(".chart-util");
      const memEl = box.querySelector(".chart-mem");
      const empty = box.querySelector(".chart-empty");
      let util = null, mem = null, labels = "";
      box.addEventListener("htmx:afterRequest", (e) => {
        if (!e.detail.successful) return;
        let data;
        try { data = JSON.parse(e.detail.xhr.responseText); } catch (err) { return; }
        const n = data.t.length;
        box.dataset.points = String(n);
        if (!n) { empty.hidden = false; return; }
        empty.hidden = true;
        const names = data.gpus.map((g) => g.label);
        if (names.join() !== labels) {  // the GPU set changed (or first data): build anew
          labels = names.join();
          utilEl.innerHTML = ""; memEl.innerHTML = "";
          util = makeChart(utilEl, "GPU utilisation", "%", names, [0, 100]);
          mem = makeChart(memEl, "GPU memory used", " GiB", names, null);
        }
        util.setData([data.t].concat(data.gpus.map((g) => g.util)));
        mem.setData([data.t].concat(data.gpus.map((g) => g.mem)));
        box.dataset.lastT = String(data.t[n - 1]);
        box.dataset.drawn = "1";
      });
      window.addEventListener("resize", () => {
        if (util) util.setSize({ width: width(utilEl), height: 220 });
        if (mem) mem.setSize({ width: width(memEl), height: 220 });
      });
    });
  }

  function setupSpendChart(root) {
    const el = root.querySelector("[data-spend-chart]");
    const src = root.querySelector("#spend-data");
    if (!el || !src || el.dataset.ready) return;
    el.dataset.ready = "1";
    const data = JSON.parse(src.textContent);
    if (!data.t.length) return;
    const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.6, 40] }) : undefined;
    const chart = new uPlot({
      title: "Spend per day", width: width(el), height: 220,
      scales: { x: { time: true, range: [data.from, data.to] }, y: { range: (u, lo, hi) => [0, Math.max(hi, 0.01) * 1.1] } },
      axes: [{}, { values: (u, vals) => vals.map((v) => v.toFixed(2)), size: 60 }],
      series: [{}, { label: "spend", stroke: PALETTE[0], fill: "rgba(58,91,217,.25)", paths: bars, points: { show: false } }],
    }, [data.t, data.amount], el);
    window.addEventListener("resize", () => chart.setSize({ width: width(el), height: 220 }));
  }

  // An alarm's metric per period with its threshold as a dashed line (frontend/alarm_views.py _chart).
  function setupAlarmChart(root) {
    const el = root.querySelector("[data-alarm-chart]");
    const src = root.querySelector("#alarm-data");
    if (!el || !src || el.dataset.ready) return;
    el.dataset.ready = "1";
    const data = JSON.parse(src.textContent);
    if (!data.t.length) return;
    const unit = data.unit ? " " + data.unit : "";
    const chart = new uPlot({
      title: data.title, width: width(el), height: 240,
      scales: { x: { time: true }, y: { auto: true } },
      axes: [{ incrs: TIME_INCRS }, { size: 70 }],
      series: [{},
        { label: "value", stroke: PALETTE[0], width: 1.5, spanGaps: false,
          value: (u, v) => (v == null ? "–" : v + unit) },
        { label: "threshold", stroke: "#d14343", width: 1.5, dash: [6, 4], points: { show: false },
          value: (u, v) => (v == null ? "–" : v + unit) }],
    }, [data.t, data.v, data.t.map(() => data.threshold)], el);
    el.dataset.drawn = "1";
    window.addEventListener("resize", () => chart.setSize({ width: width(el), height: 240 }));
  }

  // ---- join a tenant: the invitation link carries its token after "#", which browsers never send
  // to the server (no access log, ?next= or Referer holds it). Keep it for this tab while the user
  // signs in, take it off the address bar, and fill in the form: joining stays a click on "Join".
  const INVITATION = "gpucloud.invitation";
  function setupInvitation() {
    const page = document.getElementById("invitation-accept");
    if (!page) return;
    const found = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (found) {
      try { sessionStorage.setItem(INVITATION, decodeURIComponent(found[1])); } catch (e) { /* storage off */ }
      history.replaceState(null, "", location.pathname + location.search);
    }
    const input = page.querySelector("input[name=token]");
    let token = null;
    try { token = sessionStorage.getItem(INVITATION); } catch (e) { /* storage off */ }
    if (!token && found) token = decodeURIComponent(found[1]);
    if (input && token) {
      if (!input.value) input.value = token;
      try { sessionStorage.removeItem(INVITATION); } catch (e) { /* storage off */ }
    }
  }

  // Copy buttons (the connection hints): delegated, so buttons swapped in by htmx work too.
  document.addEventListener("click", (e) => {
    const button = e.target.closest && e.target.closest("button[data-copy]");
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.dataset.copy).then(() => {
      const label = button.textContent;
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = label; }, 1500);
    }, () => { /* clipboard refused: the text stays selectable */ });
  });

  // ---- flash messages true only in one state ("queued", "stopping"): gone once the live
  // part shows the workload in another (data-while on the message, data-state on the badge)
  function setupFlashes() {
    const badge = document.querySelector("#workload-live #state");
    if (!badge) return;
    document.querySelectorAll(".messages li[data-while]").forEach((li) => {
      if (li.dataset.while.split(" ").indexOf(badge.dataset.state) < 0) li.remove();
    });
    const list = document.querySelector(".messages");
    if (list && !list.children.length) list.remove();
  }

  function setup(root) { setupFlashes(); setupTemplates(root); setupLaunchToggles(root); setupGpuCharts(root); setupSpendChart(root); setupAlarmChart(root); }
  document.addEventListener("DOMContentLoaded", () => { setupInvitation(); restoreForms(document); setup(document); });
  document.addEventListener("htmx:load", (e) => setup(e.target));
})();
