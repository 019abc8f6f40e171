//! Certificates made with `openssl` for one test, and a TLS-only Redis.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A CA, a server certificate for 127.0.0.1/localhost, one for another
/// host, a client certificate, all signed by the CA, and a second CA that
/// signed nothing here.
pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("server.pem"), self.dir.join("server.key"))
    }
    pub fn other_host(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.join("other-host.pem"),
            self.dir.join("other-host.key"),
        )
    }
    pub fn client(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("client.pem"), self.dir.join("client.key"))
    }

    pub fn make(tag: &str) -> Certs {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seckill-certs-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the certificates' folder");
        let c = Certs { dir };
        c.self_signed("ca", "seckill test CA");
        c.self_signed("other-ca", "another CA");
        c.signed(
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        );
        c.signed(
            "other-host",
            "db.elsewhere",
            "subjectAltName=DNS:db.elsewhere",
        );
        c.signed("client", "seckill client", "extendedKeyUsage=clientAuth");
        c
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .current_dir(&self.dir)
            .args(args)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn self_signed(&self, name: &str, cn: &str) {
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    fn signed(&self, name: &str, cn: &str, ext: &str) {
        self.openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ]);
        std::fs::write(self.dir.join(format!("{name}.ext")), format!("{ext}\n"))
            .expect("the extension file");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &format!("{name}.pem"),
            "-extfile",
            &format!("{name}.ext"),
        ]);
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A Redis that speaks TLS only (`--port 0 --tls-port`), with the given
/// server certificate; `client_certs` makes it require one from clients.
pub struct TlsRedis {
    dir: PathBuf,
    pub port: u16,
    ca: PathBuf,
}

impl TlsRedis {
    pub fn start(certs: &Certs, client_certs: bool) -> TlsRedis {
        let port = super::free_port();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("seckill-tls-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the Redis folder");
        let (cert, key) = certs.server();
        let status = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
            ])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(certs.ca())
            .args([
                "--tls-auth-clients",
                if client_certs { "yes" } else { "no" },
            ])
            .arg("--dir")
            .arg(&dir)
            .args(["--appendonly", "no", "--save", "", "--daemonize", "yes"])
            .arg("--pidfile")
            .arg(dir.join("redis.pid"))
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .status()
            .expect("redis-server");
        assert!(status.success());
        let r = TlsRedis {
            dir,
            port,
            ca: certs.ca(),
        };
        let (ccert, ckey) = certs.client();
        for _ in 0..100 {
            let out = Command::new("redis-cli")
                .args(["--tls", "-p", &port.to_string()])
                .arg("--cacert")
                .arg(&r.ca)
                .arg("--cert")
                .arg(&ccert)
                .arg("--key")
                .arg(&ckey)
                .arg("ping")
                .output()
                .expect("redis-cli");
            if String::from_utf8_lossy(&out.stdout).trim() == "PONG" {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("TLS Redis on port {port} did not answer");
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("redis.pid")) {
            Command::new("kill").arg(pid.trim()).status().ok();
        }
        std::thread::sleep(Duration::from_millis(100));
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
