//! RESP2 replies as a Redis server (or anything listening on its port) could send them: the
//! direct connection's reader frames them one after another, each is decoded as every
//! script's reply and as a pub/sub message; redis-rs's parser reads the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    distlock_redis::fuzzing::replies(data);
});
