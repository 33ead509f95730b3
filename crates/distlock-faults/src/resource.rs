//! The protected resource: a counter per key that workers read, then write plus one.
//!
//! It runs in two modes side by side, fed the same requests:
//! - **unfenced**: accepts every write (what a resource without fencing does);
//! - **fenced**: remembers the highest fencing token it has seen, on reads and writes, and
//!   accepts a write only if its token is at least that high. A read raises the bar too, so a
//!   stale holder that read before the new holder cannot write after the new holder read.

/// One key's counter in one mode.
#[derive(Debug, Default, Clone)]
pub(crate) struct Register {
    pub(crate) value: i64,
    /// Highest token seen (fenced mode).
    pub(crate) highest: Option<u64>,
    /// Writes accepted (and acknowledged to their workers).
    pub(crate) accepted: u64,
    /// Writes turned away.
    pub(crate) rejected: u64,
    /// Accepted writes whose read was not the value they replaced: another write came between.
    pub(crate) interleaved: u64,
    /// Accepted writes with a token lower than an earlier accepted write's.
    pub(crate) token_down: u64,
    /// Accepted writes from two different operations with the same token.
    pub(crate) shared_token: u64,
    last_write: Option<(u64, u64)>,
}

impl Register {
    /// Serves a read; in fenced mode `fence` raises the bar.
    pub(crate) fn read(&mut self, fenced: bool, fence: Option<u64>) -> i64 {
        if fenced && let Some(f) = fence {
            self.highest = Some(self.highest.map_or(f, |h| h.max(f)));
        }
        self.value
    }

    /// Serves a write of `value` (the value read plus one) by operation `op`; returns whether it
    /// was accepted.
    pub(crate) fn write(&mut self, fenced: bool, op: u64, fence: Option<u64>, value: i64) -> bool {
        if fenced {
            let ok = match (fence, self.highest) {
                (Some(f), Some(h)) => f >= h,
                (Some(_), None) => true,
                // An engine without fencing tokens cannot use the fenced resource.
                (None, _) => false,
            };
            if !ok {
                self.rejected += 1;
                return false;
            }
            if let Some(f) = fence {
                self.highest = Some(f);
            }
        }
        if self.value != value - 1 {
            self.interleaved += 1;
        }
        if let (Some(f), Some((last_op, last_f))) = (fence, self.last_write) {
            if f < last_f {
                self.token_down += 1;
            } else if f == last_f && op != last_op {
                self.shared_token += 1;
            }
        }
        if let Some(f) = fence {
            self.last_write = Some((op, f));
        }
        self.value = value;
        self.accepted += 1;
        true
    }

    /// Acknowledged updates that the final value does not account for: each accepted write
    /// added one to what its worker read.
    pub(crate) fn lost_updates(&self) -> u64 {
        self.accepted.saturating_sub(self.value.max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_mode_turns_away_a_stale_writer_after_a_newer_read() {
        let mut r = Register::default();
        let a = r.read(true, Some(5));
        let b = r.read(true, Some(6));
        assert!(r.write(true, 2, Some(6), b + 1));
        assert!(
            !r.write(true, 1, Some(5), a + 1),
            "token 5 after 6 was read"
        );
        assert_eq!(
            (r.value, r.accepted, r.rejected, r.lost_updates()),
            (1, 1, 1, 0)
        );
    }

    #[test]
    fn unfenced_mode_loses_the_update_of_an_interleaved_writer() {
        let mut r = Register::default();
        let a = r.read(false, Some(5));
        let b = r.read(false, Some(6));
        assert!(r.write(false, 2, Some(6), b + 1));
        assert!(r.write(false, 1, Some(5), a + 1));
        assert_eq!(
            (r.value, r.accepted, r.interleaved, r.token_down),
            (1, 2, 1, 1)
        );
        assert_eq!(r.lost_updates(), 1);
    }

    #[test]
    fn two_operations_with_one_token_are_counted() {
        let mut r = Register::default();
        let v = r.read(true, Some(3));
        assert!(r.write(true, 1, Some(3), v + 1));
        let v = r.read(true, Some(3));
        assert!(r.write(true, 2, Some(3), v + 1));
        assert_eq!(r.shared_token, 1);
    }
}
