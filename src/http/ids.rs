//! Ids as callers send them: in a path, a plain decimal; in a body, a JSON
//! number or its plain decimal string. One spelling per id: no sign, no
//! leading zero, no space, no exponent; always within 1..=i64::MAX, like
//! the CLI's. Anything else is a 400 `invalid_id` and nothing is done.

use serde_json::Value;

use super::error::{quote, ApiError};

/// The largest id: MySQL's signed BIGINT.
pub const MAX_ID: u64 = i64::MAX as u64;

pub fn parse_id(what: &str, text: &str) -> Result<u64, ApiError> {
    plain_decimal(text).ok_or_else(|| {
        ApiError::invalid_id(format!(
            "{what} must be a plain decimal between 1 and {MAX_ID}, not {}",
            quote(text)
        ))
    })
}

/// An id in a body: a JSON number or its plain decimal string.
pub fn id_from_json(what: &str, value: &Value) -> Result<u64, ApiError> {
    let id = match value {
        Value::Number(n) => whole(n).filter(|n| (1..=MAX_ID).contains(n)),
        Value::String(s) => plain_decimal(s),
        _ => None,
    };
    id.ok_or_else(|| {
        let shown = match value {
            Value::String(s) => quote(s),
            Value::Number(n) => n.to_string(),
            Value::Null => "null".into(),
            Value::Bool(_) => "a boolean".into(),
            Value::Array(_) => "an array".into(),
            Value::Object(_) => "an object".into(),
        };
        ApiError::invalid_id(format!(
            "{what} must be a whole number between 1 and {MAX_ID} (a JSON number or a plain decimal string), not {shown}"
        ))
    })
}

/// A JSON number's whole value: an integer, or a float with no fraction
/// small enough to be exact (JSON Schema's `integer` takes `19.0`).
pub fn whole(n: &serde_json::Number) -> Option<u64> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        (f.fract() == 0.0 && (0.0..=EXACT).contains(&f)).then_some(f as u64)
    })
}

/// `1`..`9223372036854775807` with nothing else: what `u64::from_str`
/// takes less its `+` sign, and leading zeros.
fn plain_decimal(text: &str) -> Option<u64> {
    let digits = text.bytes().all(|b| b.is_ascii_digit());
    if !digits || text.is_empty() || text.starts_with('0') {
        return None;
    }
    text.parse().ok().filter(|n| *n <= MAX_ID)
}

/// The pattern of an id's decimal string, exactly 1..=`MAX_ID` (for the
/// OpenAPI document, so a generated client and a fuzzer know the range).
pub fn id_pattern() -> String {
    let max = MAX_ID.to_string();
    let width = max.len();
    // Shorter numbers: any, without a leading zero.
    let mut ways = vec![format!("[1-9][0-9]{{0,{}}}", width - 2)];
    // As long: below the maximum at the first digit that differs.
    for (i, c) in max.char_indices() {
        let digit = c.to_digit(10).unwrap_or(0);
        let low = if i == 0 { 1 } else { 0 };
        if digit > low {
            let rest = width - i - 1;
            ways.push(format!("{}[{low}-{}][0-9]{{{rest}}}", &max[..i], digit - 1));
        }
    }
    ways.push(max);
    format!("^({})$", ways.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_spelling_per_id() {
        assert_eq!(parse_id("voucher", "12").unwrap(), 12);
        assert_eq!(parse_id("voucher", "9223372036854775807").unwrap(), MAX_ID);
        for bad in [
            "0",
            "08",
            "+8",
            "-1",
            " 8",
            "8 ",
            "1e3",
            "12a",
            "",
            "9223372036854775808",
            "99999999999999999999",
        ] {
            assert!(parse_id("voucher", bad).is_err(), "{bad:?}");
        }
        let id = |v: Value| id_from_json("user", &v);
        assert_eq!(id(json!(42)).unwrap(), 42);
        assert_eq!(id(json!("42")).unwrap(), 42);
        assert_eq!(id(json!(42.0)).unwrap(), 42);
        for bad in [
            json!(0),
            json!(-1),
            json!(1.5),
            json!(1e300),
            json!("+900010"),
            json!("042"),
            json!(null),
            json!(true),
            json!([1]),
            json!({"id": 1}),
            json!(9_223_372_036_854_775_808u64),
        ] {
            assert!(id(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_pattern_takes_exactly_the_ids() {
        let re = regex::Regex::new(&id_pattern()).unwrap();
        for ok in [
            "1",
            "9",
            "10",
            "999999999999999999",
            "9223372036854775807",
            "9223372036854775799",
            "8999999999999999999",
            "9213372036854775807",
        ] {
            assert!(re.is_match(ok), "{ok}");
            assert!(plain_decimal(ok).is_some(), "{ok}");
        }
        for bad in [
            "0",
            "01",
            "9223372036854775808",
            "9223372036854775810",
            "9300000000000000000",
            "10000000000000000000",
            "+1",
            "",
        ] {
            assert!(!re.is_match(bad), "{bad}");
            assert!(plain_decimal(bad).is_none(), "{bad}");
        }
    }
}
