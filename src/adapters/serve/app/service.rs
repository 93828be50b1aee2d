//! Every app as one `tower::Service`: [`ErasedApp`] erases the service a node
//! serves with (the built-in demo app, an upstream app, or an app a Rust
//! service embeds) behind one call, and gives each request its
//! [`RequestInfo`] as a request extension.
//!
//! The call clones the service (tower's convention: a service is `Clone`,
//! and each request gets a ready clone), waits for `poll_ready`, and boxes
//! the call's future: one allocation per request, on every app's path
//! alike (the upstream app's exchange was boxed before for its size). A
//! service need not be `Sync`: it is kept behind a mutex held only for
//! the clone (the node's runtime is `current_thread`: never contended).

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;

use http::{Request, Response};

use crate::adapters::body::Body;
use crate::adapters::errors::{AppError, UpstreamError};
use crate::adapters::serve::app::handle::Handle;
use crate::engine::node_id::NodeId;

/// What a node tells its app about a request besides the request itself:
/// a request extension on every request an app is given
/// (`req.extensions().get::<peerlb::RequestInfo>()`).
#[derive(Debug, Clone)]
pub struct RequestInfo {
    pub(crate) node: NodeId,
    pub(crate) entry: NodeId,
    pub(crate) key: Option<Box<str>>,
    pub(crate) client: SocketAddr,
    pub(crate) tls: Option<TlsInfo>,
    pub(crate) handle: Handle,
    /// The entry connection's `X-Forwarded-For` and `Forwarded` values,
    /// when the request was served at its entry (`ServeCtx::forwarded`).
    pub(crate) forwarded: Option<[http::HeaderValue; 2]>,
}

/// The TLS facts of the client's connection at the entry node.
#[derive(Debug, Clone)]
pub(crate) struct TlsInfo {
    pub(crate) sni: Option<Box<str>>,
    pub(crate) version: &'static str,
}

impl RequestInfo {
    /// The node serving the request (this node).
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The entry node: the one that received the request from the client.
    pub fn entry(&self) -> &NodeId {
        &self.entry
    }

    /// True when another node received the request and forwarded it here.
    pub fn proxied(&self) -> bool {
        self.node != self.entry
    }

    /// The hash key the request was routed on (`None`: it was not routed
    /// by a key, for example round robin or a sticky route).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The client's address as the entry node saw it (after a PROXY
    /// protocol header, when the listener takes one).
    pub fn client(&self) -> SocketAddr {
        self.client
    }

    /// True when the client's connection to the entry was TLS (HTTPS).
    pub fn https(&self) -> bool {
        self.tls.is_some()
    }

    /// The SNI name the client sent, if it sent one over TLS.
    pub fn sni(&self) -> Option<&str> {
        self.tls.as_ref().and_then(|t| t.sni.as_deref())
    }

    /// The TLS version as OpenSSL writes it (`TLSv1.3`), over TLS only.
    pub fn tls_version(&self) -> Option<&'static str> {
        self.tls.as_ref().map(|t| t.version)
    }

    /// The node's [`Handle`]: who owns a key, the members, view changes.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

/// The boxed future of one call.
pub(crate) type AppFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, AppError>> + Send>>;

/// One request to the erased service.
trait Call: Send + Sync {
    fn call(&self, req: Request<Body>) -> AppFuture;
}

struct Erased<S>(Mutex<S>);

impl<S> Call for Erased<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
{
    fn call(&self, req: Request<Body>) -> AppFuture {
        let mut svc = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Box::pin(async move {
            poll_fn(|cx| svc.poll_ready(cx)).await.map_err(app_error)?;
            svc.call(req).await.map_err(app_error)
        })
    }
}

/// A service's error as the node's [`AppError`]: an upstream app's own
/// error as it was (so its cause, a client body error included, is kept),
/// any other as [`UpstreamError::Service`].
fn app_error(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> AppError {
    match e.into().downcast::<AppError>() {
        Ok(e) => *e,
        Err(e) => AppError {
            uri: "embedded app".to_owned(),
            source: UpstreamError::Service(e),
        },
    }
}

/// A service erased: what [`App`](super::App) calls.
pub(crate) struct ErasedApp(Box<dyn Call>);

impl ErasedApp {
    /// Erases `svc`.
    pub(crate) fn new<S>(svc: S) -> ErasedApp
    where
        S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        S::Future: Send + 'static,
    {
        ErasedApp(Box::new(Erased(Mutex::new(svc))))
    }

    /// Calls the service once.
    pub(crate) fn call(&self, req: Request<Body>) -> AppFuture {
        self.0.call(req)
    }
}
