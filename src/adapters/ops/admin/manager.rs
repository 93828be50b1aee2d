//! `GET /_peerlb/manager`: the balancer-manager page (httpd's
//! balancer-manager, HAProxy's stats page), plain server-rendered HTML on
//! the admin address, and `POST /_peerlb/manager`: its actions.
//!
//! The page lists every member of this node's view with its status, weight
//! (lbfactor, with the slow start's step), its share of the ring, requests
//! in flight, its own counters asked over the peer link (requests, served,
//! p50/p99 latency, bytes in and out, answers by kind: 4xx at the edge (peerlb's own) and the app's, app 5xx, 502,
//! 503, 504; version and uptime), the load metric and the policy's state
//! for it (lbstatus, bytes); then the members out of the view from the
//! roster (`cluster/roster.rs`): failed (red, with the downtime and the
//! reason), left, never seen. Each row has forms to change the member's
//! weight, drain it, take it offline and put it back to serving, or (out
//! of the view) forget it.
//!
//! Live: the page's script (`manager.js`, served from the admin address,
//! no external asset) reloads the rows from `GET /_peerlb/manager/data`
//! every second in place, works out each member's request rate between
//! two refreshes, and posts the forms itself, showing the outcome in the
//! member's row at once (and the state asked until gossip brings it back).
//! Without script the page is the same table, the forms post and redirect
//! as before. A form's change reaches the member it concerns
//! through the cluster: the node the page was opened on applies it to
//! itself or forwards it over the authenticated peer link
//! (`members::apply`).
//!
//! CSRF defence: every form carries this node's random token (made on
//! the page's first request, never sent anywhere else) in a hidden field,
//! and a `POST` without it is refused (403); the admin API's browser checks
//! (an IP-literal or `localhost` `Host`, a same-origin `Origin`) apply
//! first. The page may not be framed (`X-Frame-Options`, CSP
//! `frame-ancestors`) and runs only its own script (CSP `script-src
//! 'self'`).

use std::fmt::Write as _;

use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::members::{self, Change};
use crate::adapters::body::{self, Body};
use crate::adapters::errors::{AdminError, error_response};
use crate::adapters::node_state::NodeState;
use crate::engine::membership::NodeStatus;
use crate::engine::sticky::{percent_decode, percent_encode};

/// Longest form body read, in bytes.
const FORM_LIMIT: usize = 4096;

/// Longest wait for one member's counters while the page is made.
/// Short: the page refreshes every second, and a member that has just
/// died (still in the view) is shown `not answering` rather than holding
/// the refresh.
const COUNTERS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// This node's form token: 128 random bits in hex, made once.
fn token(state: &NodeState) -> &str {
    state.manager_token(|| {
        let mut b = [0u8; 16];
        // The OS random source; without it no token can be trusted, and
        // the page (an operator's tool) is not worth a guessable one.
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
            .expect("the OS random source for the manager page token");
        b.iter().fold(String::new(), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
    })
}

/// Escapes `s` for HTML text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The `application/x-www-form-urlencoded` pairs of `s`, decoded.
fn form_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                percent_decode(k, true).into_owned(),
                percent_decode(v, true).into_owned(),
            )
        })
        .collect()
}

/// Answers `GET /_peerlb/manager`: the page, with the `msg` query
/// parameter (the outcome of the last action) shown above the table.
pub(crate) async fn page(state: &NodeState, uri: &Uri) -> Response<Body> {
    let msg = uri.query().and_then(|q| {
        form_pairs(q)
            .into_iter()
            .find(|(k, _)| k == "msg")
            .map(|(_, v)| v)
    });
    html(StatusCode::OK, render(state, msg.as_deref(), None).await)
}

