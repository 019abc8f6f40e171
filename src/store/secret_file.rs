//! Passwords read from files (systemd credentials, Kubernetes secrets) and
//! put into the store URLs, where every mask and redaction already looks.

use std::path::Path;

use crate::error::{Error, Result};
use crate::support::mask::url_list;

/// The password in `file`: its whole content less one trailing newline
/// (`\n` or `\r\n`). Errors name the file, never its content.
pub fn read_password(file: &Path, what: &str) -> Result<String> {
    let raw = std::fs::read(file)
        .map_err(|e| Error::InvalidInput(format!("{what} {}: {e}", file.display())))?;
    let text = String::from_utf8(raw)
        .map_err(|_| Error::InvalidInput(format!("{what} {} is not UTF-8 text", file.display())))?;
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(Error::InvalidInput(format!(
            "{what} {} is empty",
            file.display()
        )));
    }
    Ok(password.to_string())
}

/// `url` (or each URL of a comma-separated seed list) with `password` set;
/// a URL that carries a password of its own is refused: two sources of
/// one secret are a mistake waiting to happen.
pub fn with_password(url: &str, password: &str, what: &str) -> Result<String> {
    let urls = url_list(url).unwrap_or_else(|| vec![url]);
    let mut out = Vec::with_capacity(urls.len());
    for one in urls {
        let mut parsed = url::Url::parse(one.trim()).map_err(|e| {
            Error::InvalidInput(format!(
                "{what}: the URL {} does not parse: {e}",
                crate::support::mask::mask_url(one)
            ))
        })?;
        if parsed.password().is_some() {
            return Err(Error::InvalidInput(format!(
                "{what}: the URL {} has a password too; give it in one place only",
                crate::support::mask::mask_url(one)
            )));
        }
        parsed.set_password(Some(password)).map_err(|()| {
            Error::InvalidInput(format!(
                "{what}: the URL {} cannot carry a password",
                crate::support::mask::mask_url(one)
            ))
        })?;
        out.push(parsed.to_string());
    }
    Ok(out.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(content: &[u8]) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "seckill-secret-{}-{}",
            std::process::id(),
            crate::support::host::random_tag()
        ));
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn one_trailing_newline_is_stripped_and_no_more() {
        for (content, want) in [
            (&b"s3cret\n"[..], "s3cret"),
            (b"s3cret\r\n", "s3cret"),
            (b"s3cret", "s3cret"),
            (b"s3cret\n\n", "s3cret\n"),
            (b" spaced \n", " spaced "),
        ] {
            let f = file_with(content);
            assert_eq!(read_password(&f, "x").unwrap(), want);
            std::fs::remove_file(f).ok();
        }
    }

    #[test]
    fn empty_missing_or_binary_files_are_refused_without_their_content() {
        let f = file_with(b"\n");
        assert!(read_password(&f, "x")
            .unwrap_err()
            .to_string()
            .contains("is empty"));
        std::fs::remove_file(f).ok();
        let missing = Path::new("/nonexistent/seckill-password");
        assert!(read_password(missing, "x").is_err());
        let f = file_with(&[0xff, 0xfe, b'\n']);
        assert!(read_password(&f, "x")
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
        std::fs::remove_file(f).ok();
    }

    #[test]
    fn the_password_goes_into_every_url_and_never_twice() {
        assert_eq!(
            with_password("mysql://app@db:3306/x", "p@ss:w/rd", "m").unwrap(),
            "mysql://app:p%40ss%3Aw%2Frd@db:3306/x"
        );
        assert_eq!(
            with_password("redis://a:1/,redis://b:2/", "pw", "r").unwrap(),
            "redis://:pw@a:1/,redis://:pw@b:2/"
        );
        let twice = with_password("mysql://app:other@db/x", "pw", "m").unwrap_err();
        assert!(twice.to_string().contains("password too"));
        assert!(!twice.to_string().contains("other"));
    }
}
