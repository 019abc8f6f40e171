//! Who may call: application servers holding one of the keys in
//! `--api-key-file` (one per line, so a new key can be added before the old
//! one is removed; SIGHUP reads the file again). Kept and compared as
//! SHA-256 digests, so a comparison takes the same time whatever the keys'
//! or the presented token's lengths and contents; never logged.
//!
//! A key may be followed on its line by the scopes it is limited to
//! (`read`, `buy`, `token`, `pay`); a key without any has them all, so a
//! key file written before scopes works unchanged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use super::error::{ApiError, Code};
use super::AppState;
use crate::error::{Error, Result};
use crate::support::sha256::sha256 as digest;

/// The keys, and the file they came from (read again by `reload`).
#[derive(Clone)]
pub struct ApiKeys {
    keys: Arc<RwLock<Arc<Vec<Key>>>>,
    file: Option<PathBuf>,
}

/// One key: its digest and what it may do.
#[derive(Clone, Copy)]
struct Key {
    digest: Digest,
    scopes: Scopes,
}

/// What a key may do, one bit per scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    /// The lookups: a purchase, an order, the voucher's state, the
    /// document.
    pub const READ: Scopes = Scopes(1);
    /// Purchases.
    pub const BUY: Scopes = Scopes(2);
    /// Admission tokens.
    pub const TOKEN: Scopes = Scopes(4);
    /// Payments.
    pub const PAY: Scopes = Scopes(8);
    pub const ALL: Scopes = Scopes(15);
    const NAMES: [(&'static str, Scopes); 4] = [
        ("read", Scopes::READ),
        ("buy", Scopes::BUY),
        ("token", Scopes::TOKEN),
        ("pay", Scopes::PAY),
    ];

    pub fn contains(self, other: Scopes) -> bool {
        self.0 & other.0 == other.0
    }

    fn named(word: &str) -> Option<Scopes> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == word)
            .map(|(_, s)| *s)
    }

    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, s)| *s == self)
            .map_or("all", |(n, _)| n)
    }

    /// The scope a `/v1` request needs, by its method and its route's
    /// template: GET (and HEAD) read; a POST buys, issues a token or pays.
    pub fn needed(method: &axum::http::Method, route: &str) -> Scopes {
        use axum::http::Method;
        if method == Method::GET || method == Method::HEAD {
            return Scopes::READ;
        }
        match route {
            "/v1/vouchers/{voucher}/purchases" => Scopes::BUY,
            "/v1/vouchers/{voucher}/tokens" => Scopes::TOKEN,
            "/v1/orders/{order}/payment" => Scopes::PAY,
            _ => Scopes::ALL,
        }
    }
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

    fn current(&self) -> Arc<Vec<Key>> {
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

    fn parse(text: &str, name: &str) -> Result<Vec<Key>> {
        let mut keys = Vec::new();
        for (n, line) in text.lines().map(str::trim).enumerate() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let key = words.next().unwrap_or_default();
            if key.len() < MIN_KEY_LEN {
                return Err(Error::InvalidInput(format!(
                    "line {} of the API key file {name}: the key is shorter than {MIN_KEY_LEN} characters",
                    n + 1
                )));
            }
            let mut scopes = Scopes(0);
            for word in words {
                let scope = Scopes::named(word).ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "line {} of the API key file {name}: unknown scope {word:?} (the scopes are read, buy, token and pay)",
                        n + 1
                    ))
                })?;
                scopes.0 |= scope.0;
            }
            if scopes.0 == 0 {
                scopes = Scopes::ALL;
            }
            keys.push(Key {
                digest: digest(key.as_bytes()),
                scopes,
            });
        }
        if keys.is_empty() {
            return Err(Error::InvalidInput(format!(
                "the API key file {name} holds no key"
            )));
        }
        Ok(keys)
    }

    /// The scopes of `presented` if it is one of the keys. Every key's
    /// digest is compared in full with the token's whatever the outcome,
    /// so the time taken says nothing about them (not even their lengths).
    pub fn scopes_of(&self, presented: &[u8]) -> Option<Scopes> {
        let presented = digest(presented);
        let (found, scopes) = self
            .current()
            .iter()
            .fold((0u8, 0u8), |(found, scopes), key| {
                let same = u8::from(equal_in_fixed_time(&key.digest, &presented));
                // All ones when the same, else zero: no branch on it.
                let mask = 0u8.wrapping_sub(same);
                (found | same, scopes | (key.scopes.0 & mask))
            });
        (found == 1).then_some(Scopes(scopes))
    }
}

