//! Every app behind one call: [`ErasedApp`] erases the app a node serves
//! with (an app a Rust service embeds as a `tower::Service`, or one of the
//! node's own: the built-in demo app, an upstream app). An embedded
//! service's request carries its [`RequestInfo`] as an extension; the
//! node's own apps read the request path's context itself (`ServeCtx`:
//! no extension map, no copy of the key).
//!
//! An embedded service is called as tower says: each request gets a clone
//! of the service, ready (`poll_ready`) before its call, and the call's
//! future is boxed (one allocation per request). A service need not be
//! `Sync`: it is kept behind a mutex held only for the clone (the node's
//! runtime is `current_thread`: never contended). The node's own apps
//! are called as they are ([`Call`]): the built-in app's answer is ready
//! at once and costs no allocation; the upstream app's exchange is one
//! box.

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use http::{Request, Response};

use crate::adapters::body::Body;
use crate::adapters::errors::{AppError, UpstreamError};
use crate::adapters::serve::app::ServeCtx;
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

/// The future of one call: the answer when the app gave it at once (the
/// built-in app's, but for `/delay/<ms>`: no allocation), else the
/// service's own future, boxed (one allocation).
pub(crate) enum AppFuture {
    /// The answer, until it is taken.
    Ready(Option<Result<Response<Body>, AppError>>),
    /// The service's future.
    Boxed(Pin<Box<dyn Future<Output = Result<Response<Body>, AppError>> + Send>>),
}

impl Future for AppFuture {
    type Output = Result<Response<Body>, AppError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            AppFuture::Ready(r) => {
                Poll::Ready(r.take().expect("an app's ready answer is polled once"))
            }
            AppFuture::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

/// One request to an erased app: a `tower::Service` ([`Erased`]) or one
/// of the node's own apps, called without the service's clone and its
/// lock (`App::new`).
pub(crate) trait Call: Send + Sync {
    /// Serves `req`, told `ctx` and the node's `handle` (an embedded
    /// service as the request's [`RequestInfo`] extension; the node's own
    /// apps read what they need of `ctx` before the call returns).
    fn call(&self, req: Request<Body>, ctx: &ServeCtx<'_>, handle: &Handle) -> AppFuture;
}

struct Erased<S>(Mutex<S>);

impl<S> Call for Erased<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
{
    fn call(&self, mut req: Request<Body>, ctx: &ServeCtx<'_>, handle: &Handle) -> AppFuture {
        req.extensions_mut().insert(ctx.info(handle));
        let mut svc = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        // A service that is ready at once (most are) is called now, and
        // its future is the only box; one that is not is waited for in
        // the box, with the request's task's waker (a service wakes the
        // last waker it was polled with, so the first poll's no-op one is
        // never relied on).
        match svc.poll_ready(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(Ok(())) => {
                let answer = svc.call(req);
                AppFuture::Boxed(Box::pin(async move { answer.await.map_err(app_error) }))
            }
            Poll::Ready(Err(e)) => AppFuture::Ready(Some(Err(app_error(e)))),
            Poll::Pending => AppFuture::Boxed(Box::pin(async move {
                poll_fn(|cx| svc.poll_ready(cx)).await.map_err(app_error)?;
                svc.call(req).await.map_err(app_error)
            })),
        }
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

    /// Erases one of the node's own apps (called as it is: no clone, no
    /// lock, no `poll_ready`).
    pub(crate) fn direct(app: impl Call + 'static) -> ErasedApp {
        ErasedApp(Box::new(app))
    }

    /// Calls the service once.
    pub(crate) fn call(
        &self,
        req: Request<Body>,
        ctx: &ServeCtx<'_>,
        handle: &Handle,
    ) -> AppFuture {
        self.0.call(req, ctx, handle)
    }
}
