//! `up --tls`: a certificate authority made for this cluster and the certificates it signs, in
//! `DIR/tls/`: `ca.pem` (what clients trust), `router.pem`/`router.key` (the router's, for
//! `localhost` and `127.0.0.1`). The servers' certificate (for `127.0.0.1`) goes into each data
//! directory, where pgharness puts it; the router checks it against `ca.pem`
//! (`[backend] sslmode = "verify-full"`). `down` removes the directory.

use std::path::{Path, PathBuf};

use pgharness::tls::{Issued, TestCa};

use crate::Result;

/// The directory of the cluster's TLS files, relative to the cluster directory (and to
/// `router.toml`, which names them relative to itself).
pub const TLS_DIR: &str = "tls";
pub const CA_FILE: &str = "tls/ca.pem";
pub const ROUTER_CERT_FILE: &str = "tls/router.pem";
pub const ROUTER_KEY_FILE: &str = "tls/router.key";

/// The CA file clients pass as `sslrootcert`.
pub fn ca_path(dir: &Path) -> PathBuf {
    dir.join(CA_FILE)
}

/// Makes a new CA and the router's certificate in `dir/tls/` (replacing any there) and returns
/// the servers' certificate and key.
pub fn generate(dir: &Path) -> Result<Issued> {
    let tls = dir.join(TLS_DIR);
    std::fs::create_dir_all(&tls).map_err(|e| format!("creating {}: {e}", tls.display()))?;
    let ca = TestCa::new(&format!("shardgate local cluster CA ({})", dir.display()))?;
    ca.write(&dir.join(CA_FILE))?;
    ca.issue(&["localhost", "127.0.0.1"])?
        .write(&dir.join(ROUTER_CERT_FILE), &dir.join(ROUTER_KEY_FILE))?;
    Ok(ca.issue(&["127.0.0.1", "localhost"])?)
}

/// The `router.toml` lines that turn TLS on both ways. Clients choose (`allow`): psql's default
/// `sslmode=prefer` gets TLS, while loadgen and `cluster demo`, which connect without TLS, keep
/// working.
pub fn router_config() -> String {
    format!(
        "# TLS for clients that ask for it (psql does by default).\n\
         [tls]\n\
         mode = \"allow\"\n\
         cert = \"{ROUTER_CERT_FILE}\"\n\
         key = \"{ROUTER_KEY_FILE}\"\n\
         \n"
    )
}

/// The `[backend]` lines that make the router encrypt and verify its shard connections.
pub fn backend_config() -> String {
    format!("sslmode = \"verify-full\"\nca = \"{CA_FILE}\"\n")
}

/// A libpq URL for the router over TLS, checked against the cluster's CA.
pub fn connection_url(url_without_tls: &str, dir: &Path) -> String {
    let url = url_without_tls.replacen("@127.0.0.1:", "@localhost:", 1);
    format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        crate::router::percent_encode(&ca_path(dir).display().to_string())
    )
}

/// Removes `dir/tls/` (nothing when it is not there).
pub fn remove(dir: &Path) -> Result<()> {
    let tls = dir.join(TLS_DIR);
    match std::fs::remove_dir_all(&tls) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", tls.display()).into()),
    }
}
