//! What the handlers' annotations do not say, added to the OpenAPI
//! document in one place so that every route says it alike: the problem
//! answers any route may give (RFC 9457, with their codes), the headers on
//! every answer, and ids as tight as the parser takes them. A generated
//! client and a fuzzer then know every answer the service gives.

use serde_json::{json, Map, Value};

use super::ids::{id_pattern, MAX_ID};
use super::problem::{Code, PROBLEM_JSON};

/// The id of a path or a body, as [`super::ids`] takes it.
pub fn id_text_schema() -> Value {
    json!({
        "type": "string",
        "pattern": id_pattern(),
        "description": format!("An id: a plain decimal from 1 to {MAX_ID} (no sign, no leading zero)."),
    })
}

/// An id in a body: a JSON number or its plain decimal string.
pub fn id_in_body_schema() -> Value {
    json!({
        "oneOf": [
            { "type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_ID },
            { "type": "string", "pattern": id_pattern() },
        ],
        "description": format!("An id from 1 to {MAX_ID}: a JSON number or its plain decimal string (answers give ids as strings)."),
    })
}

fn problem_schema() -> Value {
    let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    json!({
        "type": "object",
        "description": "An answer that is not an outcome: RFC 9457 problem details, `application/problem+json`. Branch on `code`; `detail` is for people.",
        "required": ["type", "title", "status", "detail", "code", "request_id"],
        "properties": {
            "type": { "type": "string", "description": "urn:seckill:problem:<code>" },
            "title": { "type": "string", "description": "The code's title (the same for every answer of a code)." },
            "status": { "type": "integer", "description": "The answer's HTTP status." },
            "detail": { "type": "string", "maxLength": 201, "description": "One line for people: names the field at fault; no internals." },
            "code": { "type": "string", "enum": codes, "description": "One per failure kind: the table in the book's HTTP errors page." },
            "request_id": { "type": "string", "description": "The X-Request-Id of the answer, also on the server's log line that carries the cause." },
            "error": { "type": "string", "deprecated": true, "description": "The same as detail: the body of errors before problems, kept for callers that read it." },
            "outcome": { "type": "string", "enum": ["unknown"], "description": "Only with the code outcome_unknown: the purchase may or may not have happened; retry it." },
        },
    })
}

fn header(description: &str, required: bool) -> Value {
    json!({ "description": description, "required": required, "schema": { "type": "string" } })
}

/// Completes the generated document in place.
pub fn complete(doc: &mut Value) {
    doc["components"]["schemas"]["Problem"] = problem_schema();
    for schema in ["PurchaseBody", "TokenBody"] {
        let body = &mut doc["components"]["schemas"][schema];
        body["properties"]["user"] = id_in_body_schema();
        // A field the route does not know is refused (400).
        body["additionalProperties"] = json!(false);
    }
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            if matches!(method.as_str(), "get" | "post") {
                complete_operation(path, op);
            }
        }
    }
}

