//! Lock names and the files that hold them: a name's file name, and the names a directory's
//! files hold (`Lister`).

use std::path::Path;

use distlock_core::engine::{ErrorKind, LockError};

use crate::{FileBackend, io_err};

/// File name for a lock name: readable when safe, else a 128-bit FNV-1a hash.
pub(crate) fn file_name(name: &str) -> String {
    let safe = name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if safe {
        format!("{name}.lock")
    } else {
        format!("x-{:032x}.lock", fnv1a_128(name.as_bytes()))
    }
}

fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u128::from(*b)).wrapping_mul(PRIME))
}

/// The lock files and semaphore records of the directory: every name ever used here (files
/// are never deleted), which the status reads then sort out.
#[distlock_core::engine::async_trait]
impl distlock_core::engine::Lister for FileBackend {
    async fn names(
        &self,
        prefix: &str,
        _budget: usize,
    ) -> Result<distlock_core::engine::Names, LockError> {
        // A local directory: reading it whole is cheap and blocks no server.
        let dir = self.inner.dir.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || names_in(&dir, &prefix))
            .await
            .map_err(|e| LockError::caused_by(ErrorKind::Io, "file listing task failed", e))?
    }
}

/// The names of the lock files and semaphore records in `dir` that start with `prefix`.
fn names_in(dir: &Path, prefix: &str) -> Result<distlock_core::engine::Names, LockError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_err("listing", dir, e))?;
    let mut names = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(stem) = file
            .strip_suffix(".lock")
            .or_else(|| file.strip_suffix(".sem"))
        else {
            continue;
        };
        let name = if stem.starts_with("x-") {
            // A hashed name: the file says it.
            match std::fs::read_to_string(entry.path()) {
                Ok(text) => match text.lines().find_map(|l| l.strip_prefix("key=")) {
                    Some(key) => key.to_owned(),
                    None => continue,
                },
                Err(_) => continue,
            }
        } else {
            stem.to_owned()
        };
        if name.starts_with(prefix) {
            names.push(name);
        }
    }
    Ok(distlock_core::engine::Names::new(names, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_safe_and_stable() {
        assert_eq!(file_name("reports-daily.v2"), "reports-daily.v2.lock");
        let odd = file_name("../etc/passwd");
        assert!(odd.starts_with("x-") && odd.len() == 2 + 32 + 5, "{odd}");
        assert_eq!(odd, file_name("../etc/passwd"));
        assert_ne!(file_name("a/b"), file_name("a/c"));
        assert!(file_name(".hidden").starts_with("x-"));
        assert!(file_name(&"k".repeat(1024)).len() < 64);
        // Known FNV-1a 128 value of the empty input is the offset basis.
        assert_eq!(fnv1a_128(b""), 0x6c62272e07bb014262b821756295c58d);
    }
}
