//! SHA-256 (through `ring`, already in the tree with rustls) and the
//! lowercase hex the project writes digests and random tokens in.

/// The SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// `bytes` as lowercase hex, two digits each.
pub fn hex(bytes: &[u8]) -> String {
    // A keyed purchase encodes three digests: a format! per byte was a
    // tenth of serve's CPU under load (perf, scripts/bench-serve.sh).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn digests_the_known_vector_in_hex() {
        assert_eq!(
            super::hex(&super::sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
