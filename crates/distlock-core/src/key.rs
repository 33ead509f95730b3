//! Validation of lock key names, shared by every engine.

use crate::error::{ErrorKind, LockError};

/// The longest lock key accepted, in bytes. Engines map longer names poorly (file names,
/// ZooKeeper paths), and a key this long is almost always a bug in the caller.
pub const MAX_KEY_LEN: usize = 1024;

/// Checks a lock key: non-empty, at most [`MAX_KEY_LEN`] bytes, no control characters.
///
/// # Errors
/// `InvalidKey` describing what is wrong.
pub fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::new(
            ErrorKind::InvalidKey,
            "the lock key is empty",
        ));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::new(
            ErrorKind::InvalidKey,
            format!(
                "the lock key is {} bytes long; the limit is {MAX_KEY_LEN}",
                key.len()
            ),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(LockError::new(
            ErrorKind::InvalidKey,
            "the lock key contains a control character",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert_eq!(
            validate_key("").map_err(|e| e.kind()),
            Err(ErrorKind::InvalidKey)
        );
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(
            validate_key(&"k".repeat(MAX_KEY_LEN + 1)).map_err(|e| e.kind()),
            Err(ErrorKind::InvalidKey)
        );
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key("orders:{42}/é").is_ok());
    }
}
