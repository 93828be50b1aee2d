//! peerlb as a library: a Rust service embeds a node, serves its requests
//! as a `tower::Service`, and asks the node's ring who owns a key.
//!
//! [`NodeBuilder`] (from [`Node::builder`]) takes the validated config, an
//! [`Env`] (default: [`Env::bind`], the real sockets) and the app; the
//! built node's [`Handle`] answers for the ring outside requests, and
//! every request the app is given carries a [`RequestInfo`] extension
//! (with the same handle) inside them.
//!
//! The app's request and response body is [`crate::body::Body`],
//! the node's own streaming body (a boxed `http_body::Body` of `Bytes`):
//! the bodies the node reads from clients and peers are already of that
//! type, so handing them to the app costs no conversion or further
//! boxing; [`crate::body::full`] and [`crate::body::empty`] make one, and
//! `http_body_util::BodyExt::boxed_unsync` turns any other body with
//! [`BodyError`](crate::body::BodyError) errors into one.

use http::{Request, Response};

use crate::Node;
use crate::adapters::body::Body;
use crate::adapters::serve::app::service::ErasedApp;
use crate::config::NodeConfig;
use crate::env::{BindError, Env};
use crate::node::NodeError;

#[cfg(doc)]
use crate::{Handle, RequestInfo};

/// Builds a [`Node`]: the config, then optionally the [`Env`] and the
/// app, then [`NodeBuilder::build`].
///
/// ```no_run
/// # async fn start(config: peerlb::NodeConfig) -> Result<(), Box<dyn std::error::Error>> {
/// use http::{Request, Response};
/// use peerlb::body::{Body, full};
///
/// let app = tower::service_fn(|req: Request<Body>| async move {
///     let info = req.extensions().get::<peerlb::RequestInfo>().unwrap();
///     let text = format!("served by {}\n", info.node());
///     Ok::<_, std::convert::Infallible>(Response::new(full(text)))
/// });
/// let node = peerlb::Node::builder(config).app(app).build()?;
/// let handle = node.handle();
/// println!("alice lives on {}", handle.owner("alice"));
/// node.run(std::future::pending()).await?;
/// # Ok(()) }
/// ```
pub struct NodeBuilder {
    config: NodeConfig,
    env: Option<Env>,
    app: Option<ErasedApp>,
}

/// A node could not be built by [`NodeBuilder::build`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The default [`Env`] could not bind a socket the config names (or
    /// read the gossip keyring): free the port, or hand in an [`Env`].
    #[error(transparent)]
    Bind(Box<BindError>),
    /// The gossip keyring file (`tls.gossip_keyring`) cannot be read: run
    /// `peerlb certs`.
    #[error("tls.gossip_keyring: {0}")]
    Keyring(#[from] crate::keyring::KeyringError),
    /// The node could not be built (TLS material: see [`NodeError`]);
    /// boxed, as the error is large.
    #[error(transparent)]
    Node(Box<NodeError>),
}

impl Node {
    /// A builder for a node of `config`.
    pub fn builder(config: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            config,
            env: None,
            app: None,
        }
    }
}

impl NodeBuilder {
    /// The sockets, clock and seed the node runs with (tests hand in
    /// loopback sockets; the default binds what the config names).
    #[must_use]
    pub fn env(mut self, env: Env) -> NodeBuilder {
        self.env = Some(env);
        self
    }

    /// Serves requests with `service` instead of the config's `app`.
    ///
    /// The service is cloned once per request and the clone called once it
    /// is ready (tower's convention); it need not be `Sync`. An error it
    /// returns is answered `502 Bad Gateway`. Every request has a
    /// [`RequestInfo`] extension; its URI is the request-target as the
    /// client sent it; peerlb's own `peerlb-*` headers are removed.
    #[must_use]
    pub fn app<S>(mut self, service: S) -> NodeBuilder
    where
        S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        S::Future: Send + 'static,
    {
        self.app = Some(ErasedApp::new(service));
        self
    }

    /// Builds the node (binds nothing when an [`Env`] was given; else
    /// [`Env::bind`]s the config's sockets, which must happen inside the
    /// tokio runtime the node will run on).
    ///
    /// # Errors
    /// [`BuildError`]: a socket or file that cannot be used.
    pub fn build(self) -> Result<Node, BuildError> {
        let env = match self.env {
            Some(env) => env,
            None => {
                let keyring = crate::keyring::Keyring::load(&self.config.tls.gossip_keyring)?;
                Env::bind(&self.config, keyring).map_err(|e| BuildError::Bind(Box::new(e)))?
            }
        };
        Node::build_with(self.config, env, self.app).map_err(|e| BuildError::Node(Box::new(e)))
    }
}
