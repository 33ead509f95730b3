//! The payload of a pub/sub message on a wake channel, as anyone who may publish on the
//! server could write it: a hand-over grant (`\t<fence> <seq> <token> <lock key>`), a waiter
//! told to try (`\n<token> <lock key>`), or a lock key.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    distlock_redis::fuzzing::payload_of_message(data);
});
