//! Credentials never reach a terminal or a log: URLs are shown with their
//! password replaced, and any text can be scrubbed of known secrets.

const MASK: &str = "***";

/// `scheme://user:secret@host/...` → `scheme://user:***@host/...`.
/// Text that does not parse as a URL is masked between `://` and the last `@`
/// so that a malformed URL still cannot leak its password.
pub fn mask_url(raw: &str) -> String {
    if let Ok(mut url) = url::Url::parse(raw) {
        if url.password().is_some() && url.set_password(Some(MASK)).is_ok() {
            return url.to_string();
        }
        if url.password().is_none() {
            return raw.to_string();
        }
    }
    match (raw.find("://"), raw.rfind('@')) {
        (Some(start), Some(at)) if at > start + 3 => {
            let userinfo = &raw[start + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}:{}{}", &raw[..start + 3], user, MASK, &raw[at..])
        }
        _ => raw.to_string(),
    }
}

/// The password of a URL, if it has one (percent-decoded and raw, since
/// either form may appear in a driver's message).
pub fn secrets_of(raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(url) = url::Url::parse(raw) {
        if let Some(p) = url.password() {
            out.push(p.to_string());
            if let Ok(decoded) = percent_encoding::percent_decode_str(p).decode_utf8() {
                out.push(decoded.into_owned());
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Replaces every occurrence of each secret in `text` with `***`.
pub fn redact(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| s.len() >= 2)
        .fold(text.to_string(), |acc, s| acc.replace(s.as_str(), MASK))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_the_password_only() {
        assert_eq!(
            mask_url("mysql://app:s3cret@db:3306/seckill"),
            "mysql://app:***@db:3306/seckill"
        );
        assert_eq!(
            mask_url("redis://:pw@127.0.0.1:6379/"),
            "redis://:***@127.0.0.1:6379/"
        );
        assert_eq!(
            mask_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
    }

    #[test]
    fn masks_urls_that_do_not_parse() {
        let masked = mask_url("mysql://app:p@ss word@db:99999/x");
        assert!(!masked.contains("ss word"), "{masked}");
        assert!(masked.contains("***"));
    }

    #[test]
    fn redacts_raw_and_decoded_secrets() {
        let secrets = secrets_of("mysql://app:p%40ss@db/x");
        assert_eq!(
            redact("login p@ss failed, p%40ss", &secrets),
            "login *** failed, ***"
        );
    }
}
