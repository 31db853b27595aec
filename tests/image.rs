//! The image without an engine (`hack/build-image.sh`, `hack/oci-image.py`): the archive's image
//! stage is read from the Dockerfile, so the two cannot drift apart; the builder stages are
//! redone by the script by hand, and their text is pinned here.
//!
//! - the Dockerfile's image stage, read by the script, gives the image the Dockerfile describes:
//!   the static binary as the entrypoint, the kubectl plugin link, helm and the renderer, the CA
//!   bundle, an empty `/charts` owned by 65532, user 65532 — the user the StatefulSet runs as;
//! - an instruction the script does not reproduce, a `COPY` from a stage it has no directory for
//!   or of a file that stage does not produce, a base it does not know: each is an error naming it;
//! - two archives of the same input are the same bytes, and name the image for `ctr import`;
//! - the builder stages' instructions have the sha256 the script was last checked against.
//!
//! Runs in a second (no cargo build: the stages are stand-in files; `make e2e` builds and runs
//! the real image on a real node, tests/e2e.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Stand-ins of what the Dockerfile's builder stages produce (their RUN results), as
/// `hack/build-image.sh` lays them out.
fn stages(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path, content: &str| {
        std::fs::write(path, content).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let operator = dir.join("operator");
    std::fs::create_dir_all(operator.join("plugin")).unwrap();
    std::fs::create_dir_all(operator.join("charts")).unwrap();
    executable(&operator.join("module-manager"), "operator");
    std::os::unix::fs::symlink(
        "module-manager",
        operator.join("plugin/kubectl-module_manager"),
    )
    .unwrap();
    for (stage, file) in [("helm", "helm"), ("renderer", "module-manager-renderer")] {
        std::fs::create_dir_all(dir.join(stage).join("out")).unwrap();
        executable(&dir.join(stage).join("out").join(file), file);
    }
    ["operator", "helm", "renderer"]
        .iter()
        .flat_map(|s| {
            [
                "--stage".to_owned(),
                format!("{s}={}", dir.join(s).display()),
            ]
        })
        .collect()
}

fn oci_image(dockerfile: &Path, stages: &[String], extra: &[&str]) -> Output {
    Command::new("python3")
        .arg(repo().join("hack/oci-image.py"))
        .args(["dockerfile", "--dockerfile"])
        .arg(dockerfile)
        .args(["--ref", "docker.io/library/module-manager:test"])
        .args(stages)
        .args(extra)
        .env("SOURCE_DATE_EPOCH", "0")
        .output()
        .expect("run hack/oci-image.py")
}

fn plan(dockerfile: &Path, stages: &[String]) -> Value {
    let out = oci_image(dockerfile, stages, &["--plan"]);
    assert!(
        out.status.success(),
        "hack/oci-image.py --plan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn file<'a>(plan: &'a Value, path: &str) -> &'a Value {
    plan["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("the image has no {path}: {:#}", plan["files"]))
}

#[test]
fn the_archive_is_what_the_dockerfile_says() {
    let dir = tempfile::tempdir().unwrap();
    let stages = stages(dir.path());
    let plan = plan(&repo().join("Dockerfile"), &stages);
    let config = &plan["config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/module-manager"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["--help"]));
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Labels"]["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    // The user is the one the StatefulSet runs as (runAsUser, fsGroup).
    let statefulset = std::fs::read_to_string(repo().join("deploy/base/statefulset.yaml")).unwrap();
    let user = config["User"].as_str().unwrap().split(':').next().unwrap();
    assert!(
        statefulset.contains(&format!("runAsUser: {user}")),
        "the image's user {user} is not the StatefulSet's runAsUser"
    );
    assert_eq!(
        file(&plan, "/usr/local/bin/module-manager")["mode"],
        "0o755"
    );
    assert_eq!(file(&plan, "/usr/local/bin/helm")["type"], "file");
    assert_eq!(
        file(&plan, "/usr/local/bin/module-manager-renderer")["type"],
        "file"
    );
    assert_eq!(
        file(&plan, "/usr/local/bin/kubectl-module_manager")["target"],
        "module-manager"
    );
    assert_eq!(file(&plan, "/charts")["uid"], 65532);
    assert_eq!(
        file(&plan, "/etc/ssl/certs/ca-certificates.crt")["type"],
        "file"
    );
    assert!(
        file(&plan, "/etc/passwd")["sha256"].is_string(),
        "the base's users (nonroot 65532)"
    );
}

#[test]
fn what_the_script_cannot_reproduce_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let stages = stages(dir.path());
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let cases = [
        (
            format!("{dockerfile}RUN touch /marker\n"),
            "RUN in the image's stage is not supported",
        ),
        (
            format!("{dockerfile}COPY --from=operator /extra /extra\n"),
            "COPY --from=operator /extra",
        ),
        (
            format!("{dockerfile}COPY --from=tools /x /x\n"),
            "no directory given for stage tools",
        ),
        (
            format!("{dockerfile}COPY README.md /README.md\n"),
            "COPY without --from",
        ),
        (
            dockerfile.replace(
                "ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot",
                "ARG RUNTIME_IMAGE=docker.io/library/alpine:3",
            ),
            "is not one this script reproduces",
        ),
        (
            dockerfile.replace(
                "ENTRYPOINT [\"/usr/local/bin/module-manager\"]",
                "ENTRYPOINT /usr/local/bin/module-manager",
            ),
            "ENTRYPOINT must be in the JSON (exec) form",
        ),
    ];
    for (i, (text, message)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("Dockerfile.{i}"));
        std::fs::write(&path, text).unwrap();
        let out = oci_image(&path, &stages, &["--plan"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "case {i}: expected an error containing {message:?}, got {}: {stderr}",
            out.status
        );
    }
}

#[test]
fn two_archives_of_the_same_input_are_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let stages = stages(dir.path());
    let mut archives = Vec::new();
    for name in ["a.tar", "b.tar"] {
        let out_path = dir.path().join(name);
        let out = oci_image(
            &repo().join("Dockerfile"),
            &stages,
            &["--out", out_path.to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        archives.push(std::fs::read(&out_path).unwrap());
    }
    assert!(
        archives[0] == archives[1],
        "two archives of the same input differ"
    );
    // ctr import names the image after this annotation.
    let listing = Command::new("tar")
        .args([
            "-xOf",
            dir.path().join("a.tar").to_str().unwrap(),
            "index.json",
        ])
        .output()
        .unwrap();
    let index: Value = serde_json::from_slice(&listing.stdout).unwrap();
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        "docker.io/library/module-manager:test"
    );
}

/// The builder stages' instructions (every stage but the image's, comments and blank lines
/// aside), whose sha256 is pinned below.
fn builder_stages(dockerfile: &str) -> String {
    let lines: Vec<&str> = dockerfile.lines().collect();
    let froms: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].starts_with("FROM "))
        .collect();
    let (first, last) = (froms[0], *froms.last().unwrap());
    lines[first..last]
        .iter()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sha256 of [`builder_stages`] of the Dockerfile that `hack/build-image.sh` reproduces.
const BUILDER_STAGES_SHA256: &str =
    "a69c48d5a3a9df9c3a56f141f45454fe3eb6ff5ee494350ba065719cebedd6f5";

/// `hack/build-image.sh` does the builder stages' work by hand (the static musl build with
/// `musl-gcc`, helm and the renderer from the tool cache), so it cannot follow a change to them
/// by itself: this pin fails on any change to the builder stages' instructions, to be reviewed
/// against the script.
#[test]
fn the_builder_stages_are_the_ones_build_image_sh_reproduces() {
    use sha2::{Digest, Sha256};
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let digest: String = Sha256::digest(builder_stages(&dockerfile).as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        digest, BUILDER_STAGES_SHA256,
        "the Dockerfile's builder stages changed: update hack/build-image.sh to do what they do \
         now, then BUILDER_STAGES_SHA256 in tests/image.rs"
    );
}
