//! Engines chosen at run time: the object-safe twin of [`Backend`], which boxes the futures of
//! the four primitives. The capability getters are object-safe already and pass through.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{
    AcquireRequest, Attempt, Backend, BatchRenew, Breaker, Capabilities, Downgrade, Handover,
    LeaseCheck, LeaseKind, LeaseRef, Linger, Lister, LockStatus, Sessions, WakeSource,
};
use crate::error::LockError;

/// A boxed, `Send` future, as the object-safe traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe twin of [`Backend`], so an engine can be chosen at run time (from a URL).
/// Every `Backend` is a `DynBackend`, and [`AnyBackend`] is a `Backend` again.
pub trait DynBackend: Send + Sync + 'static {
    /// See [`Backend::name`].
    fn dyn_name(&self) -> &'static str;
    /// See [`Backend::capabilities`].
    fn dyn_capabilities(&self) -> Capabilities;
    /// See [`Backend::why_unsupported`].
    fn dyn_why_unsupported(&self, kind: LeaseKind) -> &'static str;
    /// See [`Backend::acquire`].
    fn dyn_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>>;
    /// See [`Backend::renew`].
    fn dyn_renew<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>>;
    /// See [`Backend::release`].
    fn dyn_release<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>>;
    /// See [`Backend::inspect`].
    fn dyn_inspect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>>;
    /// See [`Backend::batch_renew`].
    fn dyn_batch_renew(&self) -> Option<&dyn BatchRenew>;
    /// See [`Backend::wake_source`].
    fn dyn_wake_source(&self) -> Option<&dyn WakeSource>;
    /// See [`Backend::sessions`].
    fn dyn_sessions(&self) -> Option<&dyn Sessions>;
    /// See [`Backend::handover`].
    fn dyn_handover(&self) -> Option<&dyn Handover>;
    /// See [`Backend::breaker`].
    fn dyn_breaker(&self) -> Option<&dyn Breaker>;
    /// See [`Backend::downgrade`].
    fn dyn_downgrade(&self) -> Option<&dyn Downgrade>;
    /// See [`Backend::why_no_downgrade`].
    fn dyn_why_no_downgrade(&self) -> &'static str;
    /// See [`Backend::lister`].
    fn dyn_lister(&self) -> Option<&dyn Lister>;
    /// See [`Backend::linger`].
    fn dyn_linger(&self) -> Option<&dyn Linger>;
    /// See [`Backend::why_no_list`].
    fn dyn_why_no_list(&self) -> &'static str;
}

impl<B: Backend> DynBackend for B {
    fn dyn_name(&self) -> &'static str {
        self.name()
    }
    fn dyn_capabilities(&self) -> Capabilities {
        self.capabilities()
    }
    fn dyn_why_unsupported(&self, kind: LeaseKind) -> &'static str {
        self.why_unsupported(kind)
    }
    fn dyn_acquire<'a>(
        &'a self,
        req: &'a AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Attempt, LockError>> {
        Box::pin(self.acquire(req))
    }
    fn dyn_renew<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.renew(lease, ttl))
    }
    fn dyn_release<'a>(
        &'a self,
        lease: &'a LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<LeaseCheck, LockError>> {
        Box::pin(self.release(lease))
    }
    fn dyn_inspect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LockStatus, LockError>> {
        Box::pin(self.inspect(name))
    }
    fn dyn_batch_renew(&self) -> Option<&dyn BatchRenew> {
        self.batch_renew()
    }
    fn dyn_wake_source(&self) -> Option<&dyn WakeSource> {
        self.wake_source()
    }
    fn dyn_sessions(&self) -> Option<&dyn Sessions> {
        self.sessions()
    }
    fn dyn_handover(&self) -> Option<&dyn Handover> {
        self.handover()
    }
    fn dyn_breaker(&self) -> Option<&dyn Breaker> {
        self.breaker()
    }
    fn dyn_downgrade(&self) -> Option<&dyn Downgrade> {
        self.downgrade()
    }
    fn dyn_why_no_downgrade(&self) -> &'static str {
        self.why_no_downgrade()
    }
    fn dyn_lister(&self) -> Option<&dyn Lister> {
        self.lister()
    }
    fn dyn_linger(&self) -> Option<&dyn Linger> {
        self.linger()
    }
    fn dyn_why_no_list(&self) -> &'static str {
        self.why_no_list()
    }
}

/// An engine chosen at run time: any [`Backend`], boxed.
///
/// A struct rather than a bare `Box<dyn DynBackend>`, so that a future of a client of it can
/// be spawned: with the bare box, rustc asks for the box's impls "for any lifetime" of the
/// trait object and refuses `tokio::spawn(async move { client.acquire(k).await })`
/// ("implementation of `Backend` is not general enough").
pub struct AnyBackend(Box<dyn DynBackend>);

impl AnyBackend {
    /// `backend`, boxed.
    pub fn new(backend: impl Backend) -> Self {
        AnyBackend(Box::new(backend))
    }

    /// The engine inside.
    pub fn inner(&self) -> &dyn DynBackend {
        &*self.0
    }
}

impl std::fmt::Debug for AnyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnyBackend")
            .field(&self.0.dyn_name())
            .finish()
    }
}

impl Backend for AnyBackend {
    fn name(&self) -> &'static str {
        self.0.dyn_name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.dyn_capabilities()
    }
    fn why_unsupported(&self, kind: LeaseKind) -> &'static str {
        self.0.dyn_why_unsupported(kind)
    }
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<Attempt, LockError> {
        self.0.dyn_acquire(req).await
    }
    async fn renew(&self, lease: &LeaseRef<'_>, ttl: Duration) -> Result<LeaseCheck, LockError> {
        self.0.dyn_renew(lease, ttl).await
    }
    async fn release(&self, lease: &LeaseRef<'_>) -> Result<LeaseCheck, LockError> {
        self.0.dyn_release(lease).await
    }
    async fn inspect(&self, name: &str) -> Result<LockStatus, LockError> {
        self.0.dyn_inspect(name).await
    }
    fn batch_renew(&self) -> Option<&dyn BatchRenew> {
        self.0.dyn_batch_renew()
    }
    fn wake_source(&self) -> Option<&dyn WakeSource> {
        self.0.dyn_wake_source()
    }
    fn sessions(&self) -> Option<&dyn Sessions> {
        self.0.dyn_sessions()
    }
    fn handover(&self) -> Option<&dyn Handover> {
        self.0.dyn_handover()
    }
    fn breaker(&self) -> Option<&dyn Breaker> {
        self.0.dyn_breaker()
    }
    fn downgrade(&self) -> Option<&dyn Downgrade> {
        self.0.dyn_downgrade()
    }
    fn why_no_downgrade(&self) -> &'static str {
        self.0.dyn_why_no_downgrade()
    }
    fn lister(&self) -> Option<&dyn Lister> {
        self.0.dyn_lister()
    }
    fn linger(&self) -> Option<&dyn Linger> {
        self.0.dyn_linger()
    }
    fn why_no_list(&self) -> &'static str {
        self.0.dyn_why_no_list()
    }
}
