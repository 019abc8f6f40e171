//! A client reference: the caller's own name for a purchase (its cart or
//! checkout id), kept with the order it becomes, from the admission or the
//! waitlist through the stream to MySQL's `seckill_order.client_reference`.

/// The longest reference: the column's width and `lua/seckill.lua`'s check.
pub const MAX_LEN: usize = 64;

/// Checks a reference: 1..=64 printable ASCII characters (space to `~`),
/// as `lua/seckill.lua` checks its `ARGV[8]`. The error names the problem.
pub fn check(text: &str) -> Result<(), String> {
    if text.is_empty() || text.len() > MAX_LEN {
        return Err(format!(
            "a client reference is 1 to {MAX_LEN} characters, not {}",
            text.len()
        ));
    }
    if !crate::support::printable::is_printable_ascii(text) {
        return Err(
            "a client reference holds printable ASCII characters only (space to ~)".to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_one_to_64_printable_ascii_characters() {
        for good in ["a", "cart 7/x~", &"r".repeat(64)] {
            assert!(check(good).is_ok(), "{good}");
        }
        for bad in ["", &"r".repeat(65), "tab\there", "é", "new\nline", "\u{7f}"] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }
}
