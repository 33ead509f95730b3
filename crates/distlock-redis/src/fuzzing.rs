//! The fuzz targets' way in (`fuzz/`): built only with `--cfg fuzzing`, which `cargo fuzz`
//! and `.ci/fuzz` pass, never in a normal build. Each function takes untrusted bytes as a
//! server could send them and must return, whatever they are, without a panic.

use distlock_core::engine::LeaseCheck;
use redis::Value;

use crate::replies::{
    AcquireReply, FencedWrite, LeaveReply, ManyReply, MasterAcquireReply, MasterManyReply,
    PermitReply, ReadReply, ReleaseReply, ScriptReply, StatusReply,
};

/// The direct connection's reader on `bytes` as a stream of replies (framed one after the
/// other, as they would come), each reply decoded as every script's reply and as a pub/sub
/// message (and its payload as a hand-over). Also redis-rs's own parser, which reads the
/// multiplexed connection's replies, on the same bytes.
pub fn replies(bytes: &[u8]) {
    let mut at = 0;
    while at < bytes.len() {
        match crate::direct::fuzz_frame(&bytes[at..]) {
            Ok(Some((value, used))) => {
                assert!(
                    used > 0 && used <= bytes.len() - at,
                    "a reply framed as {used} bytes"
                );
                decode_all(value);
                at += used;
            }
            Ok(None) | Err(_) => break,
        }
    }
    if let Ok(value) = redis::parse_redis_value(bytes) {
        decode_all(value);
    }
}

/// `value` as each script's reply, and as a pub/sub message.
fn decode_all(value: Value) {
    let _ = LeaseCheck::decode(&value, "fuzzing");
    let _ = ManyReply::decode(&value, "fuzzing");
    let _ = AcquireReply::decode(&value, "fuzzing");
    let _ = PermitReply::decode(&value, "fuzzing");
    let _ = ReadReply::decode(&value, "fuzzing");
    let _ = ReleaseReply::decode(&value, "fuzzing");
    let _ = StatusReply::decode(&value, "fuzzing");
    let _ = LeaveReply::decode(&value, "fuzzing");
    let _ = MasterAcquireReply::decode(&value, "fuzzing");
    let _ = MasterManyReply::decode(&value, "fuzzing");
    let _ = FencedWrite::decode(&value, "fuzzing");
    if let Some((_channel, payload)) = crate::subscriber::fuzz_message(value) {
        payload_of_message(&payload);
    }
}

/// A pub/sub message's payload as the subscriber reads it: a hand-over grant, a waiter told
/// to try, or a lock key.
pub fn payload_of_message(payload: &[u8]) {
    let _ = crate::handover::parse_grant(payload);
    let _ = crate::handover::parse_told(payload);
    let _ = std::str::from_utf8(payload);
}
