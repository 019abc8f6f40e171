//! Server version strings, as Redis's INFO and MySQL's `VERSION()` give them.

/// `"10.11.19-MariaDB-0+deb12u1"` → `(10, 11)`; unparsable parts count as 0.
pub fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_major_then_minor() {
        assert_eq!(major_minor("7.0.15"), (7, 0));
        assert_eq!(major_minor("10.11.19-MariaDB-0+deb12u1"), (10, 11));
        assert!(major_minor("6.0.9") < (6, 2));
        assert!(major_minor("6.2.0") >= (6, 2));
        assert_eq!(major_minor("garbage"), (0, 0));
    }
}
