//! The group's two stable hashes: a key's partition, and a partition's owner by rendezvous
//! (highest random weight) hashing over the live members.
//!
//! Both are written out here, and in `docs/ownership.md`, so that a router in another language
//! can compute them: FNV-1a (64-bit) over the bytes, then MurmurHash3's 64-bit finaliser
//! (`fmix64`) to spread FNV's low bits.
//! - A key's partition of `P`: the high 64 bits of `hash(key) × P` (a 128-bit product), which
//!   maps the hash onto `0..P` without the bias of a remainder.
//! - A member's weight for partition `p`: the hash of the member's id, a `0xFF` byte (which no
//!   UTF-8 text contains) and `p` as 4 big-endian bytes. The member with the largest weight owns
//!   `p`; equal weights go to the smaller id.
//!
//! When a member joins, it takes the partitions where its weight is the largest, about `1/N` of
//! them, and no other partition changes hands; when one leaves, only its partitions move.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `state`.
fn fnv(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// MurmurHash3's 64-bit finaliser.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The stable 64-bit hash of `bytes`.
pub(crate) fn hash64(bytes: &[u8]) -> u64 {
    fmix64(fnv(FNV_OFFSET, bytes))
}

/// The partition of `key` among `partitions` (at least 1).
pub(crate) fn partition_of(key: &str, partitions: u32) -> u32 {
    let wide = u128::from(hash64(key.as_bytes())) * u128::from(partitions.max(1));
    // The high half of a product of a 64-bit and a 32-bit number is below the 32-bit factor.
    u32::try_from(wide >> 64).unwrap_or(u32::MAX)
}

/// The weight of member `id` for `partition`.
pub(crate) fn weight(id: &str, partition: u32) -> u64 {
    let state = fnv(FNV_OFFSET, id.as_bytes());
    let state = fnv(state, &[0xFF]);
    fmix64(fnv(state, &partition.to_be_bytes()))
}

/// The owner of `partition` among `ids`: the largest weight, the smaller id on a tie. `None`
/// when there is nobody.
pub(crate) fn owner<'a>(ids: impl IntoIterator<Item = &'a str>, partition: u32) -> Option<&'a str> {
    ids.into_iter()
        .map(|id| (weight(id, partition), id))
        .max_by(|(wa, a), (wb, b)| wa.cmp(wb).then_with(|| b.cmp(a)))
        .map(|(_, id)| id)
}

/// The owner of every partition of `0..partitions` among `ids` (indices into `ids`), in one
/// pass a member: `partitions × ids` weights.
pub(crate) fn assign(ids: &[&str], partitions: u32) -> Vec<Option<usize>> {
    (0..partitions)
        .map(|p| {
            ids.iter()
                .enumerate()
                .map(|(i, id)| (weight(id, p), *id, i))
                .max_by(|(wa, a, _), (wb, b, _)| wa.cmp(wb).then_with(|| b.cmp(a)))
                .map(|(_, _, i)| i)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize, salt: &str) -> Vec<String> {
        (0..n).map(|i| format!("{salt}-member-{i}")).collect()
    }

    fn owners(ids: &[String], partitions: u32) -> Vec<String> {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        assign(&refs, partitions)
            .into_iter()
            .map(|o| refs[o.expect("a member")].to_owned())
            .collect()
    }

    #[test]
    fn the_hashes_never_change() {
        // Written down once: a router in another language, or a later version of this one,
        // must find the same partitions and owners.
        assert_eq!(hash64(b""), fmix64(FNV_OFFSET));
        assert_eq!(partition_of("order:42", 256), partition_of("order:42", 256));
        let fixed: Vec<u32> = ["order:42", "user:7", "", "é"]
            .iter()
            .map(|k| partition_of(k, 256))
            .collect();
        assert_eq!(fixed, FIXED_PARTITIONS);
        assert_eq!(owner(["a", "b", "c"], 7), Some(FIXED_OWNER));
    }

    const FIXED_PARTITIONS: [u32; 4] = [174, 225, 239, 157];
    const FIXED_OWNER: &str = "c";

    #[test]
    fn every_key_lands_in_range_and_the_partitions_fill_evenly() {
        for p in [1, 2, 7, 256, 65_536] {
            for i in 0..2_000 {
                assert!(partition_of(&format!("k{i}"), p) < p);
            }
        }
        let mut counts = vec![0u32; 256];
        for i in 0..256_000 {
            counts[partition_of(&format!("key:{i}"), 256) as usize] += 1;
        }
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*lo > 850 && *hi < 1_150, "uneven partitions: {lo}..{hi}");
    }

    #[test]
    fn a_join_moves_about_one_nth_and_only_to_the_newcomer() {
        for salt in ["a", "b", "c", "d", "e", "f", "g", "h"] {
            for n in [1usize, 3, 7, 8, 15] {
                let before = ids(n, salt);
                let mut after = before.clone();
                after.push(format!("{salt}-newcomer"));
                let (was, now) = (owners(&before, 256), owners(&after, 256));
                let moved: Vec<usize> = (0..256).filter(|&p| was[p] != now[p]).collect();
                assert!(
                    moved.iter().all(|&p| now[p] == after[n]),
                    "a partition moved between old members"
                );
                // The bar, 1/N + 5 %, from 8 members on; a smaller group moves 1/N
                // give or take four standard deviations of a binomial draw over 256.
                let share = moved.len() as f64 / 256.0;
                let q = 1.0 / (n + 1) as f64;
                let bar = if n + 1 >= 8 {
                    q + 0.05
                } else {
                    q + 4.0 * (q * (1.0 - q) / 256.0).sqrt()
                };
                assert!(share <= bar, "{salt}/{n}: {share:.3} moved, bar {bar:.3}");
            }
        }
    }

    #[test]
    fn a_leave_moves_only_the_leaver_s_partitions() {
        let before = ids(8, "leave");
        let mut after = before.clone();
        let gone = after.remove(3);
        let (was, now) = (owners(&before, 256), owners(&after, 256));
        for p in 0..256 {
            if was[p] != gone {
                assert_eq!(was[p], now[p]);
            }
        }
        assert!(was.contains(&gone));
    }

    #[test]
    fn the_owner_is_the_same_by_either_path_and_ties_go_to_the_smaller_id() {
        let members = ids(5, "x");
        let refs: Vec<&str> = members.iter().map(String::as_str).collect();
        let all = assign(&refs, 64);
        for p in 0..64 {
            assert_eq!(
                owner(refs.iter().copied(), p),
                all[p as usize].map(|i| refs[i])
            );
        }
        assert_eq!(owner(["same", "same"], 3), Some("same"));
        assert_eq!(owner(std::iter::empty::<&str>(), 3), None);
        assert_eq!(assign(&[], 4), vec![None; 4]);
    }
}
