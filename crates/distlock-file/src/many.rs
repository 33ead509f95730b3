//! Several names taken at once (`MultiLock`): each name's lock file locked without waiting, in
//! the names' sorted order, and every one let go again when one is busy; the holders' records
//! are written only once all the files are locked, so an attempt that finds a name busy changes
//! no file and uses up no fence.

use std::time::Duration;

use distlock_core::engine::{
    AcquireMany, LeaseCheck, LockError, ManyAttempt, MultiLock, Token, combine_checks,
};

use crate::acquire::holder_body;
use crate::flock::{FileId, Locked, lock_file, still_at};
use crate::record::{next_fence, parse, read_all, write_record};
use crate::{FileBackend, linger};

/// One name of a multi-name hold: its file, locked.
pub(crate) struct HeldName {
    path: std::path::PathBuf,
    id: FileId,
    fence: u64,
    /// Dropped last: the flock goes, then the writer's close tells watchers.
    _file: Locked,
}

impl FileBackend {
    fn acquire_all_blocking(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        let token = req.token.as_str();
        if let Some(held) = self.held_many().get(token) {
            // A resent request with our token: already ours.
            return Ok(ManyAttempt::Acquired {
                fences: held.iter().map(|h| Some(h.fence)).collect(),
            });
        }
        // Every file locked first, in the names' order; a busy one lets go of the others
        // (their locks are dropped with `files`), before anything is written.
        let mut files = Vec::with_capacity(req.names.len());
        for (i, name) in req.names.iter().enumerate() {
            let path = self.lock_path(name);
            let Some((mut file, id)) = lock_file(&path, false)? else {
                return Ok(ManyAttempt::Busy {
                    name: i,
                    holder_ttl: None,
                });
            };
            let rec = parse(&read_all(&mut file.lock, &path)?, &path)?;
            if let Some(left) = linger::left(&rec) {
                return Ok(ManyAttempt::Busy {
                    name: i,
                    holder_ttl: Some(left),
                });
            }
            files.push((path, id, file, rec));
        }
        let mut held = Vec::with_capacity(files.len());
        for ((path, id, mut file, rec), name) in files.into_iter().zip(req.names) {
            let fence = next_fence(&rec, &path)?;
            write_record(
                &mut file.writer,
                &path,
                &holder_body(fence, req.owner, name),
            )?;
            held.push(HeldName {
                path,
                id,
                fence,
                _file: file,
            });
        }
        let fences = held.iter().map(|h| Some(h.fence)).collect();
        self.held_many().insert(token.to_owned(), held);
        Ok(ManyAttempt::Acquired { fences })
    }

    /// What each name of `token`'s hold comes to: `Ours` while its file is still the lock
    /// file (not swapped out by a forced release).
    fn check_all(held: &[HeldName], names: &[&str]) -> LeaseCheck {
        if held.len() != names.len() {
            return LeaseCheck::Missing;
        }
        combine_checks(held.iter().map(|h| {
            if still_at(&h.path, h.id) {
                LeaseCheck::Ours
            } else {
                LeaseCheck::Missing
            }
        }))
    }
}

#[distlock_core::engine::async_trait]
impl MultiLock for FileBackend {
    async fn acquire_all(&self, req: &AcquireMany<'_>) -> Result<ManyAttempt, LockError> {
        // Synchronous, as a single name's acquire: no await point, so a cancelled attempt
        // never leaves files locked behind its back.
        self.acquire_all_blocking(req)
    }

    async fn renew_all(
        &self,
        names: &[&str],
        token: &Token,
        _ttl: Duration,
    ) -> Result<LeaseCheck, LockError> {
        // The flocks last as long as the open files: renewing is checking them.
        Ok(match self.held_many().get(token.as_str()) {
            Some(held) => Self::check_all(held, names),
            None => LeaseCheck::Missing,
        })
    }

    async fn release_all(&self, names: &[&str], token: &Token) -> Result<LeaseCheck, LockError> {
        let held = self.held_many().remove(token.as_str());
        // Closing the files releases the flocks.
        Ok(match held {
            Some(held) => Self::check_all(&held, names),
            None => LeaseCheck::Missing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_core::engine::{Backend, LeaseRef};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_busy_name_leaves_every_other_free_and_no_fence_used() {
        let d = tempfile::tempdir().expect("tempdir");
        let b = FileBackend::new(d.path()).expect("backend");
        let clock: Arc<dyn distlock_core::Clock> = Arc::new(distlock_core::SystemClock);
        let (one, many) = (Token::generate(), Token::generate());
        let ttl = Duration::from_secs(5);
        let single = distlock_core::engine::AcquireRequest::new("c", &one, ttl, "me", &clock);
        assert!(matches!(
            b.acquire(&single).await.expect("c"),
            distlock_core::engine::Attempt::Acquired { fence: Some(1) }
        ));
        let names = ["a", "b", "c"];
        let req = AcquireMany::new(&names, &many, ttl, "me", &clock);
        let got = b.acquire_all(&req).await.expect("attempt");
        assert_eq!(
            got,
            ManyAttempt::Busy {
                name: 2,
                holder_ttl: None
            }
        );
        // a and b were let go, with no fence used.
        let a = b.inspect("a").await.expect("inspect");
        assert!(!a.held, "{a:?}");
        let lease = LeaseRef::new("c", &one, distlock_core::LeaseKind::Exclusive);
        assert_eq!(b.release(&lease).await.expect("release"), LeaseCheck::Ours);
        let got = b.acquire_all(&req).await.expect("attempt");
        assert_eq!(
            got,
            ManyAttempt::Acquired {
                fences: vec![Some(1), Some(1), Some(2)]
            }
        );
        // Idempotent for the same token; another token finds the names busy.
        assert_eq!(b.acquire_all(&req).await.expect("resend"), got);
        let other = Token::generate();
        let req2 = AcquireMany::new(&names[..2], &other, ttl, "me", &clock);
        assert!(matches!(
            b.acquire_all(&req2).await.expect("busy"),
            ManyAttempt::Busy { name: 0, .. }
        ));
        assert_eq!(
            b.renew_all(&names, &many, ttl).await.expect("renew"),
            LeaseCheck::Ours
        );
        assert_eq!(
            b.release_all(&names, &many).await.expect("release"),
            LeaseCheck::Ours
        );
        assert_eq!(
            b.release_all(&names, &many).await.expect("again"),
            LeaseCheck::Missing
        );
        assert!(b.acquire_all(&req2).await.is_ok());
    }
}
