//! etcd's v3 gRPC API as distlock speaks it: the messages ([`messages`]), a connection to one
//! member ([`Conn`]), and small constructors for the requests the engine builds.
//!
//! Written here rather than taken from a generated client, so that building distlock needs
//! nothing but the Rust toolchain: no `protoc`, no build script. It is public for the
//! benchmarks' raw floor and for tests; it is not part of distlock's stable API.

mod conn;
mod listing;
pub mod messages;

pub use conn::{Conn, KeepAlive, Tls, WatchStream};
pub use listing::{KeyList, LeaseTimeToLiveResponse};
pub use messages::*;

/// The end of the range that holds every key starting with `prefix` (etcd's convention: the
/// prefix with its last byte below 0xff incremented, and what follows dropped; `[0]` means
/// "to the end of the key space").
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl RangeRequest {
    /// A read of one key.
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        RangeRequest {
            key: key.into(),
            ..Default::default()
        }
    }

    /// A read of every key under `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        RangeRequest {
            range_end: prefix_end(&key),
            key,
            ..Default::default()
        }
    }

    /// Sorted by `target`, in `order`.
    pub fn sorted(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.sort_target = target as i32;
        self.sort_order = order as i32;
        self
    }

    /// At most `n` keys.
    pub fn limit(mut self, n: i64) -> Self {
        self.limit = n;
        self
    }

    /// Keys and metadata, no values.
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }

    /// Only keys created at or before revision `rev`.
    pub fn max_create_revision(mut self, rev: i64) -> Self {
        self.max_create_revision = rev;
        self
    }
}

impl RequestOp {
    /// A read, inside a transaction.
    pub fn range(r: RangeRequest) -> Self {
        RequestOp {
            request: Some(Request::Range(r)),
        }
    }

    /// A write of `value` under `key`, attached to `lease` (0: none).
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
        RequestOp {
            request: Some(Request::Put(PutRequest {
                key: key.into(),
                value: value.into(),
                lease,
                ..Default::default()
            })),
        }
    }

    /// Moves `key` to `lease`, keeping its value.
    pub fn move_to_lease(key: impl Into<Vec<u8>>, lease: i64) -> Self {
        RequestOp {
            request: Some(Request::Put(PutRequest {
                key: key.into(),
                lease,
                ignore_value: true,
                ..Default::default()
            })),
        }
    }

    /// A delete of one key.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        RequestOp {
            request: Some(Request::DeleteRange(DeleteRangeRequest {
                key: key.into(),
                ..Default::default()
            })),
        }
    }
}

impl Compare {
    /// `key`'s `target` compared with `value` (whose variant names the same target).
    fn of(key: Vec<u8>, result: CompareResult, target: CompareTarget, value: TargetUnion) -> Self {
        Compare {
            result: result as i32,
            target: target as i32,
            key,
            target_union: Some(value),
            range_end: Vec::new(),
        }
    }

    /// `key`'s create revision compared with `rev` (0: the key does not exist).
    pub fn create_revision(key: impl Into<Vec<u8>>, result: CompareResult, rev: i64) -> Self {
        let value = TargetUnion::CreateRevision(rev);
        Self::of(key.into(), result, CompareTarget::Create, value)
    }

    /// `key`'s last modification revision compared with `rev`.
    pub fn mod_revision(key: impl Into<Vec<u8>>, result: CompareResult, rev: i64) -> Self {
        let value = TargetUnion::ModRevision(rev);
        Self::of(key.into(), result, CompareTarget::Mod, value)
    }

    /// The lease `key` is attached to compared with `lease`.
    pub fn lease(key: impl Into<Vec<u8>>, result: CompareResult, lease: i64) -> Self {
        let value = TargetUnion::Lease(lease);
        Self::of(key.into(), result, CompareTarget::Lease, value)
    }

    /// The same comparison over every key under the key taken as a prefix.
    pub fn over_prefix(mut self) -> Self {
        self.range_end = prefix_end(&self.key);
        self
    }
}

impl TxnRequest {
    /// A transaction: `success` if every one of `compare` holds, `failure` otherwise.
    pub fn new(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> Self {
        TxnRequest {
            compare,
            success,
            failure,
        }
    }
}

/// The revision in a reply's header (0 when the header is missing).
pub fn revision(header: Option<&ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

impl ResponseOp {
    /// The reply of a read, if this is one.
    pub fn range(&self) -> Option<&RangeResponse> {
        match &self.response {
            Some(Response::Range(r)) => Some(r),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn prefix_ends_follow_etcd() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), [0]);
        assert_eq!(prefix_end(b""), [0]);
    }

    #[test]
    fn messages_round_trip() {
        let txn = TxnRequest::new(
            vec![Compare::create_revision("p/", CompareResult::Equal, 0).over_prefix()],
            vec![RequestOp::put("p/1", "v", 7)],
            vec![RequestOp::range(
                RangeRequest::prefix("p/")
                    .sorted(SortTarget::Create, SortOrder::Ascend)
                    .limit(1)
                    .keys_only(),
            )],
        );
        let bytes = txn.encode_to_vec();
        assert_eq!(TxnRequest::decode(bytes.as_slice()).expect("decodes"), txn);
        // A field this crate does not declare (tag 15, varint) is skipped on decode.
        let mut reply = TxnResponse {
            succeeded: true,
            ..Default::default()
        }
        .encode_to_vec();
        reply.extend_from_slice(&[15 << 3, 1]);
        assert!(
            TxnResponse::decode(reply.as_slice())
                .expect("decodes")
                .succeeded
        );
    }
}
