// The manager page's script (manager.rs): refreshes the rows in place
// every second from /_peerlb/manager/data, works out each member's
// request rate between refreshes (with a chart of its last two minutes),
// and posts the forms itself so that an action's outcome shows in its row
// at once. No external asset.
"use strict";
(() => {
  const DATA = "/_peerlb/manager/data";
  const PERIOD_MS = 1000;
  // How long a state asked on this page is shown in its row while gossip
  // has not brought it back into this node's view.
  const PENDING_MS = 15000;
  const rows = document.getElementById("rows");
  const live = document.getElementById("live");
  // id -> {requests, at} of the last refresh (for req/s).
  const last = new Map();
  // id -> the member's req/s at each of the last HISTORY refreshes.
  const HISTORY = 120;
  const history = new Map();
  const SVG = "http://www.w3.org/2000/svg";
  // id -> {status, until} asked on this page; id -> {text, err} outcomes.
  const pending = new Map();
  const notes = new Map();
  let failures = 0;

  function applyOverlays() {
    const now = Date.now();
    for (const tr of rows.querySelectorAll("tr")) {
      const id = tr.id.replace(/^member-/, "");
      const p = pending.get(id);
      if (p) {
        if (now > p.until || tr.dataset.status === p.status) {
          pending.delete(id);
        } else {
          tr.className = p.status;
          tr.querySelector("td.state").textContent = p.status + " (asked, spreading by gossip)";
        }
      }
      const n = notes.get(id);
      if (n) {
        const td = tr.querySelector("td.note");
        td.textContent = n.text;
        td.classList.toggle("err", n.err);
      }
    }
  }

  function rate(m, now) {
    const c = m.counters;
    if (!c) return "-";
    const prev = last.get(m.id);
    last.set(m.id, { requests: c.requests, at: now });
    if (!prev || now <= prev.at) return "-";
    return ((c.requests - prev.requests) * 1000 / (now - prev.at)).toFixed(1);
  }

  // The chart of member id's request rate after rate r was measured: an
  // SVG line, the newest refresh at the right, scaled to its highest
  // rate; null until two rates are known.
  function chart(id, r) {
    const h = history.get(id) || [];
    if (r !== "-") {
      h.push(Number(r));
      if (h.length > HISTORY) h.shift();
    }
    history.set(id, h);
    if (h.length < 2) return null;
    const W = 120, H = 18, max = Math.max(1, ...h);
    const x0 = W - (h.length - 1) * W / (HISTORY - 1);
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("class", "chart");
    const title = document.createElementNS(SVG, "title");
    title.textContent = "req/s over the last " + h.length + " s (top: " + max.toFixed(1) + ")";
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#2a6");
    line.setAttribute("points", h.map((v, i) =>
      (x0 + i * W / (HISTORY - 1)).toFixed(1) + "," + (H - 1 - v * (H - 2) / max).toFixed(1)).join(" "));
    svg.append(title, line);
    return svg;
  }

  function render(d) {
    const now = Date.now();
    // A row whose weight field is being typed in is left as it is.
    const typing = document.activeElement && document.activeElement.closest
      ? document.activeElement.closest("tr") : null;
    const html = [];
    const rates = new Map();
    for (const m of d.members) {
      rates.set(m.id, rate(m, now));
      if (typing && typing.id === "member-" + m.id) {
        html.push(typing.outerHTML);
      } else {
        html.push(m.html);
      }
    }
    rows.innerHTML = html.join("");
    for (const [id, r] of rates) {
      const td = document.querySelector("#member-" + CSS.escape(id) + " td.rate");
      if (!td) continue;
      td.textContent = r;
      const svg = chart(id, r);
      if (svg) {
        td.append(document.createElement("br"), svg);
      }
    }
    const alive = d.members.filter(m => m.state === "alive").length;
    const failed = d.members.filter(m => m.state === "failed").length;
    document.getElementById("count").textContent =
      alive + " members in view, " + failed + " failed";
    document.getElementById("version").textContent = d.view_version_text;
    applyOverlays();
  }

  async function refresh() {
    try {
      const r = await fetch(DATA, { cache: "no-store", headers: { accept: "application/json" } });
      if (!r.ok) throw new Error("the node answered " + r.status);
      render(await r.json());
      failures = 0;
      live.textContent = "Live: refreshed every second, last at " + new Date().toLocaleTimeString() + ".";
    } catch (e) {
      failures += 1;
      live.textContent = "The node does not answer (" + e.message + "); retrying every second.";
    }
    setTimeout(refresh, PERIOD_MS);
  }

  // Forms: posted here, the outcome shown in the member's row.
  rows.addEventListener("submit", async ev => {
    ev.preventDefault();
    const form = ev.target;
    const body = new URLSearchParams(new FormData(form));
    body.set("js", "1");
    const id = body.get("node");
    notes.set(id, { text: "asking " + id + "…", err: false });
    applyOverlays();
    try {
      // getAttribute: the form's field named "action" hides form.action.
      const r = await fetch(form.getAttribute("action"), { method: "POST", body });
      const a = await r.json();
      // The page's own answer has a message; the admin API's refusals
      // (a foreign origin, a stale token) an error sentence.
      const text = a.message || (a.error ? "Refused (" + r.status + "): " + a.error + "." : "The node answered " + r.status + ".");
      notes.set(id, { text, err: !a.ok });
      if (a.ok && a.status) {
        pending.set(id, { status: a.status, until: Date.now() + PENDING_MS });
      }
    } catch (e) {
      notes.set(id, { text: "The change could not be sent: " + e.message + ".", err: true });
    }
    applyOverlays();
  });

  live.textContent = "Live: refreshed every second.";
  refresh();
})();
