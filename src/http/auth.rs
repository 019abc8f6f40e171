//! Who may call: application servers holding one of the keys in
//! `--api-key-file` (one per line, so a new key can be added before the old
//! one is removed; SIGHUP reads the file again). Kept and compared as
//! SHA-256 digests, so a comparison takes the same time whatever the keys'
//! or the presented token's lengths and contents; never logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use super::AppState;
use crate::error::{Error, Result};

/// The keys, and the file they came from (read again by `reload`).
#[derive(Clone)]
pub struct ApiKeys {
    keys: Arc<RwLock<Arc<Vec<Digest>>>>,
    file: Option<PathBuf>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} key(s))", self.current().len())
    }
}

/// Shorter keys are guessable.
const MIN_KEY_LEN: usize = 16;

impl ApiKeys {
    /// The keys of a file: one per line; blank lines and `#` comments skipped.
    pub fn from_file(path: &Path) -> Result<ApiKeys> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::InvalidInput(format!(
                "cannot read the API key file {}: {e}",
                path.display()
            ))
        })?;
        let keys = Self::parse(&text, &path.display().to_string())?;
        Ok(ApiKeys {
            keys: Arc::new(RwLock::new(Arc::new(keys))),
            file: Some(path.to_path_buf()),
        })
    }

    /// Reads the file again (SIGHUP): the new keys replace the old at once.
    /// A file that cannot be read or holds no valid key changes nothing:
    /// the error says why, and the keys in use stay.
    pub fn reload(&self) -> Result<usize> {
        let Some(path) = &self.file else {
            return Ok(self.current().len());
        };
        let fresh = Self::from_file(path)?.current();
        let count = fresh.len();
        let mut keys = match self.keys.write() {
            Ok(keys) => keys,
            Err(poisoned) => poisoned.into_inner(),
        };
        *keys = fresh;
        Ok(count)
    }

    fn current(&self) -> Arc<Vec<Digest>> {
        match self.keys.read() {
            Ok(keys) => keys.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    #[cfg(test)]
    fn from_text(text: &str, name: &str) -> Result<ApiKeys> {
        let keys = Self::parse(text, name)?;
        Ok(ApiKeys {
            keys: Arc::new(RwLock::new(Arc::new(keys))),
            file: None,
        })
    }

    fn parse(text: &str, name: &str) -> Result<Vec<Digest>> {
        let keys: Vec<Vec<u8>> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.as_bytes().to_vec())
            .collect();
        if keys.is_empty() {
            return Err(Error::InvalidInput(format!(
                "the API key file {name} holds no key"
            )));
        }
        if let Some(n) = keys.iter().position(|k| k.len() < MIN_KEY_LEN) {
            return Err(Error::InvalidInput(format!(
                "key {} of the API key file {name} is shorter than {MIN_KEY_LEN} characters",
                n + 1
            )));
        }
        Ok(keys.iter().map(|k| digest(k)).collect())
    }

    /// Whether `presented` is one of the keys. Every key's digest is
    /// compared in full with the token's whatever the outcome, so the time
    /// taken says nothing about them (not even their lengths).
    pub fn allows(&self, presented: &[u8]) -> bool {
        let presented = digest(presented);
        self.current().iter().fold(false, |found, key| {
            found | equal_in_fixed_time(key, &presented)
        })
    }
}

type Digest = [u8; 32];

fn digest(bytes: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

fn equal_in_fixed_time(a: &Digest, b: &Digest) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    diff == 0
}

/// The token of an `Authorization: Bearer <token>` value (the scheme's
/// name is case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

/// Refuses a `/v1` request without one of the keys (401, nothing done).
pub async fn require_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> std::result::Result<Response, ApiError> {
    if let Some(keys) = &state.keys {
        let presented = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()));
        if !presented.is_some_and(|k| keys.allows(k)) {
            return Err(ApiError::Unauthorized);
        }
    }
    Ok(next.run(request).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_line_by_line_and_compared_exactly() {
        let keys = ApiKeys::from_text(
            "# rotated in December\nnew-key-0123456789abcdef\n\n  old-key-0123456789abcdef  \n",
            "keys",
        )
        .unwrap();
        assert!(keys.allows(b"new-key-0123456789abcdef"));
        assert!(keys.allows(b"old-key-0123456789abcdef"));
        assert!(!keys.allows(b"new-key-0123456789abcde"));
        assert!(!keys.allows(b"new-key-0123456789abcdefg"));
        assert!(!keys.allows(b""));
        assert!(ApiKeys::from_text("# none\n", "k").is_err());
        assert!(ApiKeys::from_text("short\n", "k").is_err());
        assert!(!format!("{keys:?}").contains("key-0123"));
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abcdef"), None);
        assert_eq!(bearer_token(b"Bear"), None);
    }
}
