//! A MySQL that goes back in time, as a failover to an asynchronous
//! replica or a backup restored leaves it: the test's database dumped with
//! `mariadb-dump`, and later switched back to that dump.

use std::path::PathBuf;

use super::TestEnv;

/// A dump of a test's database, removed when dropped.
pub struct Dump {
    path: PathBuf,
}

impl Drop for Dump {
    fn drop(&mut self) {
        std::fs::remove_file(&self.path).ok();
    }
}

impl TestEnv {
    fn mysql_client(&self, program: &str) -> std::process::Command {
        let url = url::Url::parse(&self.cfg.mysql_url).expect("mysql url");
        let mut c = std::process::Command::new(program);
        c.args(["--no-defaults", "-h127.0.0.1"])
            .arg(format!("-u{}", url.username()))
            .arg(format!("-p{}", url.password().unwrap_or_default()))
            .arg(format!("-P{}", url.port().unwrap_or(3306)));
        c
    }

    /// The database as it is now.
    pub fn dump_mysql(&self) -> Dump {
        let dumped = self
            .mysql_client("mariadb-dump")
            .arg(&self.db_name)
            .output()
            .expect("run mariadb-dump");
        assert!(dumped.status.success(), "mariadb-dump: {dumped:?}");
        // One file per dump: a test may hold several of one database.
        static DUMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = DUMPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("seckill-{}-dump-{n}.sql", self.db_name));
        std::fs::write(&path, &dumped.stdout).expect("write the dump");
        Dump { path }
    }

    /// The database back as `dump` has it (what it got since is lost), in
    /// one step, as a failover to a replica switches: the dump is loaded
    /// beside it, and every table swapped for its copy by one RENAME
    /// (atomic; a worker's transaction in between would otherwise commit
    /// into half-loaded tables, a MySQL inconsistent in itself).
    pub fn restore_mysql(&self, dump: &Dump) {
        let beside = format!("{}_restore", self.db_name);
        self.mysql_sql(&format!(
            "DROP DATABASE IF EXISTS {beside}; CREATE DATABASE {beside}"
        ));
        let loaded = self
            .mysql_client("mariadb")
            .arg(&beside)
            .stdin(std::fs::File::open(&dump.path).expect("open the dump"))
            .output()
            .expect("run mariadb");
        assert!(loaded.status.success(), "mariadb < dump: {loaded:?}");
        let tables = self.mysql_sql(&format!("SHOW TABLES FROM {beside}"));
        let db = &self.db_name;
        let swaps: Vec<String> = tables
            .lines()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                format!("{db}.{t} TO {beside}.{t}_gone, {beside}.{t} TO {db}.{t}, {beside}.{t}_gone TO {beside}.{t}")
            })
            .collect();
        self.mysql_sql(&format!("RENAME TABLE {}", swaps.join(", ")));
        self.mysql_sql(&format!("DROP DATABASE {beside}"));
    }

    /// Runs `sql` with the mariadb client; its output, one row a line.
    fn mysql_sql(&self, sql: &str) -> String {
        let out = self
            .mysql_client("mariadb")
            .args(["-N", "-B", "-e", sql])
            .output()
            .expect("run mariadb");
        assert!(out.status.success(), "mariadb -e {sql:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
