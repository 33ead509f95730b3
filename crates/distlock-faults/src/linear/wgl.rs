//! Wing and Gong's linearizability search, with Lowe's memoization, over one fenced register.
//!
//! The history's operations are laid out as a list of call and return entries in time order
//! (a call before a return at the same instant, so that the two count as concurrent). The
//! search walks the list from its head: at a call it tries to *linearize* the operation (apply
//! it to the model; if its recorded outcome is what the model says, the call and its return
//! are lifted out of the list and the walk starts again from the head); at a return it has
//! found an operation that ended before anything left could be put before it, so it undoes
//! the last linearization and tries the next call after that one. The history is linearizable
//! once every completed operation is linearized; it is not once the search undoes everything.
//! Lowe's memoization remembers every (set of linearized operations, model state) reached and
//! never explores one twice, which keeps the search near linear when few operations overlap.
//!
//! An operation that never completed (its outcome unknown) has no return entry: it may take
//! effect at any moment after its call, or never; the search ends without it.

use std::collections::HashSet;

/// What an operation asked of the register, and what the history says it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// A read by a holder of `fence`; `value` is what it returned (`None`: unknown).
    Read {
        fence: Option<u64>,
        value: Option<i64>,
    },
    /// A write of `value` by a holder of `fence`; `accepted` is the register's answer (`None`:
    /// unknown).
    Write {
        fence: Option<u64>,
        value: i64,
        accepted: Option<bool>,
    },
}

/// One operation on the register: when it was invoked, when its answer was recorded (`None`:
/// never), and what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Op {
    pub(crate) call: i64,
    pub(crate) ret: Option<i64>,
    pub(crate) action: Action,
}

/// The register: its value and its fence floor (the highest fence it has taken; 0 at first,
/// so that any fence passes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct State {
    pub(crate) value: i64,
    pub(crate) floor: u64,
}

/// The register's rules.
///
/// A write with fence `f` is applied if `f` is at least the floor, and then the floor is `f`;
/// otherwise it is refused and changes nothing. A write without a fence is always refused. A
/// read returns the value; when `read_raises`, a read with fence `f` raises the floor to `f`
/// (the fenced resource's reads and SQL row `rw`'s do; row `w`'s read is a plain `SELECT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Model {
    pub(crate) read_raises: bool,
}

impl Model {
    /// The state after `action` from `s`, or `None` if the register could not have answered
    /// what the history recorded.
    pub(crate) fn step(self, s: State, action: Action) -> Option<State> {
        match action {
            Action::Read { fence, value } => {
                if value.is_some_and(|v| v != s.value) {
                    return None;
                }
                let floor = match fence {
                    Some(f) if self.read_raises => s.floor.max(f),
                    _ => s.floor,
                };
                Some(State { floor, ..s })
            }
            Action::Write {
                fence,
                value,
                accepted,
            } => {
                let applies = fence.is_some_and(|f| f >= s.floor);
                if accepted.is_some_and(|a| a != applies) {
                    return None;
                }
                Some(match fence {
                    Some(f) if applies => State { value, floor: f },
                    _ => s,
                })
            }
        }
    }
}

/// The search's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Linearizable,
    /// No order fits. `op` is the operation the deepest attempt could not place (the earliest
    /// to return of those left), after `placed` operations that left the register in `state`.
    NotLinearizable {
        op: usize,
        placed: usize,
        state: State,
    },
    /// The search took more than its limit of steps.
    Unknown,
}

/// The outcome and the number of steps the search took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Search {
    pub(crate) outcome: Outcome,
    pub(crate) steps: u64,
}

const NONE: usize = usize::MAX;

/// An entry of the list: an operation's call or return.
#[derive(Debug, Clone, Copy)]
struct Entry {
    op: usize,
    call: bool,
    /// A call's return entry (`NONE` for an operation that never completed).
    ret: usize,
    prev: usize,
    next: usize,
}

