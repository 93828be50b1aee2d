//! The built-in demo user agent server (UAS), the SIP counterpart of the
//! built-in HTTP app: what an owner answers to a SIP request it serves.
//!
//! | request | answers |
//! | --- | --- |
//! | `OPTIONS` | `200` with `Allow` (RFC 3261 11.2) |
//! | `REGISTER` | `200` with the request's `Contact` (10.3 step 8) |
//! | `INVITE` (no To tag) | `100`, `180`, `200` with a To tag, `Contact` (naming the node as `peerlb-owner`) and the request's `Record-Route` (12.1.1); the dialog is remembered |
//! | `INVITE` (To tag) | re-INVITE: `200` for a known dialog, else `481` (12.2.2) |
//! | `ACK` | nothing (17.1.1.3) |
//! | `BYE` | `200` for a known dialog (which ends), else `481` (15.1.2) |
//! | `CANCEL` | `481`: every INVITE is answered at once, so none is pending (9.2) |
//! | `MESSAGE` | `200` (RFC 3428) |
//! | anything else | `405` with `Allow` (8.2.1) |
//!
//! Every answer carries `Peerlb-Served-By: <node id>` (the HTTP app's
//! `peerlb-served-by`). The To tag is derived from the Call-ID, the From
//! tag and the node id, so no randomness is needed and a retransmitted
//! INVITE gets the same tag.

use std::collections::BTreeMap;

use super::SipMessage;

/// Methods the demo server answers (its `Allow`).
pub(crate) const ALLOW: &str = "INVITE, ACK, BYE, CANCEL, OPTIONS, REGISTER, MESSAGE";

/// The header naming the node that served a SIP request.
pub(crate) const SERVED_BY: &str = "Peerlb-Served-By";

/// Dialogs the demo server holds at most; past it the oldest is forgotten
/// (a later BYE of it gets `481`).
pub(crate) const MAX_DIALOGS: usize = 100_000;

/// The dialogs an owner's demo server established and not yet ended,
/// keyed by (Call-ID, local tag, remote tag) (RFC 3261 12: a dialog id).
#[derive(Debug, Default)]
pub(crate) struct DialogTable {
    dialogs: BTreeMap<(String, String, String), u64>,
    order: BTreeMap<u64, (String, String, String)>,
    next: u64,
}

impl DialogTable {
    fn insert(&mut self, id: (String, String, String)) {
        if self.dialogs.contains_key(&id) {
            return;
        }
        if self.dialogs.len() >= MAX_DIALOGS
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.dialogs.remove(&oldest);
        }
        self.next += 1;
        self.order.insert(self.next, id.clone());
        self.dialogs.insert(id, self.next);
    }

    fn remove(&mut self, id: &(String, String, String)) -> bool {
        match self.dialogs.remove(id) {
            Some(n) => {
                self.order.remove(&n);
                true
            }
            None => false,
        }
    }

    fn contains(&self, id: &(String, String, String)) -> bool {
        self.dialogs.contains_key(id)
    }

    /// Number of dialogs held.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn len(&self) -> usize {
        self.dialogs.len()
    }
}

/// The To tag this node gives the dialog of `req`: 16 hex digits of a hash
/// of the Call-ID, the From tag and `node`.
fn local_tag(req: &SipMessage, node: &str) -> String {
    let h = xxhash_rust::xxh3::xxh3_64(
        format!(
            "{}\n{}\n{node}",
            req.call_id().unwrap_or(""),
            req.tag_of_from().unwrap_or("")
        )
        .as_bytes(),
    );
    format!("{h:016x}")
}

/// The answers of the demo server at node `node` (whose SIP address is
/// `contact`, `host:port`) to `req`, in the order they are sent; empty
/// for `ACK` and for a response (a server never answers those).
pub(crate) fn serve(
    req: &SipMessage,
    node: &str,
    contact: &str,
    dialogs: &mut DialogTable,
) -> Vec<SipMessage> {
    let Some(method) = req.method() else {
        return Vec::new();
    };
    let tag = local_tag(req, node);
    let dialog_id = |local: &str| {
        (
            req.call_id().unwrap_or("").to_owned(),
            local.to_owned(),
            req.tag_of_from().unwrap_or("").to_owned(),
        )
    };
    let mut out = match method {
        "ACK" => return Vec::new(),
        "OPTIONS" => {
            let mut r = req.response(200, "OK", Some(&tag));
            r.headers.push(("Allow".into(), ALLOW.into()));
            vec![r]
        }
        "REGISTER" => {
            let mut r = req.response(200, "OK", Some(&tag));
            for c in req.header_list("contact") {
                r.headers.push(("Contact".into(), c.to_owned()));
            }
            vec![r]
        }
        "MESSAGE" => vec![req.response(200, "OK", Some(&tag))],
        "INVITE" => match req.tag_of_to() {
            Some(local) => {
                if dialogs.contains(&dialog_id(local)) {
                    let mut ok = req.response(200, "OK", None);
                    ok.headers.push((
                        "Contact".into(),
                        format!("<sip:{node}@{contact};peerlb-owner={node}>"),
                    ));
                    vec![ok]
                } else {
                    vec![req.response(481, "Call/Transaction Does Not Exist", None)]
                }
            }
            None => {
                dialogs.insert(dialog_id(&tag));
                let trying = req.response(100, "Trying", None);
                let ringing = with_record_route(req, req.response(180, "Ringing", Some(&tag)));
                let mut ok = with_record_route(req, req.response(200, "OK", Some(&tag)));
                ok.headers.push((
                    "Contact".into(),
                    format!("<sip:{node}@{contact};peerlb-owner={node}>"),
                ));
                vec![trying, ringing, ok]
            }
        },
        "BYE" => {
            let known = req
                .tag_of_to()
                .is_some_and(|local| dialogs.remove(&dialog_id(local)));
            if known {
                vec![req.response(200, "OK", None)]
            } else {
                vec![req.response(481, "Call/Transaction Does Not Exist", None)]
            }
        }
        "CANCEL" => vec![req.response(481, "Call/Transaction Does Not Exist", None)],
        _ => {
            let mut r = req.response(405, "Method Not Allowed", Some(&tag));
            r.headers.push(("Allow".into(), ALLOW.into()));
            vec![r]
        }
    };
    for r in &mut out {
        r.headers.push((SERVED_BY.into(), node.to_owned()));
    }
    out
}

/// Copies the request's `Record-Route` fields into a dialog-creating
/// response (RFC 3261 12.1.1), in order.
fn with_record_route(req: &SipMessage, mut resp: SipMessage) -> SipMessage {
    for (n, v) in &req.headers {
        if super::full_name(n) == "record-route" {
            resp.headers.push((n.clone(), v.clone()));
        }
    }
    resp
}
