//! etcd's gRPC replies as the server could send them (the message bytes inside a gRPC frame),
//! decoded as each reply type the engine reads: the messages written out in
//! `distlock-etcd/src/wire/messages.rs` and the hand-written decoder of
//! `LeaseTimeToLiveResponse`'s key list (`wire/listing.rs`). The first byte picks the type.
//! A reply that decodes must encode and decode to itself, and the values of its keys are read
//! as the engine reads holder values.
#![no_main]

use distlock_core::recipes::{HolderValue, untag_value};
use distlock_etcd::wire::{
    AuthenticateResponse, DeleteRangeResponse, KeyValue, LeaseGrantResponse,
    LeaseKeepAliveResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse, PutResponse,
    RangeResponse, TxnResponse, WatchResponse,
};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// `bytes` as an `M`, if they are one; a decoded `M` must survive encoding and decoding.
fn decode<M: Message + Default + PartialEq>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let again = M::decode(m.encode_to_vec().as_slice()).expect("a reply encoded decodes");
    assert!(again == m, "a reply changed through encoding and decoding");
    Some(m)
}

/// A key's value as the engine reads it: its lease's kind, then the holder.
fn read_value(kv: &KeyValue) {
    let text = String::from_utf8_lossy(&kv.value);
    let (_, holder) = untag_value(&text);
    let _ = HolderValue::parse(holder).label();
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 10 {
        0 => {
            if let Some(r) = decode::<RangeResponse>(bytes) {
                r.kvs.iter().for_each(read_value);
            }
        }
        1 => {
            if let Some(r) = decode::<PutResponse>(bytes) {
                r.prev_kv.iter().for_each(read_value);
            }
        }
        2 => {
            if let Some(r) = decode::<DeleteRangeResponse>(bytes) {
                r.prev_kvs.iter().for_each(read_value);
            }
        }
        3 => {
            let _ = decode::<TxnResponse>(bytes);
        }
        4 => {
            let _ = decode::<LeaseGrantResponse>(bytes);
        }
        5 => {
            let _ = decode::<LeaseRevokeResponse>(bytes);
        }
        6 => {
            let _ = decode::<LeaseKeepAliveResponse>(bytes);
        }
        7 => {
            if let Some(r) = decode::<LeaseTimeToLiveResponse>(bytes) {
                assert_eq!(r.keys.iter().count(), r.keys.len());
            }
        }
        8 => {
            if let Some(r) = decode::<WatchResponse>(bytes) {
                for e in &r.events {
                    e.kv.iter().chain(e.prev_kv.iter()).for_each(read_value);
                }
            }
        }
        _ => {
            let _ = decode::<AuthenticateResponse>(bytes);
        }
    }
});