type Digest = [u8; 32];

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

/// Refuses a `/v1` request without one of the keys (401), or with a key
/// whose scopes do not cover it (403): nothing done.
pub async fn require_key(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> std::result::Result<Response, ApiError> {
    if let Some(keys) = &state.keys {
        let presented = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()));
        let Some((key, scopes)) = presented.and_then(|k| Some((k, keys.scopes_of(k)?))) else {
            return Err(ApiError::unauthorized());
        };
        // Whose idempotency keys these are: callers with different API
        // keys never share one.
        let idempotency_scope = crate::idempotency::Scope::of_api_key(key);
        let route = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or("", |m| m.as_str());
        let needed = Scopes::needed(request.method(), route);
        if !scopes.contains(needed) {
            return Err(ApiError::new(
                Code::InsufficientScope,
                format!(
                    "this API key may not call this route: it needs the scope {}",
                    needed.name()
                ),
            ));
        }
        request.extensions_mut().insert(idempotency_scope);
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
        let allows = |k: &[u8]| keys.scopes_of(k).is_some();
        assert!(allows(b"new-key-0123456789abcdef"));
        assert!(allows(b"old-key-0123456789abcdef"));
        assert!(!allows(b"new-key-0123456789abcde"));
        assert!(!allows(b"new-key-0123456789abcdefg"));
        assert!(!allows(b""));
        assert!(ApiKeys::from_text("# none\n", "k").is_err());
        assert!(ApiKeys::from_text("short\n", "k").is_err());
        assert!(!format!("{keys:?}").contains("key-0123"));
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abcdef"), None);
        assert_eq!(bearer_token(b"Bear"), None);
    }

    #[test]
    fn a_key_s_scopes_limit_what_it_may_call_and_none_means_all() {
        let keys = ApiKeys::from_text(
            "full-key-0123456789abcdef\ndash-key-0123456789abcdef read\nshop-key-0123456789abcdef  buy token\n",
            "keys",
        )
        .unwrap();
        assert_eq!(
            keys.scopes_of(b"full-key-0123456789abcdef"),
            Some(Scopes::ALL)
        );
        assert_eq!(
            keys.scopes_of(b"dash-key-0123456789abcdef"),
            Some(Scopes::READ)
        );
        let shop = keys.scopes_of(b"shop-key-0123456789abcdef").unwrap();
        assert!(shop.contains(Scopes::BUY) && shop.contains(Scopes::TOKEN));
        assert!(!shop.contains(Scopes::PAY) && !shop.contains(Scopes::READ));
        let e = ApiKeys::from_text("dash-key-0123456789abcdef raed\n", "k").unwrap_err();
        assert!(e.to_string().contains("unknown scope \"raed\""), "{e}");
        use axum::http::Method;
        assert_eq!(
            Scopes::needed(&Method::GET, "/v1/orders/{order}"),
            Scopes::READ
        );
        assert_eq!(
            Scopes::needed(&Method::HEAD, "/v1/orders/{order}"),
            Scopes::READ
        );
        let post = |route| Scopes::needed(&Method::POST, route);
        assert_eq!(post("/v1/vouchers/{voucher}/purchases"), Scopes::BUY);
        assert_eq!(post("/v1/vouchers/{voucher}/tokens"), Scopes::TOKEN);
        assert_eq!(post("/v1/orders/{order}/payment"), Scopes::PAY);
        assert_eq!(post("/v1/orders/{order}"), Scopes::ALL);
    }
}