fn complete_operation(path: &str, op: &mut Value) {
    let v1 = path.starts_with("/v1/");
    let mut has_id = false;
    // get_mut: indexing would add a null `parameters` where there is none.
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut().filter(|p| p["in"] == "path") {
            p["schema"] = id_text_schema();
            p["example"] = json!("1");
            has_id = true;
        }
    }
    let has_body = op.get("requestBody").is_some();
    let responses = op.get_mut("responses").and_then(Value::as_object_mut);
    let Some(responses) = responses else {
        return;
    };
    let problem = |codes: &[Code]| -> String {
        let names: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
        format!("a problem: {}", names.join(", "))
    };
    let keyed = (path.ends_with("/purchases") && has_body) || path.ends_with("/payment");
    if v1 && (has_id || has_body) {
        let mut invalid = vec![Code::InvalidId, Code::InvalidBody, Code::InvalidField];
        if keyed {
            invalid.push(Code::InvalidHeader);
        }
        add_problem(responses, "400", &problem(&invalid));
    }
    if keyed {
        add_problem(responses, "409", &problem(&[Code::IdempotencyKeyInFlight]));
        add_problem(responses, "422", &problem(&[Code::IdempotencyKeyReused]));
    }
    if v1 {
        add_problem(responses, "401", &problem(&[Code::Unauthorized]));
        add_problem(responses, "403", &problem(&[Code::InsufficientScope]));
        responses["401"]["headers"]["WWW-Authenticate"] =
            header("Bearer: the scheme the key is sent with.", true);
    }
    if has_body {
        add_problem(responses, "408", &problem(&[Code::BodyTimeout]));
    }
    if path == "/metrics" {
        add_problem(responses, "404", &problem(&[Code::NoSuchRoute]));
    }
    let mut unavailable = vec![Code::Overloaded, Code::StoreUnavailable, Code::ServerFault];
    if path.ends_with("/purchases") || path.ends_with("/payment") {
        unavailable.push(Code::OutcomeUnknown);
    }
    add_problem(responses, "503", &problem(&unavailable));
    responses["503"]["headers"]["Retry-After"] = header(
        "1 (seconds) when a retry can succeed: absent with server_fault.",
        false,
    );
    // A route's own problems (a 404 of an order, say) are annotated
    // without a body: they get the problem's.
    let bare: Vec<String> = responses
        .iter()
        .filter(|(status, answer)| status.as_str() >= "400" && answer.get("content").is_none())
        .map(|(status, _)| status.clone())
        .collect();
    for status in bare {
        add_problem(responses, &status, "a problem");
    }
    for answer in responses.values_mut() {
        answer["headers"]["X-Request-Id"] = header(
            "The request's id: the one it sent (1 to 64 of A-Z a-z 0-9 . _ : -) or a new one.",
            true,
        );
    }
    if keyed {
        complete_idempotency_key(op);
    }
}

/// The `Idempotency-Key` parameter as the route takes it, and the header
/// that marks a replayed answer.
fn complete_idempotency_key(op: &mut Value) {
    if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
        for p in params.iter_mut().filter(|p| p["in"] == "header") {
            p["schema"] = json!({
                "type": "string",
                "minLength": 1,
                "maxLength": crate::idempotency::MAX_KEY_LEN + 2,
                // Bare, not opening a quote and without blanks at its
                // edges (HTTP strips them), or the draft's quoted string.
                "pattern": "^(\"[ -~]{1,255}\"|[!#-~]([ -~]{0,253}[!-~])?)$",
            });
        }
    }
    let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
        return;
    };
    for (status, answer) in responses.iter_mut() {
        let outcome = answer["content"]
            .as_object()
            .is_some_and(|c| c.contains_key("application/json"));
        if status.as_str() < "500" && outcome {
            answer["headers"]["Idempotent-Replayed"] = header(
                "true when the answer is an earlier request's with the same Idempotency-Key, given again.",
                false,
            );
        }
    }
}

/// Adds the problem body to the answer of `status`. Where the status has
/// an outcome's body already (a purchase's 403 bad_token or 503 paused),
/// each JSON content type's schema is one of the two: generated clients
/// decode by status, not by content type, and the two bodies never match
/// each other's required fields.
fn add_problem(responses: &mut Map<String, Value>, status: &str, description: &str) {
    let problem = json!({ "$ref": "#/components/schemas/Problem" });
    let Some(answer) = responses.get_mut(status) else {
        responses.insert(
            status.to_string(),
            json!({ "description": description, "content": { PROBLEM_JSON: { "schema": problem } } }),
        );
        return;
    };
    let outcomes: Vec<Value> = answer["content"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(kind, _)| kind.ends_with("json"))
        .map(|(_, c)| c["schema"].clone())
        .collect();
    if outcomes.is_empty() {
        answer["content"][PROBLEM_JSON] = json!({ "schema": problem });
        return;
    }
    if let Some(text) = answer["description"].as_str() {
        answer["description"] = json!(format!("{text}; or {description}"));
    }
    let mut either = outcomes;
    either.push(problem);
    let schema = json!({ "oneOf": either });
    answer["content"][PROBLEM_JSON] = json!({});
    if let Some(content) = answer["content"].as_object_mut() {
        for (kind, c) in content.iter_mut() {
            if kind.ends_with("json") {
                *c = json!({ "schema": schema.clone() });
            }
        }
    }
}
