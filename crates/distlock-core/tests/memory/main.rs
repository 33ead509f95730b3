//! The core on the test kit's engine in memory (`MemoryStore`), in one test binary: the
//! conformance suite every engine passes (`conformance`), which shows the engine is faithful,
//! then the core's own behaviour on it (`waiting`).

mod conformance;
mod waiting;
