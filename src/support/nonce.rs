//! Fresh random names: admission tokens, idempotency records' nonces.

use crate::error::{Error, Result};

/// 128 random bits as 32 hex digits.
pub fn fresh() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::InvalidInput(format!("no randomness for a token: {e}")))?;
    Ok(crate::support::sha256::hex(&bytes))
}
