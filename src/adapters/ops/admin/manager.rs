//! `GET /_peerlb/manager`: the balancer-manager page (httpd's
//! balancer-manager, HAProxy's stats page), plain server-rendered HTML on
//! the admin address, and `POST /_peerlb/manager`: its actions.
//!
//! The page lists every member of this node's view with its status, weight
//! (lbfactor), load metric, requests in flight, requests served and errors
//! (each member's own counters, asked over the peer link), its share of
//! the ring and the policy's state for it (lbstatus, bytes); each row has
//! forms to change the member's weight, drain it, take it offline and put
//! it back to serving. A form's change reaches the member it concerns
//! through the cluster: the node the page was opened on applies it to
//! itself or forwards it over the authenticated peer link
//! (`members::apply`).
//!
//! CSRF defence: every form carries this node's random token (made on
//! the page's first request, never sent anywhere else) in a hidden field,
//! and a `POST` without it is refused (403); the admin API's browser checks
//! (an IP-literal or `localhost` `Host`, a same-origin `Origin`) apply
//! first. The page may not be framed (`X-Frame-Options`, CSP
//! `frame-ancestors`) and runs no script.

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
const COUNTERS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

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
    let Some(node) = field("node").filter(|n| !n.is_empty()) else {
        return error_response(&AdminError::BadForm("no node".into()).into(), me);
    };
    let change = match field("action") {
        Some("weight") => match members::parse_weight(field("weight").unwrap_or("").as_bytes()) {
            Ok(w) => Change::Weight(w),
            Err(e) => return error_response(&AdminError::Weight(e).into(), me),
        },
        Some(a) => match members::parse_state(a.as_bytes()) {
            Ok(s) => Change::Status(s, None),
            Err(_) => {
                return error_response(
                    &AdminError::BadForm(format!("unknown action {a:?}")).into(),
                    me,
                );
            }
        },
        None => return error_response(&AdminError::BadForm("no action".into()).into(), me),
    };
    let answer = members::apply(state, Some(node), &change).await;
    let status = answer.status();
    let text = match answer.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_owned(),
        Err(_) => String::new(),
    };
    if status != StatusCode::OK {
        let msg = format!("{node}: {} {text}", status.as_u16());
        return html(status, render(state, None, Some(&msg)).await);
    }
    let done = match change {
        Change::Status(s, _) => format!("{node}: {s}"),
        Change::Weight(w) => format!("{node}: weight {w}"),
    };
    let mut r = Response::new(body::empty());
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) =
        HeaderValue::from_str(&format!("{}?msg={}", super::MANAGER, percent_encode(&done)))
    {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
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
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
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
th{background:#eee}td.id,td.state,td.actions,th.l{text-align:left}\
tr.serving td.state{color:#060}tr.draining td.state{color:#a60}\
tr.offline td.state,tr.leaving td.state{color:#a00}\
form{display:inline;margin:0 .2em}input[type=number]{width:5em}\
p.msg{background:#eef;padding:.4em}p.err{background:#fee;padding:.4em}";

/// The page's HTML: `msg` an outcome, `err` a refused change.
async fn render(state: &NodeState, msg: Option<&str>, err: Option<&str>) -> String {
    let view = state.view();
    let shares = view.ring_shares();
    let policy = state.policy_state();
    let figure = policy["figure"].as_str();
    let tok = token(state);
    let me = state.node_id();
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>peerlb manager: {id}</title>\
<style>{STYLE}</style></head><body>\n<h1>peerlb balancer manager</h1>\n\
<p>Node <b id=\"self\">{id}</b> ({state}), policy <b id=\"policy\">{policy}</b>, view version {version}, {n} members.</p>\n",
        id = esc(me),
        state = state.status(),
        policy = esc(policy["name"].as_str().unwrap_or("")),
        version = view.version(),
        n = view.len(),
    );
    if let Some(m) = msg {
        let _ = writeln!(o, "<p class=\"msg\" id=\"msg\">{}</p>", esc(m));
    }
    if let Some(e) = err {
        let _ = writeln!(o, "<p class=\"err\" id=\"err\">{}</p>", esc(e));
    }
    let _ = write!(
        o,
        "<table id=\"members\">\n<tr><th class=\"l\">member</th><th class=\"l\">status</th><th>weight (lbfactor)</th>\
<th>load metric</th><th>in flight</th><th>served</th><th>errors</th><th>ring share</th><th>{}</th><th class=\"l\">actions</th></tr>\n",
        esc(figure.unwrap_or("policy state"))
    );
    for m in view.members() {
        let counters = members::counters_of(state, &m.id, COUNTERS_TIMEOUT).await;
        let id = esc(&m.id);
        let load = if m.load > 100 {
            "-".to_owned()
        } else {
            m.load.to_string()
        };
        let (served, errors) = counters.map_or(("?".to_owned(), "?".to_owned()), |c| {
            (c.served.to_string(), c.errors.to_string())
        });
        let share = shares.get(&m.id).copied().unwrap_or(0.0) * 100.0;
        let pol = policy["members"][&*m.id]
            .as_i64()
            .map_or("-".to_owned(), |v| v.to_string());
        let _ = write!(
            o,
            "<tr id=\"member-{id}\" class=\"{status}\"><td class=\"id\">{id}</td><td class=\"state\">{status}</td>\
<td class=\"weight\">{weight}</td><td>{load}</td><td>{inflight}</td><td class=\"served\">{served}</td><td>{errors}</td>\
<td class=\"share\">{share:.1}%</td><td>{pol}</td><td class=\"actions\">",
            status = m.status,
            weight = m.weight,
            inflight = m.inflight,
        );
        let hidden = |action: &str| {
            format!(
                "<input type=\"hidden\" name=\"token\" value=\"{tok}\"><input type=\"hidden\" name=\"node\" value=\"{id}\">\
<input type=\"hidden\" name=\"action\" value=\"{action}\">"
            )
        };
        let _ = write!(
            o,
            "<form method=\"post\" action=\"{path}\" id=\"weight-{id}\">{h}<input type=\"number\" name=\"weight\" min=\"0\" max=\"10000\" value=\"{w}\" aria-label=\"weight of {id}\"><button type=\"submit\">set weight</button></form>",
            path = super::MANAGER,
            h = hidden("weight"),
            w = m.weight,
        );
        for (s, label) in [
            (NodeStatus::Draining, "drain"),
            (NodeStatus::Offline, "offline"),
            (NodeStatus::Serving, "serve"),
        ] {
            if m.status == s || m.status == NodeStatus::Leaving {
                continue;
            }
            let _ = write!(
                o,
                "<form method=\"post\" action=\"{path}\" id=\"{label}-{id}\">{h}<button type=\"submit\">{label}</button></form>",
                path = super::MANAGER,
                h = hidden(s.as_str()),
            );
        }
        o.push_str("</td></tr>\n");
    }
    o.push_str(
        "</table>\n<p>drain: no new sticky sessions or ring keys, sessions bound to the member finish there; \
offline: no traffic, still a member; serve: back on the ring. Each change reaches its member over the peer link \
and spreads by gossip (about a gossip round per hop): reload to see it.</p>\n</body></html>\n",
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
}
