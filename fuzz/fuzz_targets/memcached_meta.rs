//! A memcached meta-protocol reply: its first line (`HD c1 t30`, `VA 42 c7`, an error line)
//! and, after `VA`, the value, read back as a holder value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    distlock_memcached::fuzzing::meta_reply(data);
});
