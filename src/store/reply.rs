//! Reading the elements of a Lua script's reply: Redis hands a number back
//! as an integer, or as the text a script stored (a hash field read back).

use redis::Value;

/// An integer element, or one stored as its decimal text.
pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A string element's bytes.
pub fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}
