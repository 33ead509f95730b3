//! `Lease.LeaseTimeToLive`'s reply, decoded by hand: its list of the keys attached to a lease
//! is kept as one buffer, not a `Bytes` (32 bytes, and the reply's whole frame kept alive) a
//! key. A renewal of 100,000 locks on one session reads a listing of 100,000 keys.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};

use super::ResponseHeader;

/// `Lease.LeaseTimeToLive`'s reply.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct LeaseTimeToLiveResponse {
    pub header: Option<ResponseHeader>,
    pub id: i64,
    /// Seconds left; -1 when the lease does not exist.
    pub ttl: i64,
    pub granted_ttl: i64,
    /// The keys attached (when they were asked for).
    pub keys: KeyList,
}

/// Keys, one after another in one buffer.
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct KeyList {
    bytes: Vec<u8>,
    /// Where each key ends in `bytes`.
    ends: Vec<u32>,
}

impl KeyList {
    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The keys, in the order the server listed them.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| &self.bytes[a as usize..b as usize])
    }

    /// Adds a key at the end.
    pub fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends
            .push(u32::try_from(self.bytes.len()).unwrap_or(u32::MAX));
    }

    /// Reads a key of `len` bytes from `buf`.
    fn read(&mut self, len: usize, buf: &mut impl Buf) -> Result<(), prost::DecodeError> {
        if len > buf.remaining() || self.bytes.len() + len > u32::MAX as usize {
            #[allow(deprecated)] // prost's only way to make one outside its own decoders
            return Err(prost::DecodeError::new("a key runs past its reply"));
        }
        if self.bytes.capacity() == 0 {
            // Every key of the reply fits in what is left of it: one allocation, where growing
            // by doubling would hold two copies at once.
            self.bytes.reserve_exact(buf.remaining());
        }
        let mut left = len;
        while left > 0 {
            let chunk = buf.chunk();
            let n = chunk.len().min(left);
            self.bytes.extend_from_slice(&chunk[..n]);
            buf.advance(n);
            left -= n;
        }
        self.ends.push(self.bytes.len() as u32);
        Ok(())
    }
}

impl prost::Message for LeaseTimeToLiveResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        use prost::encoding::{encode_key, encode_varint, int64, message};
        if let Some(h) = &self.header {
            message::encode(1, h, buf);
        }
        for (tag, v) in [(2, self.id), (3, self.ttl), (4, self.granted_ttl)] {
            if v != 0 {
                int64::encode(tag, &v, buf);
            }
        }
        for key in self.keys.iter() {
            encode_key(5, WireType::LengthDelimited, buf);
            encode_varint(key.len() as u64, buf);
            buf.put_slice(key);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        use prost::encoding::{check_wire_type, decode_varint, int64, message, skip_field};
        match tag {
            1 => message::merge(
                wire_type,
                self.header.get_or_insert_with(Default::default),
                buf,
                ctx,
            ),
            2 => int64::merge(wire_type, &mut self.id, buf, ctx),
            3 => int64::merge(wire_type, &mut self.ttl, buf, ctx),
            4 => int64::merge(wire_type, &mut self.granted_ttl, buf, ctx),
            5 => {
                check_wire_type(WireType::LengthDelimited, wire_type)?;
                let len = decode_varint(buf)?;
                self.keys
                    .read(usize::try_from(len).unwrap_or(usize::MAX), buf)
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        use prost::encoding::{encoded_len_varint, int64, key_len, message};
        let header = self
            .header
            .as_ref()
            .map_or(0, |h| message::encoded_len(1, h));
        let ints: usize = [(2, self.id), (3, self.ttl), (4, self.granted_ttl)]
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(tag, v)| int64::encoded_len(tag, &v))
            .sum();
        let keys: usize = self
            .keys
            .iter()
            .map(|k| key_len(5) + encoded_len_varint(k.len() as u64) + k.len())
            .sum();
        header + ints + keys
    }

    fn clear(&mut self) {
        *self = LeaseTimeToLiveResponse::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The reply as prost's derive would declare it: the other side of the round trip.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Derived {
        #[prost(message, optional, tag = "1")]
        header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")]
        id: i64,
        #[prost(int64, tag = "3")]
        ttl: i64,
        #[prost(int64, tag = "4")]
        granted_ttl: i64,
        #[prost(bytes = "vec", repeated, tag = "5")]
        keys: Vec<Vec<u8>>,
    }

    #[test]
    fn a_listing_reads_and_writes_as_the_derived_message() {
        let derived = Derived {
            header: Some(ResponseHeader {
                revision: 42,
                ..Default::default()
            }),
            id: 7,
            ttl: -1,
            granted_ttl: 3,
            keys: vec![b"p/a/c-0".to_vec(), Vec::new(), vec![0xff; 300]],
        };
        let mut wire = derived.encode_to_vec();
        // A field this crate does not declare (tag 15, varint) is skipped.
        wire.extend_from_slice(&[15 << 3, 1]);
        let ours = LeaseTimeToLiveResponse::decode(wire.as_slice()).expect("decodes");
        assert_eq!((ours.id, ours.ttl, ours.granted_ttl), (7, -1, 3));
        assert_eq!(ours.header.as_ref().map(|h| h.revision), Some(42));
        assert_eq!(ours.keys.len(), 3);
        let keys: Vec<&[u8]> = ours.keys.iter().collect();
        assert_eq!(keys, [&b"p/a/c-0"[..], &[][..], &[0xff; 300][..]]);
        let back = ours.encode_to_vec();
        assert_eq!(back.len(), ours.encoded_len());
        assert_eq!(Derived::decode(back.as_slice()).expect("decodes"), derived);
    }

    #[test]
    fn a_key_longer_than_its_reply_is_an_error() {
        // Field 5, length 9, and only 2 bytes.
        let wire = [5 << 3 | 2, 9, b'a', b'b'];
        assert!(LeaseTimeToLiveResponse::decode(&wire[..]).is_err());
    }
}
