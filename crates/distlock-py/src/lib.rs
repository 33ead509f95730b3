//! `distlock._native`: the Rust core's client and guards, for the Python package around it
//! (`python/distlock`). The Python side adds only manners (`threading.Lock`'s and
//! `asyncio.Lock`'s, the lost signal as an event and callbacks): every lock decision, wait,
//! renewal and release is the core's.

mod aio;
mod client;
mod election;
mod errors;
mod group;
mod guard;
mod runtime;

use pyo3::prelude::*;

/// The module `distlock._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::NativeClient>()?;
    m.add_class::<guard::NativeGuard>()?;
    m.add_class::<election::NativeElection>()?;
    m.add_class::<election::NativeObserver>()?;
    m.add_class::<group::NativeGroup>()?;
    m.add_class::<group::NativeGroupWatch>()?;
    m.add_class::<group::NativeMembership>()?;
    m.add_class::<aio::LoopBridge>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(engines, m)?)?;
    Ok(())
}

/// The engines this build opens, by URL scheme.
#[pyfunction]
fn engines() -> Vec<&'static str> {
    distlock::supported_schemes().to_vec()
}
