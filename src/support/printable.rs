//! Text a caller names things with: printable ASCII, so it survives any
//! header, log line, Lua pattern or column without escaping questions.

/// Every byte is printable ASCII, space to `~`.
pub fn is_printable_ascii(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
}
