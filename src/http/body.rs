//! Request bodies: one JSON object of the route's documented fields, read
//! within `--request-timeout`. Every other body is a 400 `invalid_body`
//! naming the problem in our words (never a parser's type names, never the
//! input beyond a short excerpt); one that does not arrive in time a 408:
//! nothing was done.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::FromRequest;
use axum::http::header::CONTENT_TYPE;
use serde_json::value::RawValue;
use serde_json::Value;

use super::error::{excerpt, quote, ApiError, Code};
use super::ids::{id_from_json, whole_number};
use super::AppState;

/// A body type built from its JSON object's fields.
pub(crate) trait FromFields: Sized {
    /// The names a body may hold (any other is refused).
    const FIELDS: &'static [&'static str];
    fn from_fields(fields: &mut Fields) -> Result<Self, ApiError>;
}

/// The extractor: `Body(x)` where `x: impl FromFields`.
pub(crate) struct Body<T>(pub T);

impl<T: FromFields> FromRequest<Arc<AppState>> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(
        req: axum::extract::Request,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        if !is_json(req.headers().get(CONTENT_TYPE)) {
            return Err(ApiError::invalid_body(
                "the body must be JSON (Content-Type: application/json)",
            ));
        }
        let read = axum::body::Bytes::from_request(req, state);
        let bytes = match tokio::time::timeout(state.request_timeout, read).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => {
                return Err(ApiError::invalid_body(format!(
                    "the body is larger than {} bytes, or did not arrive whole",
                    super::MAX_BODY
                )))
            }
            Err(_) => {
                return Err(ApiError::new(
                    Code::BodyTimeout,
                    format!(
                        "the request's body did not arrive within {}; nothing was done",
                        humantime::format_duration(state.request_timeout)
                    ),
                ))
            }
        };
        // Each field as its JSON text (a number is read from its digits,
        // never through a float); a body that is not an object is read
        // again only to say what it is instead.
        let map: BTreeMap<String, Box<RawValue>> =
            serde_json::from_slice(&bytes).map_err(|_| not_an_object(&bytes))?;
        let mut fields = Fields::new(map, T::FIELDS)?;
        T::from_fields(&mut fields).map(Body)
    }
}

/// Why a body is not a JSON object: not JSON at all, or another kind.
fn not_an_object(bytes: &[u8]) -> ApiError {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => ApiError::invalid_body(format!(
            "the body must be a JSON object, not {}",
            kind_of(&value)
        )),
        Err(e) => ApiError::invalid_body(format!(
            "the body is not valid JSON (line {}, column {})",
            e.line(),
            e.column()
        )),
    }
}

/// A request refused with a problem may leave its body unread (a key
/// refused, an id refused, the in-flight cap), and the server then drops
/// the connection rather than read what it does not need: the answer says
/// `Connection: close`, so no client sends its next request on a
/// connection about to close. Outcomes read their body whole and keep it.
pub async fn close_if_refused_with_body(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
    let headers = request.headers();
    let has_body = headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let mut response = next.run(request).await;
    let problem = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == super::problem::PROBLEM_JSON.as_bytes());
    if has_body && problem {
        response
            .headers_mut()
            .insert(CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    response
}

fn is_json(value: Option<&axum::http::HeaderValue>) -> bool {
    let Some(mime) = value.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A body's fields, each taken once by name, as their JSON text.
pub(crate) struct Fields {
    map: BTreeMap<String, Box<RawValue>>,
}

impl Fields {
    fn new(map: BTreeMap<String, Box<RawValue>>, allowed: &[&str]) -> Result<Fields, ApiError> {
        if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ApiError::invalid_body(format!(
                "unknown field {}: the fields are {}",
                quote(unknown),
                allowed.join(", ")
            )));
        }
        Ok(Fields { map })
    }

    /// The field's JSON text; None when absent or null.
    fn take(&mut self, name: &str) -> Option<String> {
        let raw = self.map.remove(name)?;
        let text = raw.get().trim();
        (text != "null").then(|| text.to_string())
    }

    /// A required id.
    pub fn id(&mut self, name: &str) -> Result<u64, ApiError> {
        match self.take(name) {
            Some(literal) => id_from_json(name, &literal),
            None => Err(ApiError::invalid_body(format!(
                "the field {name} is required"
            ))),
        }
    }

    /// An optional whole number within `range` (null: absent).
    pub fn number(
        &mut self,
        name: &str,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Option<u64>, ApiError> {
        let Some(literal) = self.take(name) else {
            return Ok(None);
        };
        let n = whole_number(&literal).filter(|n| range.contains(n));
        n.map(Some).ok_or_else(|| {
            ApiError::invalid_field(format!(
                "{name} must be a whole number from {} to {}, not {}",
                range.start(),
                range.end(),
                excerpt(&literal)
            ))
        })
    }

    /// A client reference (src/orders/reference.rs): a string of 1..=64
    /// printable ASCII characters.
    pub fn client_reference(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        let reference = self.text(name, usize::MAX)?;
        if let Some(r) = &reference {
            crate::orders::reference::check(r)
                .map_err(|why| ApiError::invalid_field(format!("{name}: {why}")))?;
        }
        Ok(reference)
    }

    /// An optional string of at most `max` characters (null: absent).
    pub fn text(&mut self, name: &str, max: usize) -> Result<Option<String>, ApiError> {
        let Some(literal) = self.take(name) else {
            return Ok(None);
        };
        match serde_json::from_str::<String>(&literal) {
            Ok(s) if s.chars().count() <= max => Ok(Some(s)),
            Ok(_) => Err(ApiError::invalid_field(format!(
                "{name} is longer than {max} characters"
            ))),
            Err(_) => Err(ApiError::invalid_field(format!(
                "{name} must be a string, not {}",
                excerpt(&literal)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn json_content_types() {
        let is = |v: &str| is_json(Some(&HeaderValue::from_str(v).unwrap()));
        assert!(is("application/json"));
        assert!(is("Application/JSON; charset=utf-8"));
        assert!(is("application/merge-patch+json"));
        assert!(!is("text/plain"));
        assert!(!is("application/jsonx"));
        assert!(!is_json(None));
    }

    #[test]
    fn fields_are_taken_by_name_and_checked() {
        let map =
            |text: &str| serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(text).unwrap();
        let allowed = ["user", "quantity", "token"];
        assert!(Fields::new(map(r#"{"user": 1, "x": 2}"#), &allowed).is_err());
        let mut f = Fields::new(map(r#"{"user": "7", "quantity": 2.0}"#), &allowed).unwrap();
        assert_eq!(f.id("user").unwrap(), 7);
        assert_eq!(f.number("quantity", 1..=5).unwrap(), Some(2));
        assert_eq!(f.text("token", 8).unwrap(), None);
        let mut f = Fields::new(map(r#"{"quantity": 0, "token": 5}"#), &allowed).unwrap();
        assert_eq!(f.id("user").unwrap_err().code, Code::InvalidBody);
        assert_eq!(
            f.number("quantity", 1..=5).unwrap_err().code,
            Code::InvalidField
        );
        assert_eq!(f.text("token", 8).unwrap_err().code, Code::InvalidField);
        let mut f = Fields::new(map(r#"{"user": null, "token": null}"#), &allowed).unwrap();
        assert_eq!(f.id("user").unwrap_err().code, Code::InvalidBody);
        assert_eq!(f.text("token", 8).unwrap(), None);
    }
}
