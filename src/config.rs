//! `cluster.toml`: the serde model of the file and its validation into a
//! [`NodeConfig`] for one node.
//!
//! Two layers (docs/architecture.md, "Configuration in two layers"): [`ClusterFile`] mirrors the file exactly
//! (`deny_unknown_fields`, a `Default` per section, a doc per field); then
//! [`ClusterFile::validate`] turns it, plus per-node [`Overrides`] from flags
//! and environment variables, into typed values. Every error names the field
//! path (`nodes[1].peer_addr`) and is reported before any socket is bound;
//! `main` exits with status 64 ([`EXIT_CONFIG`]) on it.

//!
//! # Layout
//!
//! - `model`: the serde model of the file ([`ClusterFile`] and its
//!   sections) and the per-node [`Overrides`].
//! - `validate`: [`ClusterFile::check`] and [`ClusterFile::validate`], the
//!   rules every field must keep.
//! - `bind`: where a node binds its sockets when that is not the address
//!   it advertises ([`BindAddrs`]).
//! - `settings`: the validated [`NodeConfig`], grouped per part of the node
//!   ([`IngressSettings`], [`PeerSettings`], [`GossipSettings`], ...).
//! - here: the errors, where a file comes from ([`Source`]) and where the
//!   rules come from ([`RulesSource`]).

use std::path::{Path, PathBuf};

use crate::engine::rules::{MAX_RULES_FILE_BYTES, Rules};

mod bind;
mod model;
mod session;
mod settings;
#[cfg(test)]
mod tests;
mod validate;

pub use model::{
    BalanceSection, CertPairSpec, ClusterFile, GossipSection, HeadersSection, LimitsSection,
    ListenerSection, ListenerTlsSection, NodeSpec, Overrides, PeerSection, RingSection,
    SessionSection, SipsSection, StickySection, TlsSection,
};
pub use settings::{
    ADMIN_PORT_OFFSET, AppAddr, AppKind, BindAddrs, CertFiles, ClientAuth, GossipSettings,
    IngressSettings, LifecycleSettings, ListenerSettings, ListenerTls, MetricSettings, NodeAddrs,
    NodeConfig, PeerSettings, RoutingSettings, SipAppKind, SipsSettings, StateSignatures, TlsPaths,
    UpstreamApp, default_admin_addr,
};

/// The embedded default `cluster.toml`: a local 3-node cluster on 127.0.0.1
/// with the built-in app, policy consistent-hash and the `user` rules.
pub const DEFAULT_CLUSTER_TOML: &str = include_str!("../cluster.toml");

/// Exit status for an invalid configuration (`EX_USAGE` from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

pub use crate::engine::operator::MAX_WEIGHT;

/// Longest duration any `*_ms` setting accepts, in ms: 30 days. Every value
/// `check-config` accepts must start: a timer deadline `now + d` must not
/// overflow, and QUIC's idle timeout is a 62-bit varint of milliseconds.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 3_600_000;

/// A configuration error: the field path and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read. Check the path given to `--config`.
    #[error("{path}: {source}")]
    Read {
        /// The file that could not be read.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the model (unknown field,
    /// wrong type). The message carries the line and the field.
    #[error("{origin}: {message}")]
    Parse {
        /// The file name, or `<embedded cluster.toml>`.
        origin: String,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// A field has a value that is not allowed. Fix the named field.
    #[error("{origin}: {field}: {message}")]
    Invalid {
        /// The file name, or `<embedded cluster.toml>`.
        origin: String,
        /// The field path, e.g. `nodes[1].peer_addr`.
        field: String,
        /// What is wrong with the value.
        message: String,
    },
}

/// Where a cluster file came from: its path, or the embedded default.
#[derive(Debug, Clone)]
pub struct Source {
    /// Display name used in errors.
    pub origin: String,
    /// Directory relative paths are resolved against.
    pub base_dir: PathBuf,
    /// The file, or `None` for the embedded default.
    pub path: Option<PathBuf>,
    /// The file's text.
    pub text: String,
}

impl Source {
    /// Reads `path`, or takes the embedded default when `path` is `None`.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read.
    pub fn load(path: Option<&Path>) -> Result<Source, ConfigError> {
        match path {
            None => Ok(Source {
                origin: "<embedded cluster.toml>".to_owned(),
                base_dir: PathBuf::from("."),
                path: None,
                text: DEFAULT_CLUSTER_TOML.to_owned(),
            }),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                let base_dir = p
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
                Ok(Source {
                    origin: p.display().to_string(),
                    base_dir,
                    path: Some(p.to_path_buf()),
                    text,
                })
            }
        }
    }

    /// Parses the text into the serde model.
    ///
    /// # Errors
    /// [`ConfigError::Parse`] with the TOML parser's message (line, field).
    pub fn parse(&self) -> Result<ClusterFile, ConfigError> {
        toml::from_str(&self.text).map_err(|e| ConfigError::Parse {
            origin: self.origin.clone(),
            message: e.to_string().trim_end().to_owned(),
        })
    }
}

/// Where a node's data-centric rules come from, so they can be reloaded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RulesSource {
    /// `[[rules]]` of a config text that is not a file (the embedded
    /// default): cannot change.
    Inline(Box<Source>),
    /// `[[rules]]` of this cluster file.
    Toml(PathBuf),
    /// A SailFin `data-centric-rules.xml` (`rules_file`).
    Xml(PathBuf),
}

impl RulesSource {
    /// Reads and compiles the rules (again).
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and the rule or element at fault.
    pub fn load(&self) -> Result<Rules, ConfigError> {
        match self {
            RulesSource::Inline(s) => {
                Rules::compile(&s.parse()?.rules).map_err(|e| rule_error(s, e))
            }
            RulesSource::Toml(p) => {
                let s = Source::load(Some(p))?;
                Rules::compile(&s.parse()?.rules).map_err(|e| rule_error(&s, e))
            }
            RulesSource::Xml(p) => {
                let text = read_rules_file(p)?;
                Rules::from_xml(&text).map_err(|e| ConfigError::Invalid {
                    origin: p.display().to_string(),
                    field: e.path.clone(),
                    message: e.kind.to_string(),
                })
            }
        }
    }

    /// The file to watch for changes, if any.
    pub fn file(&self) -> Option<&Path> {
        match self {
            RulesSource::Inline(_) => None,
            RulesSource::Toml(p) | RulesSource::Xml(p) => Some(p),
        }
    }
}

/// Reads a rules file of at most [`MAX_RULES_FILE_BYTES`]; a larger one is
/// refused after reading one byte past the limit.
fn read_rules_file(p: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let read_error = |source| ConfigError::Read {
        path: p.display().to_string(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(p)
        .and_then(|f| {
            f.take(MAX_RULES_FILE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(read_error)?;
    if bytes.len() > MAX_RULES_FILE_BYTES {
        return Err(ConfigError::Invalid {
            origin: p.display().to_string(),
            field: "size".into(),
            message: format!(
                "larger than {MAX_RULES_FILE_BYTES} bytes, the most a rules file may be"
            ),
        });
    }
    String::from_utf8(bytes)
        .map_err(|e| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

fn rule_error(src: &Source, e: crate::engine::rules::RuleError) -> ConfigError {
    ConfigError::Invalid {
        origin: src.origin.clone(),
        message: match &e.rule {
            Some(name) => format!("{} (rule {name:?})", e.kind),
            None => e.kind.to_string(),
        },
        field: e.path,
    }
}
