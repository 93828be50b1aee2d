//! A node's stable identity ([`NodeId`], `node_id` in the config) and the
//! rules a name must follow to be one ([`NodeId::new`]).
//!
//! The rules exist because an id is also a DNS label inside the name of the
//! node's certificate (`<id>.node.peerlb`, see `adapters::tls`), and a file
//! stem in the certificate directory (`<id>.pem`, `<id>.key`). They live here,
//! beside the type, so configuration, certificate issuance and the
//! simulation check ids the same way without depending on each other.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;

/// Longest node id, in bytes (one DNS label).
pub(crate) const MAX_NODE_ID_LEN: usize = 63;

/// The id reserved for the cluster CA's files (`ca.pem`, `ca.key`), compared
/// ignoring ASCII case.
pub(crate) const RESERVED_NODE_ID: &str = "ca";

/// A node's stable identity (`node_id` in the config): a name, never an index.
///
/// Cheap to clone (an `Arc<str>` inside); ordered, compared and hashed exactly
/// as the string it holds, so maps keyed by `NodeId` can be looked up with a
/// `&str` ([`Borrow<str>`]) and the ring hashes the same bytes as before.
///
/// [`NodeId::new`] (and [`FromStr`]) check the naming rules; every id read
/// from configuration or the command line goes through it. The `From`
/// conversions do not check: they take ids that were checked where they
/// entered (a gossip member's id was checked by that node's own
/// configuration) and test fixtures.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(Arc<str>);

/// A name that cannot be a node id: which rule it breaks. Rename the node in
/// `cluster.toml` (or on the command line).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid node id {id:?}: {reason}")]
pub struct InvalidNodeId {
    /// The rejected id.
    pub id: String,
    /// Which rule it breaks.
    pub reason: &'static str,
}

impl NodeId {
    /// Checks `id` against the naming rules and makes it a `NodeId`.
    ///
    /// A node id is 1..=63 ASCII letters, digits, `-`, `_` and `.`; it does
    /// not start or end with `.` or `-`, has no empty `.`-separated part, and
    /// no part starts or ends with `-` (each part is a DNS label of the
    /// node's certificate name). `ca` (any case) is reserved for the CA
    /// files.
    ///
    /// TLS compares names ignoring ASCII case, so configuration must also
    /// reject two ids that differ only in case (this checks one id alone).
    ///
    /// # Errors
    ///
    /// [`InvalidNodeId`] naming the broken rule.
    pub fn new(id: &str) -> Result<NodeId, InvalidNodeId> {
        validate(id)?;
        Ok(NodeId(Arc::from(id)))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks `id` against the rules of [`NodeId::new`] without building one.
///
/// # Errors
///
/// [`InvalidNodeId`] naming the broken rule.
pub(crate) fn validate(id: &str) -> Result<(), InvalidNodeId> {
    let fail = |reason| {
        Err(InvalidNodeId {
            id: id.to_owned(),
            reason,
        })
    };
    if id.is_empty() {
        return fail("empty");
    }
    if id.len() > MAX_NODE_ID_LEN {
        return fail("longer than 63 characters");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return fail("only ASCII letters, digits, '-', '_' and '.' are allowed");
    }
    if id.starts_with(['.', '-']) || id.ends_with(['.', '-']) {
        return fail("must not start or end with '.' or '-'");
    }
    for label in id.split('.') {
        if label.is_empty() {
            return fail("must not contain '..'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return fail("a '-' must not be next to a '.'");
        }
    }
    if id.eq_ignore_ascii_case(RESERVED_NODE_ID) {
        return fail("'ca' is reserved for the cluster CA files");
    }
    Ok(())
}

impl FromStr for NodeId {
    type Err = InvalidNodeId;

    /// As [`NodeId::new`].
    fn from_str(s: &str) -> Result<NodeId, InvalidNodeId> {
        NodeId::new(s)
    }
}

impl Deref for NodeId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodeId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// Formats as the string does (`"n1"`, quoted), as the former `Arc<str>` did.
impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for NodeId {
    /// Unchecked; see the type's doc.
    fn from(id: &str) -> NodeId {
        NodeId(Arc::from(id))
    }
}

impl From<String> for NodeId {
    /// Unchecked; see the type's doc.
    fn from(id: String) -> NodeId {
        NodeId(Arc::from(id))
    }
}

impl From<Arc<str>> for NodeId {
    /// Unchecked; see the type's doc.
    fn from(id: Arc<str>) -> NodeId {
        NodeId(id)
    }
}

impl From<NodeId> for Arc<str> {
    fn from(id: NodeId) -> Arc<str> {
        id.0
    }
}

impl PartialEq<str> for NodeId {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for NodeId {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    #[test]
    fn node_ids() {
        for ok in [
            "n1",
            "node-a",
            "web.3",
            "web_1",
            "_x",
            "A",
            "a-b.c_d",
            &"x".repeat(63),
        ] {
            assert!(validate(ok).is_ok(), "{ok}");
            assert_eq!(NodeId::new(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            &"x".repeat(64),
            ".a",
            "a.",
            "-a",
            "a-",
            "a..b",
            "a.-b",
            "a-.b",
            "a b",
            "a/b",
            "é",
            "a:1",
            "*",
            "ca",
            "CA",
        ] {
            assert!(
                matches!(validate(bad), Err(InvalidNodeId { .. })),
                "{bad:?}"
            );
            assert!(bad.parse::<NodeId>().is_err(), "{bad:?}");
        }
        assert_eq!(
            NodeId::new("a..b").unwrap_err().to_string(),
            r#"invalid node id "a..b": must not contain '..'"#
        );
    }

    /// Maps keyed by `NodeId` are found by `&str`, ordered as strings, and
    /// the id prints as the string did (`Display` bare, `Debug` quoted).
    #[test]
    fn behaves_as_its_string() {
        let ids = ["n2", "n10", "a"].map(NodeId::from);
        let tree: BTreeMap<NodeId, u32> = ids.iter().cloned().zip(0..).collect();
        assert_eq!(
            tree.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["a", "n10", "n2"]
        );
        assert_eq!(tree.get("n10"), Some(&1));
        let hash: HashMap<NodeId, u32> = ids.iter().cloned().zip(0..).collect();
        assert_eq!(hash.get("a"), Some(&2));
        assert_eq!(format!("{} {:?}", ids[0], ids[0]), r#"n2 "n2""#);
        assert_eq!(ids[1], "n10");
    }
}