/// Answers `POST /_peerlb/manager` (a form of the page): applies the
/// change to the member it names, then redirects to the page (303) with
/// the outcome; a refused change shows the page again with the member's
/// answer and its status.
pub(crate) async fn act(state: &NodeState, req: Request<Incoming>) -> Response<Body> {
    // Long: one form post, read, checked, sent to the member it names and answered, in that
    // order; each step is a few lines and ends in its own answer.
    let me = state.node_id();
    let bytes = match http_body_util::Limited::new(req.into_body(), FORM_LIMIT)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_response(&AdminError::BadForm(e.to_string()).into(), me),
    };
    let pairs = form_pairs(&String::from_utf8_lossy(&bytes));
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let expected = token(state);
    let sent = field("token").unwrap_or("");
    // Constant time: the comparison does not tell how much of a guess matched.
    let same = sent.len() == expected.len()
        && sent
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if !same {
        return error_response(&AdminError::Csrf.into(), me);
    }
    let js = field("js") == Some("1");
    let Some(node) = field("node").filter(|n| !n.is_empty()) else {
        return refused(
            state,
            js,
            StatusCode::BAD_REQUEST,
            "The form named no member.",
        )
        .await;
    };
    if field("action") == Some("forget") {
        let (status, sentence) = match state.roster().forget(node) {
            Ok(was) => (
                StatusCode::OK,
                format!("{node} ({}) forgotten.", was.as_str()),
            ),
            Err(Some(_)) => (
                StatusCode::CONFLICT,
                format!(
                    "{node} is in this node's view: only a failed, left or never seen member can be forgotten."
                ),
            ),
            Err(None) => (
                StatusCode::NOT_FOUND,
                format!("{node} is not a member this node knows."),
            ),
        };
        return outcome(state, js, node, status, sentence, None).await;
    }
    let change = match field("action") {
        Some("weight") => match members::parse_weight(field("weight").unwrap_or("").as_bytes()) {
            Ok(w) => Change::Weight(w),
            Err(e) => {
                return refused(
                    state,
                    js,
                    StatusCode::BAD_REQUEST,
                    &sentence(&e.to_string()),
                )
                .await;
            }
        },
        Some(a) => match members::parse_state(a.as_bytes()) {
            Ok(s) => Change::Status(s, None),
            Err(_) => {
                return refused(
                    state,
                    js,
                    StatusCode::BAD_REQUEST,
                    &format!("The page asked an unknown action {a:?}."),
                )
                .await;
            }
        },
        None => {
            return refused(
                state,
                js,
                StatusCode::BAD_REQUEST,
                "The form named no action.",
            )
            .await;
        }
    };
    let answer = members::apply(state, Some(node), &change).await;
    let status = answer.status();
    let text = match answer.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_owned(),
        Err(_) => String::new(),
    };
    if status != StatusCode::OK {
        // The admin API's error JSON: its `error` field is the sentence.
        let why = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(text);
        let msg = format!(
            "{node} refused the change ({}): {}",
            status.as_u16(),
            sentence(&why)
        );
        return outcome(state, js, node, status, msg, None).await;
    }
    let (done, applied) = match change {
        Change::Status(s, _) => (format!("{node}: {s}"), Some(s.as_str())),
        Change::Weight(w) => (format!("{node}: weight {w}"), None),
    };
    if js {
        return outcome(state, js, node, status, done, applied).await;
    }
    let mut r = Response::new(body::empty());
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) =
        HeaderValue::from_str(&format!("{}?msg={}", super::MANAGER, percent_encode(&done)))
    {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}

/// `s` as a sentence: its first letter upper case, a full stop at its end.
fn sentence(s: &str) -> String {
    let s = s.trim();
    let mut c = s.chars();
    let mut out: String = c
        .next()
        .map(|f| f.to_uppercase().collect())
        .unwrap_or_default();
    out.push_str(c.as_str());
    if !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    out
}

/// A refused form: its sentence, as JSON for the script or on the page.
async fn refused(state: &NodeState, js: bool, status: StatusCode, msg: &str) -> Response<Body> {
    outcome(state, js, "", status, msg.to_owned(), None).await
}