/// The set of linearized operations, as bits.
#[derive(Debug, Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn flip(&mut self, i: usize) {
        self.0[i / 64] ^= 1 << (i % 64);
    }

    /// A compact copy for the cache: the count of leading full words, and the words after
    /// them up to the last one set (operations are mostly linearized in call order, so this
    /// is a word or two).
    fn key(&self) -> (u32, Box<[u64]>) {
        let full = self.0.iter().take_while(|&&w| w == u64::MAX).count();
        let end = self.0.iter().rposition(|&w| w != 0).map_or(full, |e| e + 1);
        (full as u32, self.0[full..end.max(full)].into())
    }
}

/// Whether `ops` on a register with `model`'s rules, from `initial`, are linearizable; gives
/// up after `limit` steps.
pub(crate) fn check(model: Model, initial: State, ops: &[Op], limit: u64) -> Search {
    // Entries 0 and 1 are the list's head and tail.
    let mut order: Vec<(i64, bool, usize)> = Vec::with_capacity(2 * ops.len());
    for (i, op) in ops.iter().enumerate() {
        order.push((op.call, false, i));
        if let Some(r) = op.ret {
            // A return recorded before its call (clock trouble) is put at its call.
            order.push((r.max(op.call), true, i));
        }
    }
    order.sort_unstable();
    let mut e: Vec<Entry> = Vec::with_capacity(order.len() + 2);
    let blank = Entry {
        op: NONE,
        call: false,
        ret: NONE,
        prev: NONE,
        next: NONE,
    };
    e.push(blank);
    e.push(blank);
    let mut call_of = vec![NONE; ops.len()];
    for (k, &(_, is_ret, i)) in order.iter().enumerate() {
        let idx = k + 2;
        let prev = if k == 0 { 0 } else { idx - 1 };
        e.push(Entry {
            op: i,
            call: !is_ret,
            ret: NONE,
            prev,
            next: if k + 1 == order.len() { 1 } else { idx + 1 },
        });
        if is_ret {
            e[call_of[i]].ret = idx;
        } else {
            call_of[i] = idx;
        }
    }
    e[0].next = if order.is_empty() { 1 } else { 2 };
    e[1].prev = if order.is_empty() { 0 } else { order.len() + 1 };

    let lift = |e: &mut Vec<Entry>, x: usize| {
        let (p, n) = (e[x].prev, e[x].next);
        e[p].next = n;
        e[n].prev = p;
    };
    let unlift = |e: &mut Vec<Entry>, x: usize| {
        let (p, n) = (e[x].prev, e[x].next);
        e[p].next = x;
        e[n].prev = x;
    };

    let mut left = ops.iter().filter(|o| o.ret.is_some()).count();
    let mut bits = Bits(vec![0; ops.len().div_ceil(64)]);
    let mut cache: HashSet<(State, u32, Box<[u64]>)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state = initial;
    let mut deepest: Option<(usize, usize, State)> = None;
    let mut steps = 0u64;
    let mut at = e[0].next;
    while left > 0 {
        steps += 1;
        if steps > limit {
            return Search {
                outcome: Outcome::Unknown,
                steps,
            };
        }
        let x = e[at];
        if at != 1 && x.call {
            let op = x.op;
            if let Some(next) = model.step(state, ops[op].action) {
                bits.flip(op);
                let (full, words) = bits.key();
                if cache.insert((next, full, words)) {
                    stack.push((at, state));
                    state = next;
                    lift(&mut e, at);
                    if x.ret != NONE {
                        lift(&mut e, x.ret);
                        left -= 1;
                    }
                    at = e[0].next;
                    continue;
                }
                bits.flip(op);
            }
            at = x.next;
            continue;
        }
        // A return (or the list's end): nothing left can come before this operation.
        if at != 1 && deepest.is_none_or(|(placed, _, _)| stack.len() > placed) {
            deepest = Some((stack.len(), x.op, state));
        }
        let Some((c, before)) = stack.pop() else {
            let (placed, op, state) = deepest.unwrap_or((0, 0, initial));
            return Search {
                outcome: Outcome::NotLinearizable { op, placed, state },
                steps,
            };
        };
        let ce = e[c];
        if ce.ret != NONE {
            unlift(&mut e, ce.ret);
            left += 1;
        }
        unlift(&mut e, c);
        bits.flip(ce.op);
        state = before;
        at = ce.next;
    }
    Search {
        outcome: Outcome::Linearizable,
        steps,
    }
}

#[cfg(test)]
mod tests;
