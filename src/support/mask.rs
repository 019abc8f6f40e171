//! Credentials never reach a terminal or a log: URLs are shown with their
//! password replaced, and any text can be scrubbed of known secrets.

const MASK: &str = "***";

/// `scheme://user:secret@host/...` → `scheme://user:***@host/...`.
/// Text that does not parse as a URL is masked between `://` and the last `@`
/// so that a malformed URL still cannot leak its password.
/// A comma-separated list of URLs (a cluster's seed nodes) is masked URL by
/// URL; a comma inside a password does not split it.
pub fn mask_url(raw: &str) -> String {
    match url_list(raw) {
        Some(urls) => urls
            .into_iter()
            .map(mask_one_url)
            .collect::<Vec<_>>()
            .join(","),
        None => mask_one_url(raw),
    }
}

/// The URLs of a comma-separated list, when every piece is one (a comma
/// inside a password does not split it).
pub fn url_list(raw: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = raw.split(',').collect();
    (parts.len() > 1 && parts.iter().all(|p| p.contains("://"))).then_some(parts)
}

fn mask_one_url(raw: &str) -> String {
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
    for one in url_list(raw).unwrap_or_else(|| vec![raw]) {
        if let Ok(url) = url::Url::parse(one) {
            if let Some(p) = url.password() {
                out.push(p.to_string());
                if let Ok(decoded) = percent_encoding::percent_decode_str(p).decode_utf8() {
                    out.push(decoded.into_owned());
                }
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Scrubs `text` before it is shown: every URL in it gets its password
/// masked, and every known secret of 8 or more characters is replaced.
/// (Shorter secrets are left to the URL masking: replacing a short word such
/// as the dev default `seckill` everywhere would garble the message itself.)
pub fn redact(text: &str, secrets: &[String]) -> String {
    let urls_masked: Vec<String> = text
        .split(' ')
        .map(|word| match (word.find("://"), word.rfind('@')) {
            (Some(_), Some(_)) => {
                let trimmed = word.trim_matches(|c: char| "`'\"()[]<>,;:.".contains(c));
                word.replace(trimmed, &mask_url(trimmed))
            }
            _ => word.to_string(),
        })
        .collect();
    secrets
        .iter()
        .filter(|s| s.chars().count() >= 8)
        .fold(urls_masked.join(" "), |acc, s| {
            acc.replace(s.as_str(), MASK)
        })
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
    fn masks_every_url_of_a_seed_list() {
        let seeds = "redis://:one@a:7001/,redis://u:two@b:7002/";
        assert_eq!(
            mask_url(seeds),
            "redis://:***@a:7001/,redis://u:***@b:7002/"
        );
        assert_eq!(secrets_of(seeds), ["one", "one", "two", "two"]);
        let comma_in_password = "redis://:se,cret@a:7001/";
        assert!(!mask_url(comma_in_password).contains("se,cret"));
    }

    #[test]
    fn masks_urls_that_do_not_parse() {
        let masked = mask_url("mysql://app:p@ss word@db:99999/x");
        assert!(!masked.contains("ss word"), "{masked}");
        assert!(masked.contains("***"));
    }

    #[test]
    fn redacts_raw_and_decoded_secrets() {
        let secrets = secrets_of("mysql://app:p%40ssw0rd!@db/x");
        assert_eq!(
            redact("login p@ssw0rd! failed, p%40ssw0rd!", &secrets),
            "login *** failed, ***"
        );
    }

    #[test]
    fn redacts_urls_inside_messages_but_not_short_words() {
        let secrets = secrets_of("mysql://seckill:seckill@db/seckill");
        assert_eq!(
            redact(
                "cannot reach `mysql://seckill:seckill@db/seckill`: run seckill init",
                &secrets
            ),
            "cannot reach `mysql://seckill:***@db/seckill`: run seckill init"
        );
    }
}
