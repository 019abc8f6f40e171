//! An `XREADGROUP` reply taken apart as it arrives: the bytes of each entry
//! id, field and value move into the entries without the redis crate's
//! per-entry map (a `HashMap` of cloned values per entry, the largest share
//! of the worker's own CPU in a drain after the allocator).

use redis::Value;

use crate::store::redis_conn::value_text;
use crate::stream::entry::RawEntry;

/// The entries of each stream in the reply, by stream key, in stream order.
/// A nil reply (nothing new) is no streams. Anything else that is not a
/// stream reply is an error naming what came instead.
pub fn streams(reply: Value) -> Result<Vec<(String, Vec<RawEntry>)>, String> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return Ok(Vec::new()),
        // RESP3: a map of stream key to entries.
        Value::Map(pairs) => pairs,
        // RESP2: an array of [key, entries] pairs.
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Array(pair) => {
                    let mut pair = pair.into_iter();
                    match (pair.next(), pair.next()) {
                        (Some(k), Some(v)) => Ok((k, v)),
                        _ => Err("a stream without its entries".to_string()),
                    }
                }
                other => Err(format!("a stream reply item {other:?}")),
            })
            .collect::<Result<_, _>>()?,
        other => return Err(format!("an XREADGROUP reply {other:?}")),
    };
    pairs
        .into_iter()
        .map(|(key, entries)| Ok((text(key)?, entries_of(entries)?)))
        .collect()
}

fn entries_of(entries: Value) -> Result<Vec<RawEntry>, String> {
    let Value::Array(entries) = entries else {
        return Err(format!("stream entries {entries:?}"));
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                return Err(format!("a stream entry {entry:?}"));
            };
            let mut parts = parts.into_iter();
            let id = text(parts.next().unwrap_or(Value::Nil))?;
            // A pending entry deleted from the stream comes back without
            // fields: it is kept, and dead-lettered as malformed.
            let fields = match parts.next() {
                Some(Value::Array(flat)) => pairs_of(flat),
                Some(Value::Map(map)) => map
                    .into_iter()
                    .map(|(k, v)| (field_text(k), field_text(v)))
                    .collect(),
                _ => Vec::new(),
            };
            Ok(RawEntry::new(id, fields))
        })
        .collect()
}

fn pairs_of(flat: Vec<Value>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((field_text(k), field_text(v)));
    }
    out
}

/// A field name or value as text, whatever its type: an odd one makes its
/// entry malformed (dead-lettered with what it carried), not the read.
fn field_text(v: Value) -> String {
    match v {
        Value::BulkString(bytes) => String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        other => value_text(&other),
    }
}

/// A stream key or entry id: text, or the reply is not a stream reply.
fn text(v: Value) -> Result<String, String> {
    match v {
        Value::BulkString(_) | Value::SimpleString(_) | Value::Int(_) => Ok(field_text(v)),
        other => Err(format!("{other:?} where a string was expected")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(fields.iter().map(|f| bulk(f)).collect()),
        ])
    }

    #[test]
    fn takes_apart_a_resp2_reply_in_stream_order() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("p:{1}:orders"),
            Value::Array(vec![
                entry("5-0", &["user", "7", "order", "70", "voucher", "1"]),
                entry("6-0", &["user", "8", "order", "80", "voucher", "1"]),
            ]),
        ])]);
        let got = streams(reply).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "p:{1}:orders");
        let ids: Vec<&str> = got[0].1.iter().map(|e| e.entry_id.as_str()).collect();
        assert_eq!(ids, ["5-0", "6-0"]);
        let m = got[0].1[1].parse(1).unwrap();
        assert_eq!((m.user, m.order, m.created_ms), (8, 80, 6));
    }

    #[test]
    fn takes_apart_a_resp3_map_and_nothing_new() {
        let reply = Value::Map(vec![(
            bulk("k"),
            Value::Array(vec![entry("9-1", &["user", "1"])]),
        )]);
        let got = streams(reply).unwrap();
        assert_eq!(got[0].1[0].field("user"), Some("1"));
        assert!(streams(Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn a_deleted_pending_entry_keeps_its_id_without_fields() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("k"),
            Value::Array(vec![Value::Array(vec![bulk("3-0"), Value::Nil])]),
        ])]);
        let got = streams(reply).unwrap();
        assert_eq!(got[0].1[0].entry_id, "3-0");
        assert!(got[0].1[0].parse(1).is_err());
    }

    #[test]
    fn an_odd_field_makes_its_entry_malformed_not_the_read() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("k"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("user"), Value::Nil]),
                ]),
                entry(
                    "2-0",
                    &["user", "5", "order", "50", "voucher", "1", "user", "6"],
                ),
            ]),
        ])]);
        let got = streams(reply).unwrap();
        assert!(got[0].1[0].parse(1).is_err());
        // A field given twice: the last one counts, as on the reclaim path.
        assert_eq!(got[0].1[1].parse(1).unwrap().user, 6);
    }

    #[test]
    fn a_reply_of_another_shape_is_an_error() {
        assert!(streams(Value::Int(3)).is_err());
        assert!(streams(Value::Array(vec![bulk("k")])).is_err());
    }
}
