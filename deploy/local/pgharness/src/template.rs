//! The template data directory: `initdb` runs once per machine (per installation and owner), every
//! server starts from a copy of it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cleanup::fnv1a;
use crate::error::{Error, Result};
use crate::install::PgInstall;
use crate::user::{chown, server_command, RunAs};

pub(crate) const TEMPLATE_PREFIX: &str = "shardgate-pgtemplate-";

/// Password of the `postgres` superuser (TCP connections use SCRAM with it; the Unix socket trusts).
pub const PASSWORD: &str = "postgres";
/// The superuser name.
pub const SUPERUSER: &str = "postgres";

fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

/// `<tmp>/shardgate-pgtemplate-<major>-<hash>`; the hash covers the bin directory, the exact
/// version and the owning uid (root's `postgres`-owned template and a user's own never collide).
pub(crate) fn template_path(install: &PgInstall, run_as: Option<&RunAs>, tmp: &Path) -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let owner = run_as
        .map(|r| r.uid)
        .unwrap_or_else(|| unsafe { libc::geteuid() });
    let hash = fnv1a(&[
        install.bindir().as_os_str().as_encoded_bytes(),
        install.version().as_bytes(),
        owner.to_string().as_bytes(),
    ]);
    tmp.join(format!("{TEMPLATE_PREFIX}{}-{hash:016x}", install.major()))
}

fn is_complete(dir: &Path) -> bool {
    dir.join("PG_VERSION").is_file() && dir.join("global/pg_control").is_file()
}

/// Returns the template directory, creating it when missing. Safe against concurrent processes:
/// each builds in its own sibling directory and renames it into place; the loser of the rename
/// deletes its copy and uses the winner's.
pub(crate) fn ensure_template(
    install: &PgInstall,
    run_as: Option<&RunAs>,
    tmp: &Path,
) -> Result<PathBuf> {
    let template = template_path(install, run_as, tmp);
    if is_complete(&template) {
        return Ok(template);
    }
    let name = template
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if template.exists() {
        // Only complete directories are ever renamed into place, so this one was damaged (e.g. by
        // a temp-dir cleaner). Move it aside atomically, then delete it.
        let trash = tmp.join(format!("{name}.trash-{}", unique_suffix()));
        if std::fs::rename(&template, &trash).is_ok() {
            let _ = std::fs::remove_dir_all(&trash);
        }
    }

    let suffix = unique_suffix();
    let building = tmp.join(format!("{name}.tmp-{suffix}"));
    let pwfile = tmp.join(format!("{name}.pw-{suffix}"));
    std::fs::create_dir(&building)
        .map_err(|e| Error::io("creating the template build directory", &building, e))?;
    let result = build(install, run_as, &building, &pwfile);
    let _ = std::fs::remove_file(&pwfile);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&building);
        return Err(e);
    }
    match std::fs::rename(&building, &template) {
        Ok(()) => Ok(template),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&building);
            if is_complete(&template) {
                Ok(template) // another process won the race
            } else {
                Err(Error::io(
                    "moving the new template data directory into place",
                    &template,
                    e,
                ))
            }
        }
    }
}

fn build(install: &PgInstall, run_as: Option<&RunAs>, dir: &Path, pwfile: &Path) -> Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
        Error::io(
            "setting permissions of the template build directory",
            dir,
            e,
        )
    })?;
    chown(dir, run_as)?;
    std::fs::write(pwfile, format!("{PASSWORD}\n"))
        .map_err(|e| Error::io("writing the initdb password file", pwfile, e))?;
    std::fs::set_permissions(pwfile, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io("setting permissions of the initdb password file", pwfile, e))?;
    chown(pwfile, run_as)?;

    let initdb = install.program("initdb");
    let mut cmd = server_command(&initdb, run_as);
    cmd.arg("-D")
        .arg(dir)
        .arg("-U")
        .arg(SUPERUSER)
        .arg("--auth-local=trust")
        .arg("--auth-host=scram-sha-256")
        .arg(format!("--pwfile={}", pwfile.display()))
        .arg("-E")
        .arg("UTF8")
        .arg("--no-locale")
        .arg("--no-sync");
    let out = cmd.output().map_err(|e| Error::Command {
        what: "creating the template data directory".into(),
        program: initdb.display().to_string(),
        status: format!("could not be run: {e}"),
        stderr: String::new(),
    })?;
    if !out.status.success() {
        return Err(Error::Initdb {
            dir: dir.to_path_buf(),
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}