/// An action's outcome: for the script (`js`), JSON `{ok, node, message,
/// status}` (`status`: the state the member now publishes, for its row);
/// without script, the page again with the sentence (an error) or, for a
/// success (only `forget` comes here), the page with the message.
async fn outcome(
    state: &NodeState,
    js: bool,
    node: &str,
    status: StatusCode,
    msg: String,
    applied: Option<&str>,
) -> Response<Body> {
    let ok = status == StatusCode::OK;
    if js {
        let mut r = crate::adapters::errors::json_response(
            status,
            serde_json::json!({ "ok": ok, "node": node, "message": msg, "status": applied })
                .to_string(),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return r;
    }
    if ok {
        html(status, render(state, Some(&msg), None).await)
    } else {
        html(status, render(state, None, Some(&msg)).await)
    }
}

/// A `text/html` answer that no page may frame and no cache keeps.
fn html(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(body::full(text));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    // `same-origin`, not `no-referrer`: under `no-referrer` Chromium sends
    // `Origin: null` with the page's own form posts, which the browser
    // check refuses.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em}\
table{border-collapse:collapse}th,td{border:1px solid #999;padding:.3em .6em;text-align:right}\
th{background:#eee}td.id,td.state,td.actions,td.note,th.l{text-align:left}\
tr.serving{background:#e8f6e8}tr.draining,tr.leaving{background:#fdf1d8}\
tr.offline{background:#e4e4e4}tr.failed{background:#f8c8c8}tr.failed td.state{color:#900;font-weight:bold}\
tr.left{background:#eee;color:#666}tr.never-seen{background:#fff;color:#888}\
tr.unanswered td.state{color:#900}td.note{color:#036;max-width:22em}td.note.err{color:#900}\
form{display:inline;margin:0 .2em}input[type=number]{width:5em}\
span.key{display:inline-block;width:1em;height:1em;border:1px solid #999;vertical-align:middle;margin:0 .3em 0 1em}\
p.msg{background:#eef;padding:.4em}p.err{background:#fee;padding:.4em}";

/// The page's script (`GET /_peerlb/manager/script.js`): refreshes the
/// table from `GET /_peerlb/manager/data` every second and posts the forms in place.
pub(crate) const SCRIPT: &str = include_str!("manager.js");

/// `GET /_peerlb/manager/script.js`.
pub(crate) const SCRIPT_PATH: &str = "/_peerlb/manager/script.js";

/// Answers [`SCRIPT_PATH`].
pub(crate) fn script() -> Response<Body> {
    let mut r = Response::new(body::full(SCRIPT));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A duration in ms as the page shows it: `45s`, `12m 3s`, `5h 2m`, `3d 4h`.
fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

/// A byte count as the page shows it (B, KiB, MiB, GiB).
fn human_bytes(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", b as f64 / 1_048_576.0),
        _ => format!("{:.1} GiB", b as f64 / 1_073_741_824.0),
    }
}

/// A latency bucket bound in µs as the page shows it (`≤ 1 ms`).
fn human_us(us: u64) -> String {
    match us {
        0 => "-".to_owned(),
        u64::MAX => "> 16 s".to_owned(),
        _ if us < 1000 => format!("≤ {us} µs"),
        _ => format!("≤ {} ms", us / 1000),
    }
}

/// The page's rows as JSON (`GET /_peerlb/manager/data`): this node (`node`, `state`,
/// `policy`, `figure`, `view_version`, `version`, `uptime_ms`), `members`
/// (one object per row: `id`, `state` (`alive`, `failed`, `left`, `never
/// seen`), `status` (the published status, `null` unless alive), `weight`,
/// `load`, `inflight`, `ring_share`, `figure_value`, `slow_start`,
/// `since_ms`, `last_heard_ms_ago`, `reason`, `counters` (the member's own
/// [`members::MemberCounters`], `null` when it did not answer or is not in
/// the view), `class` (the row's CSS class) and `html` (the row, as the
/// page without script shows it)), the view's members first, then the
/// others in id order.
pub(crate) async fn data(state: &NodeState) -> serde_json::Value {
    let view = state.view();
    let shares = view.ring_shares();
    let policy = state.policy_state();
    let tok = token(state).to_owned();
    let me = state.node_id().clone();
    let mut rows = Vec::new();
    for m in view.members() {
        let counters = members::counters_of(state, &m.id, COUNTERS_TIMEOUT).await;
        let slow = (m.id == me)
            .then(|| state.slow_start_progress())
            .flatten()
            .map(|p| serde_json::json!({"step": p.step, "steps": p.steps, "remaining_ms": p.remaining.as_millis() as u64}));
        let class = if counters.is_none() {
            format!("{} unanswered", m.status)
        } else {
            m.status.to_string()
        };
        rows.push(serde_json::json!({
            "id": &*m.id,
            "state": "alive",
            "status": m.status.as_str(),
            "weight": m.weight,
            "load": m.load,
            "inflight": m.inflight,
            "ring_share": shares.get(&m.id).copied().unwrap_or(0.0),
            "figure_value": policy["members"][&*m.id].as_i64(),
            "slow_start": slow,
            "since_ms": null,
            "last_heard_ms_ago": 0,
            "reason": null,
            "counters": counters,
            "class": class,
        }));
    }
    for r in super::roster_json(state) {
        if r["state"] != "alive" {
            let mut r = r;
            r["class"] = r["state"].as_str().unwrap_or("").replace(' ', "-").into();
            r["counters"] = serde_json::Value::Null;
            r["ring_share"] = 0.0.into();
            rows.push(r);
        }
    }
    for r in &mut rows {
        let html = row_html(r, &tok);
        r["html"] = html.into();
    }
    serde_json::json!({
        "node": &*me,
        "state": state.status().as_str(),
        "policy": policy["name"],
        "figure": policy["figure"],
        "view_version": view.version(),
        "view_version_text": view.version().to_string(),
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_ms": state.uptime().as_millis() as u64,
        "members": rows,
    })
}

/// The columns of the table, in order (header text, and the class of the
/// header cell).
const COLUMNS: &[(&str, &str)] = &[
    ("member", "l"),
    ("state", "l"),
    ("weight (lbfactor)", ""),
    ("ring share", ""),
    ("in flight", ""),
    ("req/s", ""),
    ("requests", ""),
    ("served", ""),
    ("p50", ""),
    ("p99", ""),
    ("bytes in", ""),
    ("bytes out", ""),
    ("4xx edge", ""),
    ("4xx app", ""),
    ("5xx app", ""),
    ("502", ""),
    ("503", ""),
    ("504", ""),
    ("load metric", ""),
    ("policy", ""),
    ("version", ""),
    ("uptime", ""),
    ("actions", "l"),
    ("last action", "l"),
];

/// One row of the table, from a member object of [`data`].
fn row_html(r: &serde_json::Value, tok: &str) -> String {
    let id = esc(r["id"].as_str().unwrap_or(""));
    let state = r["state"].as_str().unwrap_or("");
    let status = r["status"].as_str().unwrap_or(state);
    let class = esc(r["class"].as_str().unwrap_or(""));
    let c = &r["counters"];
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".to_owned(), |n| n.to_string());
    let state_text = match state {
        "alive" if c.is_null() => format!("{status} (not answering)"),
        "alive" => status.to_owned(),
        "failed" => format!(
            "failed, down {} ({})",
            human_ms(r["since_ms"].as_u64().unwrap_or(0)),
            r["reason"].as_str().unwrap_or("")
        ),
        "left" => format!("left {} ago", human_ms(r["since_ms"].as_u64().unwrap_or(0))),
        _ => "never seen".to_owned(),
    };
    let weight = match (&r["weight"], &r["slow_start"]) {
        (w, s) if !s.is_null() => format!("{} (slow start {}/{})", num(w), s["step"], s["steps"]),
        (w, _) => num(w),
    };
    let load = r["load"]
        .as_u64()
        .filter(|l| *l <= 100)
        .map_or("-".to_owned(), |l| l.to_string());
    let share = if state == "alive" {
        format!("{:.1}%", r["ring_share"].as_f64().unwrap_or(0.0) * 100.0)
    } else {
        "-".to_owned()
    };
    let mut o = format!(
        "<tr id=\"member-{id}\" class=\"{class}\" data-status=\"{st}\"><td class=\"id\">{id}</td><td class=\"state\">{text}</td>\
<td class=\"weight\">{weight}</td><td class=\"share\">{share}</td><td class=\"inflight\">{inflight}</td><td class=\"rate\">-</td>\
<td class=\"requests\">{req}</td><td class=\"served\">{served}</td><td class=\"p50\">{p50}</td><td class=\"p99\">{p99}</td>\
<td class=\"bin\">{bin}</td><td class=\"bout\">{bout}</td><td class=\"e4edge\">{e4edge}</td><td class=\"e4app\">{e4app}</td><td>{e5}</td><td>{e502}</td><td>{e503}</td><td>{e504}</td>\
<td>{load}</td><td>{pol}</td><td class=\"version\">{ver}</td><td class=\"uptime\">{up}</td><td class=\"actions\">",
        st = esc(status),
        text = esc(&state_text),
        weight = esc(&weight),
        inflight = if c.is_null() {
            num(&r["inflight"])
        } else {
            num(&c["inflight"])
        },
        req = num(&c["requests"]),
        served = if c.is_null() {
            "?".to_owned()
        } else {
            num(&c["served"])
        },
        p50 = esc(&c["p50_us"].as_u64().map_or("-".to_owned(), human_us)),
        p99 = esc(&c["p99_us"].as_u64().map_or("-".to_owned(), human_us)),
        bin = c["bytes_in"].as_u64().map_or("-".to_owned(), human_bytes),
        bout = c["bytes_out"].as_u64().map_or("-".to_owned(), human_bytes),
        e4edge = num(&c["status_4xx_edge"]),
        // Older members send no `status_4xx_edge` (read as 0).
        e4app = match (c["status_4xx"].as_u64(), c["status_4xx_edge"].as_u64()) {
            (Some(all), edge) => (all.saturating_sub(edge.unwrap_or(0))).to_string(),
            (None, _) => "-".to_owned(),
        },
        e5 = num(&c["status_5xx"]),
        e502 = num(&c["status_502"]),
        e503 = num(&c["status_503"]),
        e504 = num(&c["status_504"]),
        pol = num(&r["figure_value"]),
        ver = esc(c["version"].as_str().unwrap_or("-")),
        up = c["uptime_ms"].as_u64().map_or("-".to_owned(), human_ms),
    );
    let form = |o: &mut String, label: &str, action: &str, extra: &str| {
        let _ = write!(
            o,
            "<form method=\"post\" action=\"{path}\" id=\"{label}-{id}\"><input type=\"hidden\" name=\"token\" value=\"{tok}\">\
<input type=\"hidden\" name=\"node\" value=\"{id}\"><input type=\"hidden\" name=\"action\" value=\"{action}\">{extra}<button type=\"submit\">{text}</button></form>",
            path = super::MANAGER,
            text = if label == "weight" {
                "set weight"
            } else {
                label
            },
        );
    };
    if state == "alive" {
        let w = r["weight"].as_u64().unwrap_or(0);
        form(
            &mut o,
            "weight",
            "weight",
            &format!(
                "<input type=\"number\" name=\"weight\" min=\"0\" max=\"10000\" value=\"{w}\" aria-label=\"weight of {id}\">"
            ),
        );
        for (s, label) in [
            (NodeStatus::Draining, "drain"),
            (NodeStatus::Offline, "offline"),
            (NodeStatus::Serving, "serve"),
        ] {
            if status == s.as_str() || status == NodeStatus::Leaving.as_str() {
                continue;
            }
            form(&mut o, label, s.as_str(), "");
        }
    } else {
        form(&mut o, "forget", "forget", "");
    }
    o.push_str("</td><td class=\"note\"></td></tr>\n");
    o
}

/// The page's HTML: `msg` an outcome, `err` a refused change.
async fn render(state: &NodeState, msg: Option<&str>, err: Option<&str>) -> String {
    let d = data(state).await;
    let alive = d["members"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|r| r["state"] == "alive").count());
    let failed = d["members"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|r| r["state"] == "failed").count());
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>peerlb manager: {id}</title>\
<style>{STYLE}</style><script src=\"{SCRIPT_PATH}\" defer></script></head><body>\n<h1>peerlb balancer manager</h1>\n\
<p id=\"summary\">Node <b id=\"self\">{id}</b> ({state}), policy <b id=\"policy\">{policy}</b>, view version \
<span id=\"version\">{version}</span>, <span id=\"count\">{alive} members in view, {failed} failed</span>, \
peerlb {ver}, up <span id=\"uptime\">{up}</span>. <span id=\"live\">Not refreshing: reload to update.</span></p>\n",
        id = esc(d["node"].as_str().unwrap_or("")),
        state = esc(d["state"].as_str().unwrap_or("")),
        policy = esc(d["policy"].as_str().unwrap_or("")),
        version = d["view_version_text"].as_str().unwrap_or(""),
        ver = esc(d["version"].as_str().unwrap_or("")),
        up = human_ms(d["uptime_ms"].as_u64().unwrap_or(0)),
    );
    if let Some(m) = msg {
        let _ = writeln!(o, "<p class=\"msg\" id=\"msg\">{}</p>", esc(m));
    }
    if let Some(e) = err {
        let _ = writeln!(o, "<p class=\"err\" id=\"err\">{}</p>", esc(e));
    }
    o.push_str("<table id=\"members\">\n<thead><tr>");
    let figure = d["figure"].as_str().unwrap_or("policy state");
    for (name, class) in COLUMNS {
        let name = if *name == "policy" { figure } else { name };
        let _ = write!(o, "<th class=\"{class}\">{}</th>", esc(name));
    }
    o.push_str("</tr></thead>\n<tbody id=\"rows\">\n");
    for r in d["members"].as_array().into_iter().flatten() {
        o.push_str(r["html"].as_str().unwrap_or(""));
    }
    o.push_str(
        "</tbody></table>\n<p id=\"legend\">Rows:<span class=\"key\" style=\"background:#e8f6e8\"></span>serving\
<span class=\"key\" style=\"background:#fdf1d8\"></span>draining or leaving<span class=\"key\" style=\"background:#e4e4e4\"></span>offline\
<span class=\"key\" style=\"background:#f8c8c8\"></span>failed (out of the view: downtime and reason)\
<span class=\"key\" style=\"background:#eee\"></span>left (drained and stopped)<span class=\"key\" style=\"background:#fff\"></span>never seen \
(named in cluster.toml). Counters are the member's own since its start (p50/p99: time to response head, to the histogram \
bucket's bound); req/s is measured by this page between refreshes.</p>\n\
<p>drain: no new sticky sessions or ring keys, sessions bound to the member finish there; \
offline: no traffic, still a member; serve: back on the ring; forget: remove a failed, left or never seen member from \
this node's list. Each change reaches its member over the peer link and spreads by gossip (about a gossip round per hop).</p>\n</body></html>\n",
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn forms_decode() {
        assert_eq!(
            form_pairs("token=ab&node=n%202&action=draining&x"),
            [
                ("token".into(), "ab".into()),
                ("node".into(), "n 2".into()),
                ("action".into(), "draining".into()),
                ("x".into(), String::new()),
            ]
        );
        assert_eq!(form_pairs("msg=n2%3A+draining")[0].1, "n2: draining");
    }

    /// The cell of class `class` in `row`'s HTML.
    fn cell<'a>(row: &'a str, class: &str) -> &'a str {
        let open = format!("<td class=\"{class}\">");
        let at = row
            .find(&open)
            .unwrap_or_else(|| panic!("no {class}: {row}"))
            + open.len();
        &row[at..at + row[at..].find("</td>").unwrap()]
    }

    #[test]
    fn four_hundreds_are_split_into_the_edges_and_the_apps() {
        let row = |counters: serde_json::Value| {
            row_html(
                &serde_json::json!({"id": "n1", "state": "alive", "status": "serving", "counters": counters}),
                "t",
            )
        };
        let r = row(serde_json::json!({"status_4xx": 7, "status_4xx_edge": 3}));
        assert_eq!((cell(&r, "e4edge"), cell(&r, "e4app")), ("3", "4"));
        // A member of an older version sends no edge count: all its 4xx
        // read as the app's.
        let r = row(serde_json::json!({"status_4xx": 7}));
        assert_eq!((cell(&r, "e4edge"), cell(&r, "e4app")), ("-", "7"));
        // A member that does not answer: nothing known.
        let r = row(serde_json::Value::Null);
        assert_eq!((cell(&r, "e4edge"), cell(&r, "e4app")), ("-", "-"));
    }
}
